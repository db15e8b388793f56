package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// recoveryScenario is the post-outage checklist in `failbus demo`: a
// provider outage with a running subagent that dies, one that is slow but
// alive, one that finishes, crons that miss their times, a memory write
// that fails and tasks submitted meanwhile; agents hold and only answer
// probes; after the recovery the checklist runs, printed line by line.
var recoveryScenario = demoScenario{
	title: "A provider outage, and the checklist after it",
	about: "During an outage crons silently fail, subagents die while their status still says running, memory writes\n" +
		"are lost and new work has nowhere to go. Tasks wait in the stream; holding agents are asked for probes, so\n" +
		"the outage can end; then the checklist runs, every step recorded before the next.",
	run: func(ctx context.Context, d *demo) error { return runRecoveryScenario(ctx, d.printf) },
}

// demoLLM is the provider that goes down in the recovery scenario.
const demoLLM = "moonshot"

// demoRecoveryPolicy shrinks the numbers so the scenario takes seconds: an
// outage after 3 network failures, recovered after 3 successes over 1s,
// probes every 400ms, held tasks released at 10 per second.
func demoRecoveryPolicy() *policy.Policy {
	p := policy.Default()
	p.Scope.OutageMinFailures = 3
	p.Scope.RecoveryMinSuccesses = 3
	p.Scope.RecoveryMinTime = time.Second
	p.Recovery.ProbeInterval = 400 * time.Millisecond
	p.Recovery.DrainRate = 10
	return p
}

type recoveryDemo struct {
	printf func(string, ...any)
	ag     *agent.Agent
	up     atomic.Bool
	// got carries what the agent's control handlers did, in order;
	// pending holds those taken from it early.
	got     chan string
	pending []string
}

