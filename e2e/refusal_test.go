package e2e

// Acceptance of the refusal tiers on a real embedded nats-server: the whole pipeline — agents (pkg/agent) report outcomes,
// the classifier classifies, two replicas of the refusal service keep the
// state in KV and answer route — with re-probe delays of a few hundred
// milliseconds and two agents racing on one segment. The counts of the
// virtual-clock test hold over real time: the refusing provider receives the
// segment exactly four times (the first refusal and three re-probes), then
// nothing however many turns follow; exactly two notifications (reprobes 0
// and 3); a boundary lets it be tried once more.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/service/classifier"
	"github.com/failbus/failbus/internal/service/refusals"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// refBench is an embedded server with the topology, the classifier and two
// refusal service replicas running.
type refBench struct {
	t   *testing.T
	ctx context.Context
	srv *embedded.Server
	js  jetstream.JetStream
	cfg refusal.Config
}

func refSetup(t *testing.T, cfg refusal.Config, replicas int) *refBench {
	t.Helper()
	bus := bustest.Start(t, 2*time.Minute)
	srv, js, ctx := bus.Srv, bus.JS, bus.Ctx
	b := &refBench{t: t, ctx: ctx, srv: srv, js: js, cfg: cfg}
	b.run("classifier", func(js jetstream.JetStream) (func(context.Context) error, func() error) {
		r, err := classifier.New(js, classifier.Config{Runner: consumer.Config{FetchWait: 100 * time.Millisecond, Registerer: prometheus.NewRegistry()}})
		if err != nil {
			t.Fatal(err)
		}
		return r.Run, r.Healthy
	})
	for i := range replicas {
		b.run(fmt.Sprintf("refusals-%d", i), func(js jetstream.JetStream) (func(context.Context) error, func() error) {
			s, err := refusals.New(js, refusals.Config{
				Policy: cfg,
				Runner: consumer.Config{FetchWait: 100 * time.Millisecond, Registerer: prometheus.NewRegistry()},
			})
			if err != nil {
				t.Fatal(err)
			}
			return s.Run, s.Healthy
		})
	}
	return b
}

// run starts one service on its own connection until the test ends and
// waits until it is healthy.
func (b *refBench) run(name string, build func(jetstream.JetStream) (func(context.Context) error, func() error)) {
	b.t.Helper()
	js, err := jetstream.New(embedded.ConnectTest(b.t, b.srv))
	if err != nil {
		b.t.Fatal(err)
	}
	run, healthy := build(js)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("%s Run: %v", name, err)
		}
	})
	b.poll(name+" healthy", func() bool { return healthy() == nil })
}

func (b *refBench) poll(what string, cond func() bool) {
	b.t.Helper()
	for !cond() {
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond): // poll interval, bounded by b.ctx
		}
	}
}

// idle waits until the durable consumer has acknowledged all of its stream.
func (b *refBench) idle(stream, name string) {
	b.t.Helper()
	b.poll(name+" idle", func() bool {
		ok, err := embedded.CaughtUp(b.ctx, b.js, stream, name)
		if err != nil {
			b.t.Fatal(err)
		}
		return ok
	})
}

// pipelineIdle waits until every outcome reported so far has gone through
// the classifier and the refusal service.
func (b *refBench) pipelineIdle() {
	b.t.Helper()
	b.idle(topology.StreamOutcomes, topology.ConsumerClassifier)
	b.idle(topology.StreamClassified, topology.ConsumerRefusals)
	b.idle(topology.StreamOutcomes, topology.ConsumerRefusalBoundaries)
}

func refRead[T events.Message](b *refBench, stream, filter string) []T {
	b.t.Helper()
	s, err := b.js.Stream(b.ctx, stream)
	if err != nil {
		b.t.Fatal(err)
	}
	oc, err := s.OrderedConsumer(b.ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		b.t.Fatal(err)
	}
	var out []T
	for {
		batch, err := oc.FetchNoWait(256)
		if err != nil {
			b.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			v, err := events.DecodeAs[T](m.Subject(), m.Headers(), m.Data())
			if err != nil {
				b.t.Fatalf("%s: %v", m.Subject(), err)
			}
			out = append(out, v)
			got++
		}
		if got == 0 {
			return out
		}
	}
}

func (b *refBench) record(segment, provider string) (refusal.Record, bool) {
	b.t.Helper()
	store, err := refusals.OpenStore(b.ctx, b.js)
	if err != nil {
		b.t.Fatal(err)
	}
	e, found, err := store.Get(b.ctx, refusals.Key(segment, provider))
	if err != nil {
		b.t.Fatal(err)
	}
	return e.Record, found
}

