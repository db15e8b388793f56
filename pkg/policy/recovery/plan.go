package recovery

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// plan decides one checklist step: its result (kept in the episode for the
// steps after it and in the step's record) and its commands, the record
// last. Nothing is sent here.
func (c *Core) plan(ctx context.Context, r *ProviderRecord, e *Episode, step string, now time.Time) (*Plan, error) {
	p := &Plan{Step: step, At: events.At(now)}
	rec := c.record(r, e, step, now)
	switch step {
	case events.StepSubagents, events.StepKill, events.StepCrons:
		ok, err := c.st.CaughtUp(ctx)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, ErrLagging
		}
	}
	switch step {
	case events.StepConfirm:
	case events.StepSubagents:
		hbs, err := c.st.LatestHeartbeats(ctx)
		if err != nil {
			return nil, err
		}
		e.Subagents = RunningSubagents(c.cfg, r.Provider, hbs, now)
		e.Counts.Subagents = len(e.Subagents)
		rec.Subagents = e.Subagents
	case events.StepKill:
		hbs, err := c.st.LatestHeartbeats(ctx)
		if err != nil {
			return nil, err
		}
		for _, k := range StaleSubagents(c.cfg, e.Subagents, hbs, now) {
			id := KillID(k.Agent, k.Subagent, k.LastHeartbeatAt.Time)
			sent, err := c.st.Sent(ctx, id)
			if err != nil {
				return nil, err
			}
			if sent {
				continue // killed already, by another provider's run (a subagent without a provider)
			}
			e.Killed = append(e.Killed, k)
			p.Commands = append(p.Commands, Command{
				ID:      id,
				Subject: events.ControlSubject(k.Agent),
				Control: &events.Control{
					At: events.At(now), Agent: k.Agent, Action: events.ControlKill, RecoveryID: e.RecoveryID,
					Subagent: k.Subagent, TaskID: k.TaskID,
					Reason: fmt.Sprintf("no heartbeat since %s: it stopped during the outage of %s but its status still says running", clock(k.LastHeartbeatAt.Time), r.Provider),
				},
			})
		}
		e.Counts.Killed = len(e.Killed)
		rec.Killed = e.Killed
	case events.StepCrons:
		crons, err := c.st.CronStates(ctx)
		if err != nil {
			return nil, err
		}
		runs, err := c.st.CronRuns(ctx, e.OutageStartedAt.Add(-c.opts.ReportWindow))
		if err != nil {
			return nil, err
		}
		var sentErr error
		rerun, missed, nMissed := MissedCrons(c.cfg, r.Provider, e.OutageStartedAt.Time, e.RecoveredAt.Time, crons, runs, func(id string) bool {
			sent, err := c.st.Sent(ctx, id)
			if err != nil && sentErr == nil {
				sentErr = err
			}
			return sent
		})
		if sentErr != nil {
			return nil, sentErr
		}
		e.Counts.CronsRerun, e.Counts.CronsMissed = len(rerun), nMissed
		rec.CronsRerun, rec.CronsMissed = rerun, missed
		for _, cr := range rerun {
			p.Commands = append(p.Commands, Command{
				ID:      CronRerunID(cr.Agent, cr.Cron, cr.ScheduledAt.Time),
				Subject: events.ControlSubject(cr.Agent),
				Control: &events.Control{
					At: events.At(now), Agent: cr.Agent, Action: events.ControlRunCron, RecoveryID: e.RecoveryID,
					Cron: cr.Cron, ScheduledAt: cr.ScheduledAt,
					Reason: fmt.Sprintf("its run scheduled at %s fell in the outage of %s and has no ok run: %s", clock(cr.ScheduledAt.Time), r.Provider, cr.Why),
				},
			})
		}
		for i := range rec.CronsRerun {
			rec.CronsRerun[i].Why = ""
		}
	case events.StepWrites:
		writes, err := c.st.WritesSince(ctx, e.OutageStartedAt.Add(-c.opts.ReportWindow))
		if err != nil {
			return nil, err
		}
		failed, why := FailedWrites(r.Provider, e.OutageStartedAt.Time, e.RecoveredAt.Time, writes)
		for i, w := range failed {
			id := WriteCheckID(w.Agent, w.Key, w.FailedAt.Time)
			sent, err := c.st.Sent(ctx, id)
			if err != nil {
				return nil, err
			}
			if sent {
				continue // checked already, by another provider's run (a write without a provider)
			}
			rec.Writes = append(rec.Writes, w)
			p.Commands = append(p.Commands, Command{
				ID:      id,
				Subject: events.ControlSubject(w.Agent),
				Control: &events.Control{
					At: events.At(now), Agent: w.Agent, Action: events.ControlCheckWrite, RecoveryID: e.RecoveryID, Key: w.Key,
					Reason: fmt.Sprintf("write failed at %s during the outage of %s%s and was not written again since: check it is there, redo it if not", clock(w.FailedAt.Time), r.Provider, why[i]),
				},
			})
		}
		e.Counts.Writes = len(rec.Writes)
	case events.StepRedispatch:
		seen := map[string]bool{}
		for _, k := range e.Killed {
			if k.TaskID == "" || seen[k.TaskID] {
				continue
			}
			seen[k.TaskID] = true
			d, err := c.redispatch(ctx, r.Provider, k, now)
			if err != nil {
				return nil, err
			}
			rec.Redispatched = append(rec.Redispatched, events.TaskRef{TaskID: d.TaskID, Attempt: d.Attempt})
			p.Commands = append(p.Commands, Command{ID: DispatchID(d.TaskID, d.Attempt), Subject: events.DispatchSubject(d.Agent), Dispatch: d})
		}
		e.Counts.Redispatched = len(rec.Redispatched)
	case events.StepRelease:
		// Commands are planned once the held tasks are released
		// (finishRelease).
		p.Draining = true
		return p, nil
	default:
		return nil, fmt.Errorf("unknown step %q", step)
	}
	p.Commands = append(p.Commands, c.recordCommand(rec))
	return p, nil
}

