package recovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Advance does what is due for provider at now: while it is down, the next
// probe; once it recovered, the checklist of each finished outage, step by
// step, and the release of held tasks at the drain rate; for provider "",
// the release of tasks without a provider once no provider holds any. It
// returns when everything due is done or waits for a later time (NextDue).
func (c *Core) Advance(ctx context.Context, provider string, now time.Time) error {
	for range maxCAS {
		r, rev, err := c.st.LoadProvider(ctx, provider)
		if err != nil || r == nil {
			return err
		}
		if c.opts.Owner != "" {
			if r.Lease.Owner != c.opts.Owner && now.Before(r.Lease.Until.Time) {
				return nil // another replica drives it
			}
			if r.Lease.Owner != c.opts.Owner || r.Lease.Until.Sub(now) < c.opts.LeaseTTL/2 {
				r.Lease = Lease{Owner: c.opts.Owner, Until: events.At(now.Add(c.opts.LeaseTTL))}
				if _, err := c.st.SaveProvider(ctx, r, rev); errors.Is(err, ErrConflict) {
					continue
				} else if err != nil {
					return err
				}
				continue
			}
		}
		switch {
		case r.Down:
			return c.probe(ctx, r, rev, now)
		case r.ready() != nil:
			again, err := c.checklist(ctx, r, rev, now)
			if err != nil || !again {
				return err
			}
		case r.Queue.Holding:
			if provider == "" {
				busy, err := c.anyProviderHolding(ctx)
				if err != nil || busy {
					return err
				}
			}
			// Held tasks and no checklist: tasks without a provider once
			// every provider is back, or a queue left holding without an
			// outage.
			_, err := c.drain(ctx, provider, "released: "+providerWords(provider)+" is up again", now)
			return err
		default:
			return nil
		}
	}
	return fmt.Errorf("recovery: advance %q: %w", provider, ErrConflict)
}

// NextDue is when Advance next has something to do for the record: a
// probe, a checklist step (now) or a release; zero when nothing. A driver
// sleeps until then (or until an input changes the record).
func (r *ProviderRecord) NextDue(now time.Time) time.Time {
	switch {
	case r.Down:
		if r.Probe.NextAt.IsZero() || r.Probe.Pending != nil {
			return now
		}
		return r.Probe.NextAt.Time
	case r.ready() != nil:
		e := r.ready()
		if e.Plan != nil && e.Plan.Draining && r.Queue.Holding {
			return r.Queue.nextRelease(now)
		}
		return now
	case r.Queue.Holding:
		return r.Queue.nextRelease(now)
	}
	return time.Time{}
}

// probe sends the outage's next probe when it is due: the record's
// compare-and-set is the claim (one probe per sequence number across
// replicas), the probe is planned into the record before it is sent, so a
// crash resends rather than skips it.
func (c *Core) probe(ctx context.Context, r *ProviderRecord, rev uint64, now time.Time) error {
	e := r.open()
	if e == nil {
		return nil
	}
	p := &r.Probe
	if p.Pending != nil {
		if err := c.sendCommand(ctx, *p.Pending, p.Pending.Control.At.Time, now); err != nil {
			return err
		}
		p.Pending = nil
		_, err := c.st.SaveProvider(ctx, r, rev)
		return ignoreConflict(err)
	}
	if p.NextAt.IsZero() {
		p.NextAt = events.At(now.Add(c.cfg.ProbeInterval))
		_, err := c.st.SaveProvider(ctx, r, rev)
		return ignoreConflict(err)
	}
	if now.Before(p.NextAt.Time) {
		return nil
	}
	target := c.probeTarget(ctx, r, p.Seq+1)
	p.Seq++
	p.NextAt = events.At(now.Add(c.cfg.ProbeInterval))
	p.LastAgent = target
	if target != "" {
		p.Pending = &Command{
			ID:      msgID("recovery", e.RecoveryID, "probe", fmt.Sprint(p.Seq)),
			Subject: events.ControlSubject(target),
			Control: &events.Control{
				At: events.At(now), Agent: target, Action: events.ControlProbe, Provider: r.Provider, RecoveryID: e.RecoveryID,
				Reason: fmt.Sprintf("%s is down since %s and agents hold: make one real call to it and report the outcome (probe %d)",
					r.Provider, clock(e.OutageStartedAt.Time), p.Seq),
			},
		}
	}
	rev, err := c.st.SaveProvider(ctx, r, rev)
	if err != nil {
		return ignoreConflict(err) // another replica claimed this probe
	}
	if pr, ok := c.pub.(Prober); ok {
		if _, configured := c.cfg.Probes[r.Provider]; configured {
			pr.HTTPProbe(ctx, r.Provider, e.RecoveryID, p.Seq, now)
		}
	}
	if p.Pending == nil {
		return nil
	}
	if err := c.sendCommand(ctx, *p.Pending, now, now); err != nil {
		return err
	}
	p.Pending = nil
	_, err = c.st.SaveProvider(ctx, r, rev)
	return ignoreConflict(err)
}