// refAgent is one agent's loop: each turn it asks route for the segment,
// sends to the first allowed provider (the refusing one refuses every
// request; the spare answers), reports a refusal and waits for its decision,
// then falls back within the same turn.
type refAgent struct {
	b         *refBench
	ag        *agent.Agent
	decisions <-chan events.Decision
	session   string
	segment   int
	refuser   string
	providers []string
	// maxReprobes bounds the sends of one turn (the policy's re-probes).
	maxReprobes int

	mu        sync.Mutex
	sends     []time.Time // when the refuser received the segment
	frozen    bool        // route said the refuser is frozen
	held      int         // route answers that another agent's re-probe was in flight
	quietFrom time.Time   // count turns that start after this
	quiet     int
	err       error
}

func (b *refBench) newAgent(name, session string, segment int, refuser string, providers ...string) *refAgent {
	b.t.Helper()
	ag, err := agent.New(embedded.ConnectTest(b.t, b.srv), name)
	if err != nil {
		b.t.Fatal(err)
	}
	ds, err := ag.Decisions(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	return &refAgent{b: b, ag: ag, decisions: ds, session: session, segment: segment, refuser: refuser, providers: providers, maxReprobes: b.cfg.MaxReprobes()}
}

// turn runs one turn; it returns an error only for broken contracts.
func (a *refAgent) turn(ctx context.Context, n int) error {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		r, err := a.ag.Route(ctx, a.session, a.segment, a.providers)
		if err != nil {
			return err
		}
		a.mu.Lock()
		for _, s := range r.Skipped {
			if s.Provider == a.refuser && s.Frozen {
				a.frozen = true
			}
			if s.Provider == a.refuser && !s.Frozen && s.NextProbeAt != nil && attempt == 0 && strings.Contains(s.Reason, "in flight") {
				a.held++
			}
		}
		if !a.quietFrom.IsZero() && start.After(a.quietFrom) {
			a.quiet++
		}
		a.mu.Unlock()
		if len(r.Allowed) == 0 {
			return fmt.Errorf("turn %d: nothing allowed: %+v", n, r)
		}
		if r.Allowed[0] != a.refuser {
			return nil // the spare takes the turn
		}
		if attempt > a.maxReprobes {
			// A slow pipeline may make the next re-probe due by the time
			// the decision arrives, but never more than the schedule.
			return fmt.Errorf("turn %d: the refuser was allowed %d times in one turn: %+v", n, attempt+1, r)
		}
		o := &events.Outcome{
			Provider: a.refuser, Model: "m-1", Session: a.session, Segment: a.segment, Turn: n,
			OK: true, Status: 200, StopReason: "refusal", RefusalScope: refusal.ScopeHistory,
		}
		a.mu.Lock()
		a.sends = append(a.sends, time.Now())
		a.mu.Unlock()
		if err := a.ag.Report(ctx, o); err != nil {
			return err
		}
		if err := a.awaitDecision(ctx, o.ID); err != nil {
			return fmt.Errorf("turn %d: %w", n, err)
		}
	}
}