// redispatch plans the next attempt of a killed subagent's task: one more
// than the latest attempt dispatched (the index, then the ledger, which is
// the truth when an index update was lost), 2 for a task the bus never saw.
func (c *Core) redispatch(ctx context.Context, provider string, k events.SubagentRef, now time.Time) (*DispatchRef, error) {
	d := &DispatchRef{TaskID: k.TaskID, Agent: k.Agent, Provider: provider, At: events.At(now), Attempt: 2}
	idx, _, err := c.st.LoadTaskIndex(ctx, k.TaskID)
	if err != nil {
		return nil, err
	}
	if idx != nil {
		d.Seq, d.Agent, d.Provider = idx.Seq, idx.Agent, idx.Provider
		d.Attempt = idx.Attempt + 1
	}
	for {
		sent, err := c.st.Sent(ctx, DispatchID(d.TaskID, d.Attempt))
		if err != nil {
			return nil, err
		}
		if !sent {
			break
		}
		d.Attempt++
	}
	d.Reason = fmt.Sprintf("redispatched: subagent %s of agent %s was killed after the outage of %s (no heartbeat since %s)",
		k.Subagent, k.Agent, provider, clock(k.LastHeartbeatAt.Time))
	if d.Seq == 0 {
		d.Reason += "; the bus never saw this task, so no payload"
	}
	return d, nil
}

// record is the common part of a step's record.
func (c *Core) record(r *ProviderRecord, e *Episode, step string, now time.Time) *events.Recovery {
	return &events.Recovery{
		RecoveryID: e.RecoveryID, At: events.At(now), Provider: r.Provider,
		OutageStartedAt: e.OutageStartedAt, RecoveredAt: e.RecoveredAt, Step: step,
	}
}

func (c *Core) recordCommand(rec *events.Recovery) Command {
	return Command{ID: msgID("recovery", rec.RecoveryID, rec.Step), Subject: events.RecoverySubject(rec.Provider), Recovery: rec}
}

// KillID is the id of the one kill of a subagent that stopped beating at
// lastHeartbeat: whichever recovery finds it stale first sends it.
func KillID(agent, subagent string, lastHeartbeat time.Time) string {
	return msgID("recovery", "kill", agent, subagent, strconv.FormatInt(lastHeartbeat.UnixMilli(), 10))
}

// WriteCheckID is the id of the one check of a write that failed at
// failedAt.
func WriteCheckID(agent, key string, failedAt time.Time) string {
	return msgID("recovery", "write", agent, key, strconv.FormatInt(failedAt.UnixMilli(), 10))
}

// NotificationKey is the dedupe key of a run's notification.
func NotificationKey(provider string, outageStart time.Time) string {
	return "recovery:" + provider + ":" + strconv.FormatInt(outageStart.UnixMilli(), 10)
}

// notification is the one normal notification at the end of a run.
func (c *Core) notification(provider string, e *Episode, now time.Time) Command {
	n := e.Counts
	return Command{
		ID:      msgID("recovery", e.RecoveryID, "notify"),
		Subject: events.NotifySubject(events.SeverityNormal),
		Notification: &events.Notification{
			DedupeKey: NotificationKey(provider, e.OutageStartedAt.Time),
			Severity:  events.SeverityNormal,
			Title:     "recovery checklist done for " + provider,
			Text: fmt.Sprintf("After the outage of %s from %s to %s (%s): %d running subagents found, %d killed; %d missed cron runs re-run, %d listed as missed; %d failed writes to check; %d tasks re-dispatched; %d held tasks released. Each step is recorded on %s.",
				provider, clock(e.OutageStartedAt.Time), clock(e.RecoveredAt.Time), e.RecoveredAt.Sub(e.OutageStartedAt.Time).Round(time.Second),
				n.Subagents, n.Killed, n.CronsRerun, n.CronsMissed, n.Writes, n.Redispatched, n.Released, events.RecoverySubject(provider)),
			Labels: map[string]string{"provider": provider, "recovery_id": e.RecoveryID},
			At:     events.At(now),
		},
	}
}

