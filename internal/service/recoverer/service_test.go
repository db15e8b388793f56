package recoverer_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/policy/recovery"
	svc "github.com/failbus/failbus/internal/service/recoverer"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

type bundle struct {
	t   *testing.T
	bus *bustest.Bus
	ctx context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	return &bundle{t: t, bus: bustest.Start(t, 2*time.Minute), ctx: context.Background()}
}

// start runs a recovery service until the test ends.
func (b *bundle) start(opts svc.Options) *svc.Service {
	b.t.Helper()
	if opts.Runner.FetchWait == 0 {
		opts.Runner.FetchWait = 100 * time.Millisecond
	}
	if testing.Verbose() {
		opts.Runner.Logger = zerolog.New(zerolog.NewTestWriter(b.t)).Level(zerolog.InfoLevel)
	}
	s, err := svc.New(b.bus.Ctx, b.bus.JS, opts)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("service: %v", err)
		}
	})
	return s
}

// publish stores m on subject with Nats-Msg-Id id ("" = none).
func (b *bundle) publish(subject string, m events.Message, id string) {
	b.t.Helper()
	data, h, err := events.Encode(m)
	if err != nil {
		b.t.Fatal(err)
	}
	if id != "" {
		h.Set(events.HeaderMsgID, id)
	}
	if _, err := b.bus.JS.PublishMsg(b.ctx, &nats.Msg{Subject: subject, Header: h, Data: data}); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bundle) raw(subject string, h nats.Header, data []byte) {
	b.t.Helper()
	if _, err := b.bus.JS.PublishMsg(b.ctx, &nats.Msg{Subject: subject, Header: h, Data: data}); err != nil {
		b.t.Fatal(err)
	}
}

// read returns every message stored on filter in stream, decoded.
func (b *bundle) read(stream, filter string) []events.Message {
	b.t.Helper()
	c, err := b.bus.JS.OrderedConsumer(b.ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		b.t.Fatal(err)
	}
	defer b.bus.JS.DeleteConsumer(b.ctx, stream, c.CachedInfo().Name)
	n := c.CachedInfo().NumPending
	var out []events.Message
	for uint64(len(out)) < n {
		batch, err := c.Fetch(int(n)-len(out), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			b.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if strings.HasPrefix(m.Subject(), events.DLQPrefix) {
				d, err := events.DecodeAs[*events.DeadLetter](m.Subject(), m.Headers(), m.Data())
				if err != nil {
					b.t.Fatal(err)
				}
				out = append(out, d)
				continue
			}
			v, err := events.Decode(m.Subject(), m.Headers(), m.Data())
			if err != nil {
				b.t.Fatalf("%s: %v", m.Subject(), err)
			}
			out = append(out, v)
		}
		if got == 0 {
			b.t.Fatalf("read %s: %d of %d", filter, len(out), n)
		}
	}
	return out
}

