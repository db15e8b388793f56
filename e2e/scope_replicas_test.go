package e2e

// Two scheduler replicas on one bus share one fault scope (KV bucket
// FAILBUS_SCOPE, compare-and-set per provider), so they agree on every
// health transition: each is made once, by whichever replica's write lands
// first, and is the transition simulate makes.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/engine/sim"
	"github.com/failbus/failbus/internal/jspub"
	"github.com/failbus/failbus/internal/scopestore"
	"github.com/failbus/failbus/internal/service/classifier"
	"github.com/failbus/failbus/internal/service/scheduler"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

const replicaPolicy = `
retry: {jitter_ratio: 0}
scope: {window: 1m, recovery_min_successes: 3, recovery_min_time: 2s, forget_after: 1h}
`

type replicaBench struct {
	*bustest.Bus
	t    *testing.T
	pol  *policy.Policy
	regs []*prometheus.Registry
}

func replicaSetup(t *testing.T) *replicaBench {
	t.Helper()
	b := &replicaBench{Bus: bustest.Start(t, 3*time.Minute), t: t}
	var err error
	if b.pol, err = policy.Parse([]byte(replicaPolicy)); err != nil {
		t.Fatal(err)
	}
	b.run(classifier.New(b.JS, classifier.Config{Policy: b.pol, Runner: consumer.Config{Concurrency: 8, FetchWait: 100 * time.Millisecond, Registerer: prometheus.NewRegistry()}}))
	for range 2 {
		reg := prometheus.NewRegistry()
		b.regs = append(b.regs, reg)
		b.run(scheduler.New(b.JS, scheduler.Config{Policy: b.pol, Runner: consumer.Config{
			Concurrency: 8, FetchBatch: 4, FetchWait: 100 * time.Millisecond, Registerer: reg,
		}}))
	}
	return b
}

// run starts a service until the test ends.
func (b *replicaBench) run(s interface{ Run(context.Context) error }, err error) {
	b.t.Helper()
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.Ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("service: %v", err)
		}
	})
}

func (b *replicaBench) publish(o *events.Outcome) {
	b.t.Helper()
	if _, err := jspub.Publish(b.Ctx, b.JS, events.OutcomeSubject(o.Provider, o.Agent), o, o.ID, nil); err != nil {
		b.t.Fatal(err)
	}
}

// settle waits until the classifier and the schedulers acknowledged
// everything.
func (b *replicaBench) settle() {
	b.t.Helper()
	for {
		a, err := embedded.CaughtUp(b.Ctx, b.JS, topology.StreamOutcomes, topology.ConsumerClassifier)
		if err != nil {
			b.t.Fatal(err)
		}
		s, err := embedded.CaughtUp(b.Ctx, b.JS, topology.StreamClassified, topology.ConsumerScheduler)
		if err != nil {
			b.t.Fatal(err)
		}
		if a && s {
			return
		}
		select {
		case <-b.Ctx.Done():
			b.t.Fatal("timed out waiting for the schedulers")
		case <-time.After(5 * time.Millisecond): // poll interval, bounded by Ctx
		}
	}
}