// belongs reports whether a record of recordProvider belongs to provider:
// its own, or none (a record without a provider belongs to every one).
func belongs(recordProvider, provider string) bool {
	return recordProvider == "" || recordProvider == provider
}

// RunningSubagents is step 2: every subagent of the provider whose latest
// heartbeat says running, sorted by agent and subagent, each marked stale
// when that heartbeat is older than the stale limit at now.
func RunningSubagents(cfg Config, provider string, hbs []events.Heartbeat, now time.Time) []events.SubagentRef {
	var out []events.SubagentRef
	for _, h := range hbs {
		if h.State() != events.HeartbeatRunning || !belongs(h.Provider, provider) {
			continue
		}
		out = append(out, events.SubagentRef{
			Agent: h.Agent, Subagent: h.Subagent, TaskID: h.TaskID, LastHeartbeatAt: h.At,
			Stale: now.Sub(h.At.Time) > cfg.staleLimit(h.Interval()),
		})
	}
	slices.SortFunc(out, func(a, b events.SubagentRef) int {
		return cmp.Or(strings.Compare(a.Agent, b.Agent), strings.Compare(a.Subagent, b.Subagent))
	})
	return out
}

// StaleSubagents is step 3: of the running subagents found in step 2, the
// stale ones — checked again against the latest heartbeats, so one that
// beat (or ended) since is never killed.
func StaleSubagents(cfg Config, running []events.SubagentRef, hbs []events.Heartbeat, now time.Time) []events.SubagentRef {
	latest := make(map[[2]string]events.Heartbeat, len(hbs))
	for _, h := range hbs {
		latest[[2]string{h.Agent, h.Subagent}] = h
	}
	var out []events.SubagentRef
	for _, s := range running {
		if !s.Stale {
			continue
		}
		h, ok := latest[[2]string{s.Agent, s.Subagent}]
		if ok && (h.State() != events.HeartbeatRunning || now.Sub(h.At.Time) <= cfg.staleLimit(h.Interval())) {
			continue
		}
		k := s
		k.Stale = false
		if ok {
			k.LastHeartbeatAt, k.TaskID = h.At, h.TaskID
		}
		out = append(out, k)
	}
	return out
}

// Limits on enumerating and listing a cron's missed times, so a per-minute
// cron over a month-long outage neither stalls the checklist nor makes a
// record larger than a message may be.
const (
	maxCronTimes     = 100000
	maxListedPerCron = 50
)