// awaitDecision waits for the decision on outcome id: an agent acts on it
// before its next call.
func (a *refAgent) awaitDecision(ctx context.Context, id string) error {
	for {
		select {
		case d, ok := <-a.decisions:
			if !ok {
				return errors.New("decisions closed")
			}
			if d.OutcomeID != id {
				continue
			}
			if d.Action != events.ActionSkipProvider || d.Provider != a.refuser || d.Reason == "" {
				return fmt.Errorf("decision %+v: want skip_provider for %s with a reason", d, a.refuser)
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("no decision for %s: %w", id, ctx.Err())
		}
	}
}

// loop takes a turn every `every` until ctx ends (the pace of the agent's
// turns, as "every few minutes" on the virtual clock).
func (a *refAgent) loop(ctx context.Context, start <-chan struct{}, every time.Duration) {
	<-start
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := 1; ; n++ {
		if err := a.turn(ctx, n); err != nil {
			if ctx.Err() == nil {
				a.mu.Lock()
				a.err = err
				a.mu.Unlock()
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (a *refAgent) snapshot() (sends []time.Time, frozen bool, held, quiet int, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.sends), a.frozen, a.held, a.quiet, a.err
}

func TestRefusalRealTimeTwoAgentsRacingOnOneSegment(t *testing.T) {
	t.Parallel()
	cfg := refusal.Config{
		ReprobeDelays: []time.Duration{200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond},
		MaxRerenders:  2,
		StateTTL:      time.Hour,
	}
	b := refSetup(t, cfg, 2)
	const session, refuser = "sess-race", "strict"
	providers := []string{refuser, "spare"}
	agents := []*refAgent{
		b.newAgent("agent-a", session, 1, refuser, providers...),
		b.newAgent("agent-b", session, 1, refuser, providers...),
	}

	// Both agents start on the same instant and take a turn every 15ms:
	// their first calls race before any refusal is known, and every due
	// re-probe is asked for by both.
	ctx, stop := context.WithCancel(b.ctx)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Go(func() { a.loop(ctx, start, 15*time.Millisecond) })
	}
	close(start)
	defer func() { stop(); wg.Wait() }()

	check := func() {
		for _, a := range agents {
			if _, _, _, _, err := a.snapshot(); err != nil {
				t.Fatalf("%s: %v", a.ag.Name(), err)
			}
		}
	}
	b.poll("the refuser frozen for both agents", func() bool {
		check()
		for _, a := range agents {
			if _, frozen, _, _, _ := a.snapshot(); !frozen {
				return false
			}
		}
		return true
	})
	// Keep turning until the whole schedule would have run out again from
	// now, and then some: a frozen provider gets nothing however long the
	// clock runs.
	var total time.Duration
	for _, d := range cfg.ReprobeDelays {
		total += d
	}
	quietFrom := time.Now().Add(total)
	for _, a := range agents {
		a.mu.Lock()
		a.quietFrom = quietFrom
		a.mu.Unlock()
	}
	b.poll("30 turns per agent after the schedule ran out", func() bool {
		check()
		for _, a := range agents {
			if _, _, _, quiet, _ := a.snapshot(); quiet < 30 {
				return false
			}
		}
		return true
	})
	stop()
	wg.Wait()
	check()
	b.pipelineIdle()

	var sends []time.Time
	held := 0
	for _, a := range agents {
		s, _, h, _, _ := a.snapshot()
		sends = append(sends, s...)
		held += h
		t.Logf("%s: %d sends to %s, %d route answers with another agent's re-probe in flight", a.ag.Name(), len(s), refuser, h)
	}
	sort.Slice(sends, func(i, j int) bool { return sends[i].Before(sends[j]) })
	if want := 1 + cfg.MaxReprobes(); len(sends) != want {
		t.Fatalf("the refuser received segment 1 %d times, want exactly %d (first refusal + %d re-probes)", len(sends), want, cfg.MaxReprobes())
	}
	if outs := refRead[*events.Outcome](b, topology.StreamOutcomes, events.OutcomePrefix+"."+refuser+".>"); len(outs) != len(sends) {
		t.Errorf("FAILBUS_OUTCOMES holds %d outcomes of %s, want %d", len(outs), refuser, len(sends))
	}
	rec, ok := b.record(events.SegmentKey(session, 1), refuser)
	if !ok || rec.State.Refusals != len(sends) || !rec.State.Frozen(cfg) || rec.Claim != (refusal.Claim{}) {
		t.Errorf("state %+v (found %v): want %d refusals, frozen, no claim left", rec, ok, len(sends))
	}

	// Every decision dates the next probe from the latest refusal.
	ds := refRead[*events.Decision](b, topology.StreamDecisions, events.DecisionPrefix+".>")
	if len(ds) != len(sends) {
		t.Errorf("%d decisions, want one per refusal (%d)", len(ds), len(sends))
	}
	for _, d := range ds {
		if d.Action != events.ActionSkipProvider {
			t.Errorf("decision %+v: want skip_provider", d)
		}
	}

	notes := refRead[*events.Notification](b, topology.StreamNotify, events.NotifyPrefix+".>")
	var keys []string
	for _, n := range notes {
		keys = append(keys, n.Severity+" "+n.DedupeKey)
	}
	wantKeys := []string{
		"normal " + refusal.DedupeKey(events.SegmentKey(session, 1), 0, []string{refuser}),
		"critical " + refusal.DedupeKey(events.SegmentKey(session, 1), cfg.MaxReprobes(), []string{refuser}),
	}
	if !slices.Equal(keys, wantKeys) {
		t.Errorf("notifications %q, want exactly %q", keys, wantKeys)
	}

	// A tool-surface change starts segment 2: the old state is retired and
	// the refuser may be tried once more.
	if err := agents[0].ag.Boundary(b.ctx, events.Boundary{Session: session, Segment: 2, Reason: "tool surface changed"}); err != nil {
		t.Fatal(err)
	}
	b.pipelineIdle()
	if _, found := b.record(events.SegmentKey(session, 1), refuser); found {
		t.Error("the boundary did not retire segment 1's state")
	}
	for _, a := range agents {
		a.segment = 2
	}
	if err := agents[1].turn(b.ctx, 1); err != nil {
		t.Fatal(err)
	}
	b.pipelineIdle()
	s2, _, _, _, _ := agents[1].snapshot()
	again := len(s2) - countBefore(s2, sends)
	if again < 1 {
		t.Error("after the boundary the refuser was not tried again")
	}
	if rec, ok := b.record(events.SegmentKey(session, 2), refuser); !ok || rec.State.Refusals != again {
		t.Errorf("segment 2 state %+v (found %v): want %d refusals, one per send", rec.State, ok, again)
	}
}

// countBefore counts the times in s that are in all (s's sends before the
// boundary).
func countBefore(s, all []time.Time) int {
	n := 0
	for _, x := range s {
		if slices.ContainsFunc(all, x.Equal) {
			n++
		}
	}
	return n
}