// runRecoveryScenario runs the scenario on a bus of its own.
func runRecoveryScenario(ctx context.Context, printf func(string, ...any)) (err error) {
	pol := demoRecoveryPolicy()
	b, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-demo-recovery"}, Policy: pol, Log: zerolog.Nop()})
	if err != nil {
		return err
	}
	defer func() {
		if serr := b.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	nc, err := b.Srv.Connect(nats.Name("failbus demo coordinator"))
	if err != nil {
		return err
	}
	defer nc.Close()
	s := &recoveryDemo{printf: printf, got: make(chan string, 64)}
	s.up.Store(true)
	if s.ag, err = agent.New(nc, "coordinator"); err != nil {
		return err
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	health, err := startLog(sctx, b.JS, topology.StreamHealth, events.HealthSubject(demoLLM))
	if err != nil {
		return err
	}
	defer health.Stop()
	steps, err := startLog(sctx, b.JS, topology.StreamRecoveries, events.RecoverySubject(demoLLM))
	if err != nil {
		return err
	}
	defer steps.Stop()
	notes, err := startLog(sctx, b.JS, topology.StreamNotify, events.NotifyPrefix+".>")
	if err != nil {
		return err
	}
	defer notes.Stop()
	dispatches, err := s.ag.Dispatches(sctx)
	if err != nil {
		return err
	}
	go func() { _ = s.ag.HandleControls(sctx, s.handlers()) }()

	printf("on a bus of its own: an outage after %d network failures, recovered after %d successes over %s;",
		pol.Scope.OutageMinFailures, pol.Scope.RecoveryMinSuccesses, pol.Scope.RecoveryMinTime)
	printf("recovery probes every %s and releases held tasks at %g per second.", pol.Recovery.ProbeInterval, pol.Recovery.DrainRate)
	printf("")

	// Before: work under way.
	for _, c := range []events.CronSpec{
		{Cron: "digest", Schedule: "@every 1s", Provider: demoLLM, Catchup: events.CatchupLatest},
		{Cron: "inbox-sweep", Schedule: "@every 2s", Provider: demoLLM, Catchup: events.CatchupNone},
	} {
		if err := s.ag.DeclareCron(ctx, c); err != nil {
			return err
		}
		s.printf("agent  cron %s %s, catchup %s", c.Cron, c.Schedule, c.CatchupMode())
	}
	research := &events.Task{ID: "t-research", Provider: demoLLM, Kind: "research"}
	if err := s.ag.SubmitTask(ctx, research); err != nil {
		return err
	}
	d, err := nextDispatch(ctx, dispatches)
	if err != nil {
		return err
	}
	s.printf("bus    dispatch %s attempt %d at once: %s", d.TaskID, d.Attempt, d.Reason)
	subs := map[string]*agent.Subagent{}
	for _, c := range []agent.SubagentConfig{
		{Name: "researcher", TaskID: "t-research", Provider: demoLLM, Interval: 300 * time.Millisecond},
		{Name: "summarizer", Provider: demoLLM, Interval: 4 * time.Second},
		{Name: "formatter", Provider: demoLLM, Interval: 300 * time.Millisecond},
	} {
		sub, err := s.ag.StartSubagent(sctx, c)
		if err != nil {
			return err
		}
		defer sub.Stop()
		subs[c.Name] = sub
		s.printf("agent  subagent %s running, heartbeat every %s", c.Name, c.Interval)
	}

	// The outage.
	s.up.Store(false)
	s.printf("")
	s.printf("%s stops answering:", demoLLM)
	for range pol.Scope.OutageMinFailures {
		if err := s.call(ctx, "chat"); err != nil {
			return err
		}
	}
	h, err := awaitHealth(ctx, health, events.HealthOutage)
	if err != nil {
		return fmt.Errorf("no outage after %d network failures: %w", pol.Scope.OutageMinFailures, err)
	}
	s.printf("bus    health %s: %s", h.State, h.Reason)
	s.printf("agent  holds (wait_provider); meanwhile:")
	subs["researcher"].Stop()
	s.printf("agent  subagent researcher dies silently: its last status says running")
	if err := subs["formatter"].Done(ctx); err != nil {
		return err
	}
	s.printf("agent  subagent formatter finishes (done)")
	if err := s.ag.Write(ctx, events.Write{Key: "memory/today.md", Error: "fetch failed", Provider: demoLLM}); err != nil {
		return err
	}
	s.printf("agent  memory write memory/today.md failed")
	for i := 1; i <= 4; i++ {
		if err := s.ag.SubmitTask(ctx, &events.Task{ID: fmt.Sprintf("t-%d", i), Provider: demoLLM, Kind: "summarise"}); err != nil {
			return err
		}
	}
	s.printf("agent  submits t-1 … t-4: held in FAILBUS_TASKS, none dispatched")
	for range 3 {
		if err := s.expect(ctx, "probe"); err != nil {
			return err
		}
	}
	s.up.Store(true)
	s.printf("%s answers again; only the probes call it:", demoLLM)
	for !seenHealth(health, events.HealthRecovered) {
		select {
		case g := <-s.got:
			if strings.HasPrefix(g, "probe:") {
				s.printf("agent  %s", g)
			} else {
				s.pending = append(s.pending, g)
			}
		case <-time.After(50 * time.Millisecond): // look at the health again
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if h, err = awaitHealth(ctx, health, events.HealthRecovered); err != nil {
		return err
	}
	s.printf("bus    health %s: %s", h.State, h.Reason)

	// The checklist, line by line.
	s.printf("")
	s.printf("the checklist, each step recorded on %s before the next:", events.RecoverySubject(demoLLM))
	for i, step := range events.Steps {
		m, _, err := await(ctx, steps, i, func(m events.Message) bool { r, ok := m.(*events.Recovery); return ok && r.Step == step })
		if err != nil {
			return fmt.Errorf("no %s record: %w", step, err)
		}
		if err := s.printStep(ctx, m.(*events.Recovery), dispatches); err != nil {
			return err
		}
	}
	m, _, err := await(ctx, notes, 0, func(m events.Message) bool {
		n, ok := m.(*events.Notification)
		return ok && strings.HasPrefix(n.DedupeKey, "recovery:"+demoLLM+":")
	})
	if err != nil {
		return fmt.Errorf("no recovery notification: %w", err)
	}
	n := m.(*events.Notification)
	s.printf("bus    notification (%s) %q", n.Severity, n.Title)
	s.printf("       %s", n.Text)
	return nil
}

// handlers are the coordinator's answers to recovery's commands: each one
// acts as a real agent would and says what it did on s.got.
func (s *recoveryDemo) handlers() agent.ControlHandlers {
	return agent.ControlHandlers{
		Probe: func(ctx context.Context, c events.Control) error {
			ok := s.up.Load()
			err := s.call(ctx, "probe")
			if ok {
				s.got <- "probe: one real call to " + c.Provider + " → 200"
			} else {
				s.got <- "probe: one real call to " + c.Provider + " → connection refused"
			}
			return err
		},
		Kill: func(ctx context.Context, c events.Control) error {
			if sub := s.ag.Subagent(c.Subagent); sub != nil {
				sub.Stop()
			}
			s.got <- "kill: stops " + c.Subagent + " (" + c.Reason + ")"
			return nil
		},
		RunCron: func(ctx context.Context, c events.Control) error {
			s.got <- "run_cron: runs " + c.Cron + " for " + c.ScheduledAt.Format("15:04:05")
			return s.ag.CronRun(ctx, events.CronRun{Cron: c.Cron, ScheduledAt: c.ScheduledAt, Status: events.CronOK, Provider: demoLLM})
		},
		CheckWrite: func(ctx context.Context, c events.Control) error {
			s.got <- "check_write: " + c.Key + " is missing, writes it again"
			return s.ag.Write(ctx, events.Write{Key: c.Key, OK: true, Provider: demoLLM})
		},
	}
}

// call is one real call to the demo provider, reported.
func (s *recoveryDemo) call(ctx context.Context, kind string) error {
	o := &events.Outcome{Provider: demoLLM, Model: "kimi-k2", Profile: "key-1", Origin: &events.Origin{Kind: kind}}
	if s.up.Load() {
		o.OK, o.Status, o.Body = true, 200, `{"choices":[{"message":{"content":"pong"}}]}`
	} else {
		o.TransportError = "dial tcp 10.2.0.7:443: connect: connection refused (ECONNREFUSED)"
	}
	return s.ag.Report(ctx, o)
}

// expect waits for the agent to handle a command of the given kind and
// prints it; probes still under way when expecting another kind are
// printed and skipped.
func (s *recoveryDemo) expect(ctx context.Context, kind string) error {
	wctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	for {
		var g string
		if len(s.pending) > 0 {
			g, s.pending = s.pending[0], s.pending[1:]
		} else {
			select {
			case g = <-s.got:
			case <-wctx.Done():
				return fmt.Errorf("no %s command within %v", kind, demoWait)
			}
		}
		s.printf("agent  %s", g)
		if strings.HasPrefix(g, kind+":") {
			return nil
		}
		if !strings.HasPrefix(g, "probe:") {
			return fmt.Errorf("expected a %s command", kind)
		}
	}
}

// printStep prints one checklist record and what the agent got for it,
// and checks it against the story.
func (s *recoveryDemo) printStep(ctx context.Context, r *events.Recovery, dispatches <-chan events.Dispatch) error {
	ago := func(t events.Time) time.Duration { return roundMS(r.At.Sub(t.Time)) }
	switch r.Step {
	case events.StepConfirm:
		s.printf("1 confirm     %s down from %s to %s (%s)", r.Provider, r.OutageStartedAt.Format("15:04:05.000"),
			r.RecoveredAt.Format("15:04:05.000"), roundMS(r.RecoveredAt.Sub(r.OutageStartedAt.Time)))
	case events.StepSubagents:
		var parts []string
		for _, sa := range r.Subagents {
			state := "fresh"
			if sa.Stale {
				state = "stale"
			}
			parts = append(parts, fmt.Sprintf("%s (last heartbeat %s ago, %s)", sa.Subagent, ago(sa.LastHeartbeatAt), state))
		}
		s.printf("2 subagents   still saying running: %s", strings.Join(parts, ", "))
	case events.StepKill:
		var names []string
		for _, k := range r.Killed {
			names = append(names, k.Subagent)
		}
		s.printf("3 kill        %s", strings.Join(names, ", "))
		if len(r.Killed) != 1 || r.Killed[0].Subagent != "researcher" {
			return fmt.Errorf("expected only researcher killed, got %v", names)
		}
		if err := s.expect(ctx, "kill"); err != nil {
			return err
		}
	case events.StepCrons:
		var rerun, missed []string
		for _, c := range r.CronsRerun {
			rerun = append(rerun, c.Cron+" @"+c.ScheduledAt.Format("15:04:05"))
		}
		for _, c := range r.CronsMissed {
			missed = append(missed, c.Cron+" @"+c.ScheduledAt.Format("15:04:05")+" ("+c.Why+")")
		}
		s.printf("4 crons       re-run: %s", strings.Join(rerun, ", "))
		for _, m := range missed {
			s.printf("              missed: %s", m)
		}
		if len(r.CronsRerun) != 1 || r.CronsRerun[0].Cron != "digest" {
			return fmt.Errorf("expected the latest digest re-run, got %v", rerun)
		}
		if err := s.expect(ctx, "run_cron"); err != nil {
			return err
		}
	case events.StepWrites:
		var keys []string
		for _, w := range r.Writes {
			keys = append(keys, w.Key+" (failed "+w.FailedAt.Format("15:04:05.000")+")")
		}
		s.printf("5 writes      check: %s", strings.Join(keys, ", "))
		if len(r.Writes) != 1 {
			return fmt.Errorf("expected one write to check, got %v", keys)
		}
		if err := s.expect(ctx, "check_write"); err != nil {
			return err
		}
	case events.StepRedispatch:
		var ts []string
		for _, t := range r.Redispatched {
			ts = append(ts, fmt.Sprintf("%s as attempt %d", t.TaskID, t.Attempt))
		}
		s.printf("6 redispatch  %s", strings.Join(ts, ", "))
		d, err := nextDispatch(ctx, dispatches)
		if err != nil {
			return err
		}
		s.printf("agent  dispatch %s attempt %d", d.TaskID, d.Attempt)
		if d.TaskID != "t-research" || d.Attempt != 2 {
			return fmt.Errorf("expected t-research attempt 2, got %s attempt %d", d.TaskID, d.Attempt)
		}
	case events.StepRelease:
		var got []string
		var first, last time.Time
		for range r.Released {
			d, err := nextDispatch(ctx, dispatches)
			if err != nil {
				return err
			}
			got = append(got, d.TaskID)
			if first.IsZero() {
				first = d.At.Time
			}
			last = d.At.Time
		}
		s.printf("7 release     %d held tasks released in submission order over %s: %s; done %v",
			r.Released, roundMS(last.Sub(first)), strings.Join(got, ", "), r.Done)
		if strings.Join(got, ",") != "t-1,t-2,t-3,t-4" || !r.Done {
			return fmt.Errorf("expected t-1 … t-4 released in order and the run done, got %v", got)
		}
	}
	return nil
}

func nextDispatch(ctx context.Context, ch <-chan events.Dispatch) (events.Dispatch, error) {
	wctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	select {
	case d, ok := <-ch:
		if !ok {
			return d, errors.New("the dispatch channel closed")
		}
		return d, nil
	case <-wctx.Done():
		return events.Dispatch{}, fmt.Errorf("no dispatch within %v", demoWait)
	}
}

// seenHealth reports whether a health record in state has arrived, without
// waiting.
func seenHealth(l *watch.Log[events.Message], state string) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := l.Wait(ctx, 0, func(m events.Message) bool { h, ok := m.(*events.Health); return ok && h.State == state })
	return err == nil
}

// awaitHealth waits for the first health record in state.
func awaitHealth(ctx context.Context, l *watch.Log[events.Message], state string) (*events.Health, error) {
	m, _, err := await(ctx, l, 0, func(m events.Message) bool { h, ok := m.(*events.Health); return ok && h.State == state })
	if err != nil {
		return nil, err
	}
	return m.(*events.Health), nil
}