// MissedCrons is step 4: each scheduled time of each cron of the provider
// inside the outage [start, recovered] without an ok run for it. Within
// the catch-up window before recovered, re-run by the cron's catch-up mode
// (latest: the newest; all: each, oldest first, at most max_catchup_runs;
// none: none); the rest listed as missed with why. A time re-run by an
// earlier recovery (sent reports its id) is not re-run again. It returns
// the re-runs (Why says which rule chose them), the listed missed times
// (at most maxListedPerCron per cron, then one entry summing up the rest)
// and how many were missed in all.
func MissedCrons(cfg Config, provider string, start, recovered time.Time, crons []CronState, runs []events.CronRun, sent func(id string) bool) (rerun, missed []events.CronRef, nMissed int) {
	ok := map[string]bool{}
	for _, r := range runs {
		if r.Status == events.CronOK {
			ok[cronKey(r.Agent, r.Cron, r.ScheduledAt.Time)] = true
		}
	}
	crons = slices.Clone(crons)
	slices.SortFunc(crons, func(a, b CronState) int {
		return cmp.Or(strings.Compare(a.Spec.Agent, b.Spec.Agent), strings.Compare(a.Spec.Cron, b.Spec.Cron))
	})
	for _, cs := range crons {
		s := cs.Spec
		if !belongs(s.Provider, provider) {
			continue
		}
		sched, err := events.ParseCronSchedule(s.Schedule)
		if err != nil {
			continue // validated on the way in; a spec stored before a parser change
		}
		loc, err := events.LoadLocation(s.Timezone)
		if err != nil {
			continue
		}
		anchor := cs.FirstRunAt.Time
		if anchor.IsZero() {
			anchor = s.At.Time
		}
		window := s.CatchupWindow.Std()
		if window <= 0 {
			window = cfg.CatchupWindow
		}
		from := recovered.Add(-window)
		var inWindow, outside []time.Time
		n := 0
		for t := sched.Next(start.Add(-time.Nanosecond), loc, anchor); !t.IsZero() && !t.After(recovered) && n < maxCronTimes; t = sched.Next(t, loc, anchor) {
			n++
			if ok[cronKey(s.Agent, s.Cron, t)] {
				continue
			}
			if t.Before(from) {
				outside = append(outside, t)
			} else {
				inWindow = append(inWindow, t)
			}
		}
		ref := func(t time.Time, why string) events.CronRef {
			return events.CronRef{Agent: s.Agent, Cron: s.Cron, ScheduledAt: events.At(t), Why: why}
		}
		var cronMissed []events.CronRef
		outsideWhy := fmt.Sprintf("outside the catch-up window (%s before recovery at %s)", window, clock(recovered))
		for _, t := range outside {
			cronMissed = append(cronMissed, ref(t, outsideWhy))
		}
		var chosen []time.Time
		switch s.CatchupMode() {
		case events.CatchupLatest:
			if k := len(inWindow); k > 0 {
				chosen = inWindow[k-1:]
				for _, t := range inWindow[:k-1] {
					cronMissed = append(cronMissed, ref(t, fmt.Sprintf("catchup latest: only the newest missed time (%s) is re-run", clock(inWindow[k-1]))))
				}
			}
		case events.CatchupAll:
			limit := min(len(inWindow), cfg.MaxCatchupRuns)
			chosen = inWindow[:limit]
			for _, t := range inWindow[limit:] {
				cronMissed = append(cronMissed, ref(t, fmt.Sprintf("catchup all: over recovery.max_catchup_runs (%d)", cfg.MaxCatchupRuns)))
			}
		case events.CatchupNone:
			for _, t := range inWindow {
				cronMissed = append(cronMissed, ref(t, "catchup none: never re-run"))
			}
		}
		for _, t := range chosen {
			if sent != nil && sent(CronRerunID(s.Agent, s.Cron, t)) {
				cronMissed = append(cronMissed, ref(t, "re-run once already, by an earlier recovery"))
				continue
			}
			rerun = append(rerun, ref(t, "catchup "+s.CatchupMode()))
		}
		slices.SortFunc(cronMissed, func(a, b events.CronRef) int { return a.ScheduledAt.Compare(b.ScheduledAt.Time) })
		nMissed += len(cronMissed)
		if len(cronMissed) > maxListedPerCron {
			rest := cronMissed[maxListedPerCron-1:]
			sum := rest[0]
			sum.Why = fmt.Sprintf("and %d more missed times up to %s, not listed one by one (first: %s)", len(rest), clock(rest[len(rest)-1].ScheduledAt.Time), rest[0].Why)
			cronMissed = append(cronMissed[:maxListedPerCron-1], sum)
		}
		missed = append(missed, cronMissed...)
	}
	return rerun, missed, nMissed
}

func cronKey(agent, cron string, t time.Time) string {
	return agent + "\x00" + cron + "\x00" + strconv.FormatInt(t.UnixMilli(), 10)
}

// FailedWrites is step 5: for each (agent, key) of the provider, the latest
// write that failed during the outage [start, recovered], unless a later
// write of the key succeeded. It returns them sorted by agent and key, and
// for each a few words on the error.
func FailedWrites(provider string, start, recovered time.Time, writes []events.Write) ([]events.WriteRef, []string) {
	type state struct {
		failed  events.Write
		hasFail bool
		lastOK  time.Time
	}
	by := map[[2]string]*state{}
	for _, w := range writes {
		k := [2]string{w.Agent, w.Key}
		s := by[k]
		if s == nil {
			s = &state{}
			by[k] = s
		}
		if w.OK {
			if w.At.After(s.lastOK) {
				s.lastOK = w.At.Time
			}
			continue
		}
		if !belongs(w.Provider, provider) || w.At.Before(start) || w.At.After(recovered) {
			continue
		}
		if !s.hasFail || w.At.After(s.failed.At.Time) {
			s.failed, s.hasFail = w, true
		}
	}
	keys := make([][2]string, 0, len(by))
	for k, s := range by {
		if s.hasFail && !s.lastOK.After(s.failed.At.Time) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1])) })
	out := make([]events.WriteRef, len(keys))
	why := make([]string, len(keys))
	for i, k := range keys {
		w := by[k].failed
		out[i] = events.WriteRef{Agent: w.Agent, Key: w.Key, FailedAt: w.At}
		if w.Error != "" {
			why[i] = " (" + truncate(w.Error, 200) + ")"
		}
	}
	return out, why
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