// handled is how many classifications replica i handled.
func (b *replicaBench) handled(i int) float64 {
	b.t.Helper()
	mfs, err := b.regs[i].Gather()
	if err != nil {
		b.t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "failbus_consumer_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "service" && l.GetValue() == scheduler.Name {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func netFailure(id string, at time.Time, provider, profile string) *events.Outcome {
	return &events.Outcome{ID: id, At: events.At(at), Agent: "a-" + profile, Provider: provider, Profile: profile, Model: "m", TransportError: "read ECONNRESET"}
}

func success(id string, at time.Time, provider, profile string) *events.Outcome {
	return &events.Outcome{ID: id, At: events.At(at), Agent: "a-" + profile, Provider: provider, Profile: profile, Model: "m", OK: true, Status: 200}
}

// Outcomes one at a time, each handled by either replica: the health
// records are exactly simulate's for the same outcomes.
func TestTwoSchedulerReplicasMakeSimulatesHealthTransitions(t *testing.T) {
	t.Parallel()
	b := replicaSetup(t)
	t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	var seq []*events.Outcome
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	seq = append(seq, success("r01", at(0), "openai", "p1"), success("r02", at(100), "openai", "p2"))
	for i := range 6 { // both profiles fail at the network layer: outage
		seq = append(seq, netFailure(fmt.Sprintf("r1%d", i), at(200+100*i), "openai", []string{"p1", "p2"}[i%2]))
	}
	seq = append(seq,
		success("r20", at(2000), "openai", "p1"),        // recovering
		netFailure("r21", at(2500), "openai", "p2"),     // recovery interrupted
		success("r22", at(3000), "openai", "p2"),        // recovering again
		success("r23", at(4000), "openai", "p1"),        //
		success("r24", at(5500), "openai", "p2"),        // 3 successes over 2.5s: recovered
		netFailure("r25", at(6000), "anthropic", "k1"),  // another provider: one failure is no outage
		success("r26", at(6100), "anthropic", "k1"),     //
		netFailure("r27", at(6200), "openai", "p1"),     //
		success("r28", at(6300), "openai", "p2"),        //
		netFailure("r29", at(6400), "anthropic", "k1"),  //
		netFailure("r30", at(6500), "anthropic", "k1"),  //
		netFailure("r31", at(6600), "anthropic", "k1"),  // anthropic down: its only profile, 3 failures
		netFailure("r32", at(6700), "anthropic", "k1"),  //
		success("r33", at(7000), "anthropic", "k1"),     //
		success("r34", at(9500), "anthropic", "k1"),     //
		success("r35", at(9600), "anthropic", "k1"),     // anthropic recovered
		netFailure("r36", at(9700), "openai", "p1"),     //
		success("r37", at(9800), "openai", "p1"),        //
		success("r38", at(9900), "openai", "p2"),        //
		netFailure("r39", at(10000), "anthropic", "k1"), //
		success("r40", at(10100), "anthropic", "k1"),    //
		netFailure("r41", at(10200), "openai", "p2"),    //
		netFailure("r42", at(10300), "openai", "p1"),    //
		netFailure("r43", at(10400), "openai", "p2"),    // openai down again
		netFailure("r44", at(10500), "openai", "p1"),    //
		success("r45", at(12000), "openai", "p1"),       //
		netFailure("r46", at(12100), "openai", "p2"),    //
		success("r47", at(13000), "openai", "p2"),       //
		success("r48", at(14000), "openai", "p1"),       //
		success("r49", at(16000), "openai", "p1"),       // openai recovered again
		netFailure("r50", at(16100), "anthropic", "k1"), //
		success("r51", at(16200), "anthropic", "k1"),    //
		netFailure("r52", at(16300), "anthropic", "k1"), //
		netFailure("r53", at(16400), "anthropic", "k1"), //
		netFailure("r54", at(16500), "anthropic", "k1"), // anthropic down again, and stays down
		success("r55", at(17000), "anthropic", "k1"),    //
		netFailure("r56", at(17100), "anthropic", "k1"), //
	)

	s, err := sim.New(sim.Config{Policy: b.pol, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, o := range seq {
		for _, out := range s.Step(sim.Input{Type: sim.InputOutcome, At: o.At, Outcome: o}) {
			if out.Type == sim.OutputHealth {
				want = append(want, canonical(t, out.Health))
			}
		}
		b.publish(o)
		b.settle()
	}
	got := diffRead[*events.Health](b.Ctx, t, b.JS, topology.StreamHealth, events.HealthPrefix+".>")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("health records of two replicas:\n%s\nsimulate:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(want) < 8 {
		t.Errorf("only %d transitions: the sequence no longer covers outages and recoveries of two providers", len(want))
	}
	if b.handled(0) == 0 || b.handled(1) == 0 {
		t.Errorf("classifications handled by the replicas: %v and %v; both must take part", b.handled(0), b.handled(1))
	}
	t.Logf("%d health transitions, the same as simulate's; replicas handled %v and %v", len(got), b.handled(0), b.handled(1))
}

// A burst of failures from many agents at once, then of successes, both
// replicas handling them concurrently: one outage, one recovering, one
// recovered — never a transition twice, never one missing.
func TestTwoSchedulerReplicasAgreeUnderABurst(t *testing.T) {
	t.Parallel()
	b := replicaSetup(t)
	t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	profiles := []string{"k1", "k2", "k3"}
	publishAll := func(make func(i int) *events.Outcome, n int) {
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := w; i < n; i += 4 {
					b.publish(make(i))
				}
			})
		}
		wg.Wait()
		b.settle()
	}
	publishAll(func(i int) *events.Outcome {
		return success(fmt.Sprintf("w%d", i), t0.Add(time.Duration(i)*time.Millisecond), "burst", profiles[i%3])
	}, 3)
	publishAll(func(i int) *events.Outcome {
		return netFailure(fmt.Sprintf("f%03d", i), t0.Add(time.Second+time.Duration(i)*time.Millisecond), "burst", profiles[i%3])
	}, 120)
	publishAll(func(i int) *events.Outcome {
		return success(fmt.Sprintf("s%03d", i), t0.Add(10*time.Second+time.Duration(i)*50*time.Millisecond), "burst", profiles[i%3])
	}, 90)

	var states []string
	for _, h := range diffRead[*events.Health](b.Ctx, t, b.JS, topology.StreamHealth, events.HealthPrefix+".>") {
		states = append(states, h[strings.Index(h, `"state":`):])
	}
	want := []string{`"state":"outage"}`, `"state":"degraded"}`, `"state":"recovered"}`}
	if strings.Join(states, " ") != strings.Join(want, " ") {
		t.Errorf("health transitions %v, want each of %v once", states, want)
	}
	notes := diffRead[*events.Notification](b.Ctx, t, b.JS, topology.StreamNotify, events.NotifyPrefix+".>")
	if len(notes) != 2 || !strings.Contains(notes[0], "provider-outage:burst:") || !strings.Contains(notes[1], "provider-recovered:burst:") {
		t.Errorf("notification requests %v, want the outage's and the recovery's, once each", notes)
	}
	if b.handled(0) == 0 || b.handled(1) == 0 {
		t.Errorf("classifications handled by the replicas: %v and %v; both must take part", b.handled(0), b.handled(1))
	}
	// No replica's write was lost: the stored state holds each profile's
	// latest result (the last success of each profile).
	st, err := scopestore.Open(b.Ctx, b.JS, scopestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := st.Get(b.Ctx, "burst")
	if err != nil || rec == nil {
		t.Fatalf("fault scope of burst: %v, %v", rec, err)
	}
	for i := 87; i < 90; i++ {
		p, id := profiles[i%3], fmt.Sprintf("s%03d", i)
		if e := rec.State.Profiles[p]; e == nil || e.LastID != id || !e.LastOK {
			t.Errorf("profile %s: latest result %+v, want %s (a write was lost)", p, e, id)
		}
	}
	if rec.State.Outage || len(rec.Outbox) != 0 {
		t.Errorf("final state: outage %v, outbox %v; want recovered and everything published", rec.State.Outage, rec.Outbox)
	}
}