func ignoreConflict(err error) error {
	if errors.Is(err, ErrConflict) {
		return nil
	}
	return err
}

// probeTarget chooses the agent for probe seq among the provider's users:
// those of its latest outcomes (Usage.RecentUsers) and those that reported
// themselves (r.Users), at most MaxUsers, most recent first. When the
// store cannot say (Options.UsageError is told), it chooses among what it
// has: the agents that reported themselves, holding unknown. Both reads
// share a quarter of the lease (at least probeTargetBudget), so the probe
// is claimed while this replica still drives the provider.
func (c *Core) probeTarget(ctx context.Context, r *ProviderRecord, seq int) string {
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, max(c.opts.LeaseTTL/4, probeTargetBudget))
	defer cancel()
	skip := func(agent string) bool { return c.isProbeAgent(r.Provider, agent) }
	recent, err := c.st.RecentUsers(ctx, r.Provider, MaxUsers+1) // +1: the probe agent's own
	if err != nil {
		c.usageError(parent, r.Provider, fmt.Errorf("recent users: %w", err))
		return pickProbeTarget(mergeUsers(r.Users, skip), nil, seq)
	}
	users := mergeUsers(slices.Concat(recent, r.Users), skip)
	if len(users) == 0 {
		return ""
	}
	agents := make([]string, len(users))
	for i, u := range users {
		agents[i] = u.Agent
	}
	latest, err := c.st.LatestDecisions(ctx, agents)
	if err != nil {
		c.usageError(parent, r.Provider, fmt.Errorf("latest decisions: %w", err))
	}
	return pickProbeTarget(users, Holding(latest, r.Provider), seq)
}

// Holding is which agents hold on provider, by each agent's latest
// decision (Usage.LatestDecisions): idle and waiting for it, the best
// agents to ask for a probe. An agent holds when its latest decision is
// wait_provider on that provider; one that moved on to another provider,
// or from waiting to anything else, does not.
func Holding(latest map[string]events.Decision, provider string) map[string]bool {
	out := map[string]bool{}
	for a, d := range latest {
		if d.Action == events.ActionWaitProvider && d.Provider == provider {
			out[a] = true
		}
	}
	return out
}

// probeTargetBudget is the least time the probe-target reads get, however
// short the lease (tests run leases of a few hundred milliseconds).
const probeTargetBudget = 500 * time.Millisecond

// usageError tells Options.UsageError, unless the caller is stopping.
func (c *Core) usageError(parent context.Context, provider string, err error) {
	if c.opts.UsageError != nil && parent.Err() == nil {
		c.opts.UsageError(provider, err)
	}
}

// mergeUsers keeps each agent once at its latest time, leaves out those
// skip names, and returns at most MaxUsers, most recent first.
func mergeUsers(all []User, skip func(string) bool) []User {
	latest := make(map[string]time.Time, len(all))
	for _, u := range all {
		if skip(u.Agent) {
			continue
		}
		if t, ok := latest[u.Agent]; !ok || u.At.After(t) {
			latest[u.Agent] = u.At.Time
		}
	}
	return LatestUsers(latest, MaxUsers)
}

// LatestUsers turns each agent's latest time into at most max Users, most
// recent first, ties by name: the order every Usage store gives.
func LatestUsers(latest map[string]time.Time, max int) []User {
	out := make([]User, 0, len(latest))
	for a, t := range latest {
		out = append(out, User{Agent: a, At: events.At(t)})
	}
	slices.SortFunc(out, func(a, b User) int {
		if c := b.At.Compare(a.At.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Agent, b.Agent)
	})
	if len(out) > max {
		out = out[:max]
	}
	return out
}

// pickProbeTarget chooses the agent for probe seq: agents holding on the
// provider first (they are idle and waiting), then the others, most recent
// first within each, in turn.
func pickProbeTarget(users []User, holding map[string]bool, seq int) string {
	var order []string
	for _, u := range users {
		if holding[u.Agent] {
			order = append(order, u.Agent)
		}
	}
	for _, u := range users {
		if !holding[u.Agent] {
			order = append(order, u.Agent)
		}
	}
	if len(order) == 0 {
		return ""
	}
	return order[(seq-1)%len(order)]
}

func clock(t time.Time) string { return t.UTC().Format(events.JSONTimeLayout) }