func (b *bundle) poll(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func typed[T events.Message](ms []events.Message) []T {
	var out []T
	for _, m := range ms {
		if v, ok := m.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func (b *bundle) dispatches() []*events.Dispatch {
	return typed[*events.Dispatch](b.read(topology.StreamDispatch, "failbus.dispatch.>"))
}

func (b *bundle) controls() []*events.Control {
	return typed[*events.Control](b.read(topology.StreamControl, "failbus.control.>"))
}

func (b *bundle) records() []*events.Recovery {
	return typed[*events.Recovery](b.read(topology.StreamRecoveries, "failbus.recovery.>"))
}

func (b *bundle) deadLetters(service string) []*events.DeadLetter {
	return typed[*events.DeadLetter](b.read(topology.StreamDLQ, events.DLQSubject(service)))
}

func (b *bundle) health(provider, state string, at time.Time) {
	b.publish(events.HealthSubject(provider), &events.Health{At: events.At(at), Provider: provider, State: state}, "")
}

// Held tasks wait in FAILBUS_TASKS while the provider is down and leave in
// submission order at the drain rate after recovery; stale subagents are
// killed and their tasks redispatched; every step recorded; healthy
// providers' tasks go out at once.
func TestServiceHoldsReleasesAndRunsTheChecklist(t *testing.T) {
	b := setup(t)
	reg := prometheus.NewRegistry()
	s := b.start(svc.Options{Policy: recovery.Config{DrainRate: 50}, Runner: consumer.Config{Registerer: reg}})
	now := time.Now().UTC()

	// Before: a task dispatched at once, run by a subagent.
	b.publish(events.TaskSubject("openai", "coord"), &events.Task{ID: "job-1", Agent: "coord", Provider: "openai", Kind: "k"}, "job-1")
	b.poll("job-1 dispatched", func() bool { return len(b.dispatches()) == 1 })
	b.publish(events.HeartbeatSubject("coord"), &events.Heartbeat{At: events.At(now.Add(-time.Minute)), Agent: "coord", Subagent: "sub-1", Provider: "openai", TaskID: "job-1", IntervalMS: 200}, "")
	b.publish(events.HeartbeatSubject("coord"), &events.Heartbeat{At: events.At(now), Agent: "coord", Subagent: "sub-2", Provider: "openai", IntervalMS: 60000}, "")

	b.health("openai", events.HealthOutage, now.Add(-30*time.Second))
	for i := range 30 {
		id := fmt.Sprintf("held-%02d", i)
		b.publish(events.TaskSubject("openai", fmt.Sprintf("w%d", i%3)), &events.Task{ID: id, Agent: fmt.Sprintf("w%d", i%3), Provider: "openai"}, id)
	}
	// A task of a healthy provider goes out at once.
	b.publish(events.TaskSubject("anthropic", "w0"), &events.Task{ID: "other", Agent: "w0", Provider: "anthropic"}, "other")
	b.poll("the other provider's task", func() bool { return len(b.dispatches()) == 2 })
	b.publish(events.WritePrefix+".coord", &events.Write{At: events.At(now.Add(-10 * time.Second)), Agent: "coord", Key: "memory/a.md", Provider: "openai", Error: "fetch failed"}, "")
	b.poll("30 tasks held", func() bool {
		r, _, err := s.Store().LoadProvider(b.ctx, "openai")
		return err == nil && r != nil && r.Queue.Held == 30
	})
	if n := len(b.dispatches()); n != 2 {
		t.Fatalf("%d dispatches during the outage, want 2 (before it, and the other provider)", n)
	}

	rec := time.Now().UTC()
	b.health("openai", events.HealthRecovered, rec)
	b.poll("the checklist done", func() bool {
		rs := b.records()
		return len(rs) == len(events.Steps) && rs[len(rs)-1].Done
	})
	ds := b.dispatches()
	var held []*events.Dispatch
	var redis []*events.Dispatch
	for _, d := range ds {
		switch {
		case strings.HasPrefix(d.TaskID, "held-"):
			held = append(held, d)
		case d.Attempt == 2:
			redis = append(redis, d)
		}
	}
	if len(held) != 30 {
		t.Fatalf("%d held tasks released, want 30", len(held))
	}
	last := map[string]string{}
	for i, d := range held {
		if prev := last[d.Agent]; prev > d.TaskID {
			t.Errorf("%s released after %s", d.TaskID, prev)
		}
		last[d.Agent] = d.TaskID
		if i > 0 && d.At.Sub(held[i-1].At.Time) < 20*time.Millisecond-time.Millisecond {
			t.Errorf("%s %s after the previous, faster than 50/s", d.TaskID, d.At.Sub(held[i-1].At.Time))
		}
	}
	if len(redis) != 1 || redis[0].TaskID != "job-1" || redis[0].Kind != "k" {
		t.Fatalf("redispatched %+v, want job-1 attempt 2 with its kind", redis)
	}
	var kills, checks []string
	for _, c := range b.controls() {
		switch c.Action {
		case events.ControlKill:
			kills = append(kills, c.Subagent)
		case events.ControlCheckWrite:
			checks = append(checks, c.Key)
		}
	}
	if !slices.Equal(kills, []string{"sub-1"}) || !slices.Equal(checks, []string{"memory/a.md"}) {
		t.Fatalf("kills %v, checks %v", kills, checks)
	}
	notes := typed[*events.Notification](b.read(topology.StreamNotify, "failbus.notify.>"))
	if len(notes) != 1 || !strings.HasPrefix(notes[0].DedupeKey, "recovery:openai:") {
		t.Fatalf("notifications %+v", notes)
	}
	// What an operator sees on /metrics.
	for metric, want := range map[string]float64{
		`failbus_recovery_runs_total{provider="openai"}`:                 1,
		`failbus_recovery_held_tasks{provider="openai"}`:                 0,
		`failbus_recovery_provider_down{provider="openai"}`:              0,
		`failbus_recovery_checklist_step{provider="openai"}`:             0,
		`failbus_recovery_sent_total{duplicate="false",kind="dispatch"}`: 33,
		`failbus_recovery_sent_total{duplicate="false",kind="kill"}`:     1,
		`failbus_recovery_sent_total{duplicate="false",kind="record"}`:   7,
	} {
		b.poll(metric, func() bool { return gauge(t, reg, metric) == want })
	}
}

// gauge reads one series from reg, -1 when absent.
func gauge(t *testing.T, reg *prometheus.Registry, series string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"=\""+l.GetValue()+"\"")
			}
			if mf.GetName()+"{"+strings.Join(labels, ",")+"}" != series {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// Bad input goes to the dead-letter subject with the reason naming the
// problem; the service keeps going.
func TestServiceDeadLettersBadInputAndKeepsGoing(t *testing.T) {
	b := setup(t)
	b.start(svc.Options{})
	b.publish(events.HeartbeatSubject("a"), &events.Heartbeat{Agent: "a", Subagent: "s"}, "")
	// Built by hand: Encode refuses invalid messages.
	bad := func(subject, schema string, m map[string]any) {
		h := nats.Header{}
		if schema != "" {
			h.Set(events.HeaderSchema, schema)
		}
		data, err := msgpackMarshal(m)
		if err != nil {
			t.Fatal(err)
		}
		b.raw(subject, h, data)
	}
	bad(events.HeartbeatSubject("a"), "heartbeat/1", map[string]any{"agent": "a"})
	bad(events.CronSpecSubject("a"), "", map[string]any{"agent": "a", "cron": "c", "schedule": "every morning"})
	bad(events.CronSpecSubject("a"), "cron_spec/1", map[string]any{"agent": "a", "cron": "c", "schedule": "@daily", "catchup": "most"})
	bad(events.TaskSubject("openai", "a"), "", map[string]any{"agent": "a", "provider": "openai"})
	bad(events.HeartbeatSubject("a"), "outcome/1", map[string]any{"id": "o", "agent": "a", "provider": "p"})
	b.raw(events.WriteSubject("a"), nil, []byte("not msgpack"))
	// Names of kilobytes: kept under KV keys, they would push the key's
	// subject past the server's control line and close the connection.
	long := strings.Repeat("x", 5000)
	bad(events.HeartbeatSubject("a"), "", map[string]any{"agent": "a", "subagent": long, "provider": "openai"})
	bad(events.CronSpecSubject("a"), "", map[string]any{"agent": "a", "cron": long, "schedule": "@daily"})
	bad(events.TaskSubject("openai", "a"), "", map[string]any{"id": "t-long", "agent": "a", "provider": "openai", "kind": long})
	want := map[string][]string{
		svc.HeartbeatName: {`"subagent"`, "does not belong on its subject", `"subagent": 5000 bytes exceed`},
		svc.ReportName:    {`"schedule"`, `"catchup"`, "not a msgpack map", `"cron": 5000 bytes exceed`},
		svc.TaskName:      {`"id"`, `"kind": 5000 bytes exceed`},
	}
	for name, reasons := range want {
		b.poll("dead letters of "+name, func() bool { return len(b.deadLetters(name)) == len(reasons) })
		got := b.deadLetters(name) // in any order: some consumers handle several at once
		for _, r := range reasons {
			if !slices.ContainsFunc(got, func(d *events.DeadLetter) bool { return strings.Contains(d.Reason, r) }) {
				t.Errorf("%s: no dead letter names %s", name, r)
			}
		}
		for _, d := range got {
			if len(d.Data) == 0 || d.Subject == "" {
				t.Errorf("%s dead letter %q lacks the original subject or bytes", name, d.Reason)
			}
		}
	}
	// And it goes on: a good task is dispatched.
	b.publish(events.TaskSubject("openai", "a"), &events.Task{ID: "good", Agent: "a", Provider: "openai"}, "good")
	b.poll("the good task", func() bool { return len(b.dispatches()) == 1 })
}

func msgpackMarshal(m map[string]any) ([]byte, error) { return msgpack.Marshal(m) }

// A task stored twice — the same id submitted again after the stream's
// duplicate window forgot it (here: under another Nats-Msg-Id, which the
// window cannot catch) — is dispatched once, whether its provider is up or
// the copies wait through an outage: the ledger, not the window, decides.
func TestServiceDispatchesATaskIDOnceBeyondTheDedupeWindow(t *testing.T) {
	b := setup(t)
	s := b.start(svc.Options{})
	task := func(id, msgID string) {
		b.publish(events.TaskSubject("openai", "a"), &events.Task{ID: id, Agent: "a", Provider: "openai"}, msgID)
	}
	task("up", "up")
	task("up", "up-again")
	b.poll("both copies handled", func() bool {
		ok, err := embeddedCaughtUp(b, "recovery-tasks")
		return err == nil && ok
	})
	b.health("openai", events.HealthOutage, time.Now())
	task("held", "held")
	task("held", "held-again")
	b.poll("the held copies", func() bool {
		r, _, err := s.Store().LoadProvider(b.ctx, "openai")
		return err == nil && r != nil && r.Queue.Held == 2
	})
	b.health("openai", events.HealthRecovered, time.Now())
	b.poll("the checklist done", func() bool {
		rs := b.records()
		return len(rs) == len(events.Steps) && rs[len(rs)-1].Done
	})
	count := map[string]int{}
	for _, d := range b.dispatches() {
		count[fmt.Sprintf("%s#%d", d.TaskID, d.Attempt)]++
	}
	if count["up#1"] != 1 || count["held#1"] != 1 || len(count) != 2 {
		t.Fatalf("dispatches %v, want up#1 and held#1 once each", count)
	}
	if r := b.records()[len(events.Steps)-1]; r.Released != 1 {
		t.Fatalf("released %d, want 1 (the second copy is skipped, not counted)", r.Released)
	}
}

func embeddedCaughtUp(b *bundle, consumer string) (bool, error) {
	stream, _, _ := topology.Consumer(consumer)
	return embedded.CaughtUp(b.ctx, b.bus.JS, stream, consumer)
}

// A replica stops dead between storing a released task's dispatch and
// writing its ledger entry, and the next replica resumes only after the
// dispatch stream's duplicate window has forgotten that message id: the
// dispatch is found in the stream and not sent again. Every held task is
// dispatched exactly once — the ledger and the look-up, not the window.
func TestServiceReleaseResumedAfterTheDedupeWindowSendsNothingTwice(t *testing.T) {
	b := setup(t)
	const window = 500 * time.Millisecond
	st, err := b.bus.JS.Stream(b.ctx, topology.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Duplicates = window
	if _, err := b.bus.JS.UpdateStream(b.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	stuck := recovery.DispatchID("held-1", 1)
	reached, release := make(chan struct{}), make(chan struct{})
	pol := recovery.Config{DrainRate: 20}
	b.start(svc.Options{Owner: "a", LeaseTTL: 300 * time.Millisecond, Policy: pol, CrashAt: func(point, what string) {
		if point == recovery.HookPublished && what == stuck {
			close(reached)
			<-release // dead, as far as the bus can tell: no ledger entry, no lease renewal
		}
	}})
	t.Cleanup(func() { close(release) }) // runs before replica a is stopped

	b.health("openai", events.HealthOutage, time.Now())
	for i := range 5 {
		id := fmt.Sprintf("held-%d", i)
		b.publish(events.TaskSubject("openai", "a"), &events.Task{ID: id, Agent: "a", Provider: "openai"}, id)
	}
	b.poll("5 tasks held", func() bool {
		r, _, err := svcStore(b).LoadProvider(b.ctx, "openai")
		return err == nil && r != nil && r.Queue.Held == 5
	})
	b.health("openai", events.HealthRecovered, time.Now())
	b.poll("replica a stuck after storing "+stuck, func() bool {
		select {
		case <-reached:
			return true
		default:
			return false
		}
	})
	forgotten := time.Now().Add(2 * window)
	b.poll("the duplicate window to pass", func() bool { return time.Now().After(forgotten) })

	b.start(svc.Options{Owner: "b", LeaseTTL: 300 * time.Millisecond, Policy: pol})
	b.poll("the checklist done", func() bool {
		rs := b.records()
		return len(rs) == len(events.Steps) && rs[len(rs)-1].Done
	})
	count := map[string]int{}
	for _, d := range b.dispatches() {
		count[fmt.Sprintf("%s#%d", d.TaskID, d.Attempt)]++
	}
	for i := range 5 {
		if k := fmt.Sprintf("held-%d#1", i); count[k] != 1 {
			t.Errorf("%s stored %d times, want once (all: %v)", k, count[k], count)
		}
	}
	if r := b.records()[len(events.Steps)-1]; r.Released != 5 {
		t.Errorf("released %d, want 5", r.Released)
	}
}

// svcStore opens the service's store on the test's bus.
func svcStore(b *bundle) *svc.Store {
	b.t.Helper()
	s, err := svc.OpenStore(b.ctx, b.bus.JS)
	if err != nil {
		b.t.Fatal(err)
	}
	return s
}

// A replica stops dead between storing a task's dispatch (its provider up)
// and writing its ledger entry; the task is redelivered to the next replica
// only after the dispatch stream's duplicate window forgot the message id:
// the dispatch is found in the stream (looked for from when the task was
// stored) and not sent again.
func TestServiceTaskRedeliveredAfterTheDedupeWindowIsDispatchedOnce(t *testing.T) {
	b := setup(t)
	const window = 500 * time.Millisecond
	st, err := b.bus.JS.Stream(b.ctx, topology.StreamDispatch)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Duplicates = window
	if _, err := b.bus.JS.UpdateStream(b.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	stream, cc, _ := topology.Consumer(topology.ConsumerRecoveryTasks)
	cc.AckWait, cc.BackOff = time.Second, nil // the stuck delivery comes back after 1 s
	if _, err := b.bus.JS.UpdateConsumer(b.ctx, stream, cc); err != nil {
		t.Fatal(err)
	}
	stuck := recovery.DispatchID("t-up", 1)
	reached, release := make(chan struct{}), make(chan struct{})
	b.start(svc.Options{Owner: "a", CrashAt: func(point, what string) {
		if point == recovery.HookPublished && what == stuck {
			close(reached)
			<-release
		}
	}})
	t.Cleanup(func() { close(release) })
	b.publish(events.TaskSubject("openai", "a"), &events.Task{ID: "t-up", Agent: "a", Provider: "openai"}, "t-up")
	b.poll("replica a stuck after storing "+stuck, func() bool {
		select {
		case <-reached:
			return true
		default:
			return false
		}
	})
	forgotten := time.Now().Add(2 * window)
	b.poll("the duplicate window to pass", func() bool { return time.Now().After(forgotten) })
	b.start(svc.Options{Owner: "b"})
	b.poll("replica b's ledger entry for "+stuck, func() bool {
		sent, err := svcStore(b).Sent(b.ctx, stuck)
		return err == nil && sent
	})
	if n := len(b.dispatches()); n != 1 {
		t.Errorf("t-up dispatched %d times, want once", n)
	}
}