// checklist runs the first finished outage's checklist from its current
// step (CONTRACT.md § "Recovery", rules 1–7): plan the step (saved before
// anything is sent), send its commands and its record, move on. It returns
// again=true when the record changed underneath and Advance should reload.
func (c *Core) checklist(ctx context.Context, r *ProviderRecord, rev uint64, now time.Time) (again bool, err error) {
	e := r.ready()
	for e.Step < len(events.Steps) {
		step := events.Steps[e.Step]
		if e.Plan == nil || e.Plan.Step != step {
			p, err := c.plan(ctx, r, e, step, now)
			if errors.Is(err, ErrLagging) {
				return false, err
			}
			if err != nil {
				return false, fmt.Errorf("plan %s of %s: %w", step, e.RecoveryID, err)
			}
			e.Plan = p
			if rev, err = c.st.SaveProvider(ctx, r, rev); err != nil {
				return errors.Is(err, ErrConflict), ignoreConflict(err)
			}
			c.hook(HookPlanned, step)
		}
		if e.Plan.Draining {
			done, err := c.drain(ctx, r.Provider, fmt.Sprintf("released after the outage of %s (%s)", r.Provider, e.RecoveryID), now)
			if err != nil || !done {
				return false, err
			}
			// The queue is empty: plan the step's record and the
			// notification, on the record as it is now.
			return true, c.finishRelease(ctx, r.Provider, e.RecoveryID, now)
		}
		for _, cmd := range e.Plan.Commands {
			if err := c.sendCommand(ctx, cmd, e.Plan.At.Time, now); err != nil {
				return false, err
			}
		}
		e.Step++
		e.Plan = nil
		switch step { // what no later step reads
		case events.StepKill:
			e.Subagents = nil
		case events.StepRedispatch:
			e.Killed = nil
		}
		if e.Step == len(events.Steps) {
			r.Episodes = r.Episodes[1:]
		}
		if rev, err = c.st.SaveProvider(ctx, r, rev); err != nil {
			return errors.Is(err, ErrConflict), ignoreConflict(err)
		}
		c.hook(HookStepped, step)
		if e.Step == len(events.Steps) {
			return r.ready() != nil || r.Queue.Holding, nil
		}
	}
	return false, nil
}

// finishRelease plans the release step's record (done: true) and the
// recovery notification once the queue is drained.
func (c *Core) finishRelease(ctx context.Context, provider, recoveryID string, now time.Time) error {
	_, err := c.update(ctx, provider, func(r *ProviderRecord) (bool, error) {
		e := r.ready()
		if e == nil || e.RecoveryID != recoveryID || e.Plan == nil || !e.Plan.Draining {
			return false, nil
		}
		e.Counts.Released = r.Queue.Released
		r.Queue.Released = 0 // counted for this run
		rec := c.record(r, e, events.StepRelease, now)
		rec.Released, rec.Done = e.Counts.Released, true
		e.Plan.Draining = false
		e.Plan.At = events.At(now)
		e.Plan.Commands = []Command{c.recordCommand(rec), c.notification(r.Provider, e, now)}
		return true, nil
	})
	return err
}

// sendCommand sends one planned command (once: the ledger).
func (c *Core) sendCommand(ctx context.Context, cmd Command, plannedAt, now time.Time) error {
	var err error
	switch {
	case cmd.Control != nil:
		_, err = c.send(ctx, cmd.ID, cmd.Subject, cmd.Control, plannedAt, now)
	case cmd.Recovery != nil:
		_, err = c.send(ctx, cmd.ID, cmd.Subject, cmd.Recovery, plannedAt, now)
	case cmd.Notification != nil:
		_, err = c.send(ctx, cmd.ID, cmd.Subject, cmd.Notification, plannedAt, now)
	case cmd.Dispatch != nil:
		err = c.sendRedispatch(ctx, *cmd.Dispatch, now)
	default:
		err = fmt.Errorf("command %s has no message", cmd.ID)
	}
	return err
}

// sendRedispatch sends a planned dispatch, building it from the stored task
// (so its payload is the one submitted).
func (c *Core) sendRedispatch(ctx context.Context, d DispatchRef, now time.Time) error {
	t := &StoredTask{Task: events.Task{ID: d.TaskID, Agent: d.Agent, Provider: d.Provider}}
	if d.Seq != 0 {
		st, err := c.st.TaskAt(ctx, d.Seq)
		if err != nil {
			return fmt.Errorf("task %s at %d: %w", d.TaskID, d.Seq, err)
		}
		if st != nil && st.Task.ID == d.TaskID {
			t = st
		}
	}
	t.Seq = d.Seq
	checkpoint := ""
	if d.Subagent != "" {
		h, err := c.st.Heartbeat(ctx, d.Agent, d.Subagent)
		if err != nil {
			return fmt.Errorf("task %s: the checkpoint of %s: %w", d.TaskID, d.Subagent, err)
		}
		if h != nil && h.TaskID == d.TaskID {
			checkpoint = h.Checkpoint
		}
	}
	_, err := c.dispatch(ctx, t, d.Attempt, d.Reason, checkpoint, d.At.Time, d.At.Time, now)
	return err
}
