package engine_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

func scopeVerdict() scope.Verdict { return scope.Verdict{} }

var t0 = time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)

func newEngine(t *testing.T, doc string) (*engine.Engine, *engine.Memory) {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	mem := engine.NewMemory(p.Refusal.StateTTL)
	eng, err := engine.New(engine.Config{Policy: p, Stores: mem.Stores(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return eng, mem
}

func netFail(id, provider, profile string, at time.Time) events.Classification {
	return events.Classification{OutcomeID: id, At: events.At(at), Agent: "a", Provider: provider, Profile: profile, Model: "m",
		Class: events.ClassTransport, Scope: events.ScopeNetwork, Retryable: true}
}

// A writer that stored a transition and died before publishing its records
// loses nothing: the provider's next writer gets them back, with the same
// message ids, before its own; once settled they are gone.
func TestObserveOutboxSurvivesAWriterThatDied(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, mem := newEngine(t, "")
	var last engine.Observed
	for i := range 3 {
		o, err := eng.Observe(ctx, netFail(fmt.Sprint("n", i), "openai", "p1", t0.Add(time.Duration(i)*time.Second)), t0.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		last = o
	}
	if len(last.Health) != 1 || len(last.Publish) != 2 || last.Seq == 0 {
		t.Fatalf("the outage: %+v, want one health record and one notification to publish", last)
	}
	// The writer dies here: nothing published, nothing settled.
	next, err := eng.Observe(ctx, netFail("n3", "openai", "p1", t0.Add(3*time.Second)), t0.Add(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(next.Publish, last.Publish) || len(next.Health) != 0 {
		t.Fatalf("next writer publishes %+v, want the dead writer's %+v again and nothing new", next.Publish, last.Publish)
	}
	if err := eng.Settle(ctx, "openai", last.Seq); err != nil {
		t.Fatal(err)
	}
	if rec := mem.Provider("openai"); len(rec.Outbox) != 0 {
		t.Fatalf("outbox after settling: %+v", rec.Outbox)
	}
	again, err := eng.Observe(ctx, netFail("n4", "openai", "p1", t0.Add(4*time.Second)), t0.Add(4*time.Second))
	if err != nil || len(again.Publish) != 0 {
		t.Fatalf("after settling: %+v, %v; want nothing to publish", again.Publish, err)
	}
	for _, e := range last.Publish {
		if !strings.HasPrefix(e.MsgID, "scope:openai:") {
			t.Errorf("message id %q is not the transition's", e.MsgID)
		}
	}
}

// A batch of one provider's classifications is one write and decides as the
// same classifications one by one.
func TestObserveBatchIsOneWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var cs []events.Classification
	var nows []time.Time
	for i := range 6 {
		at := t0.Add(time.Duration(i) * time.Second)
		cs = append(cs, netFail(fmt.Sprint("b", i), "openai", []string{"p1", "p2"}[i%2], at))
		nows = append(nows, at)
	}
	one, _ := newEngine(t, "")
	var want []engine.Observed
	for i := range cs {
		o, err := one.Observe(ctx, cs[i], nows[i])
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, o)
	}
	p := policy.Default()
	mem := engine.NewMemory(0)
	counted := &countingProviders{Providers: mem.Stores().Providers}
	batch, err := engine.New(engine.Config{Policy: p, Stores: engine.Stores{Providers: counted}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := batch.ObserveBatch(ctx, "openai", cs, nows)
	if err != nil {
		t.Fatal(err)
	}
	if counted.updates != 1 {
		t.Errorf("%d writes for a batch, want 1", counted.updates)
	}
	for i := range got {
		if !reflect.DeepEqual(got[i].Observation, want[i].Observation) {
			t.Errorf("classification %d: batch %+v, one by one %+v", i, got[i].Observation, want[i].Observation)
		}
	}
}

type countingProviders struct {
	engine.Providers
	updates int
}

func (c *countingProviders) Update(ctx context.Context, provider string, fn func(*engine.ProviderRecord) (bool, error)) error {
	c.updates++
	return c.Providers.Update(ctx, provider, fn)
}

// During an outage the failover is the first configured alternative that is
// not itself down.
func TestObserveFailsOverToAProviderThatIsUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, _ := newEngine(t, "scope:\n  failover: {openai: [azure, anthropic]}\n")
	var last engine.Observed
	for i, p := range []string{"azure", "azure", "azure", "openai", "openai", "openai"} {
		at := t0.Add(time.Duration(i) * time.Second)
		o, err := eng.Observe(ctx, netFail(fmt.Sprint("f", i), p, "main", at), at)
		if err != nil {
			t.Fatal(err)
		}
		last = o
	}
	if !last.Verdict.Outage || last.Verdict.FailoverProvider != "anthropic" {
		t.Fatalf("verdict %+v, want an outage failing over to anthropic (azure is down too)", last.Verdict)
	}
	d, err := eng.Decide(ctx, netFail("f5", "openai", "main", t0.Add(5*time.Second)), last.Verdict, last.Now)
	if err != nil || d.Decision.Action != events.ActionSwitchProvider || d.Decision.Provider != "anthropic" {
		t.Fatalf("decision %+v, %v; want switch_provider to anthropic", d.Decision, err)
	}
}

// A redelivered failure is decided from its ledger record again: same
// retry, nothing spent twice; a lost compare-and-set is decided again on
// what the other writer stored.
func TestDecideReplaysARedeliveryAndRetriesAConflict(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mem := engine.NewMemory(0)
	ledger := &conflictOnce{Ledger: mem.Stores().Ledger}
	eng, err := engine.New(engine.Config{Policy: policy.Default(), Stores: engine.Stores{Ledger: ledger}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := events.Classification{OutcomeID: "o1", At: events.At(t0), Agent: "a", Provider: "openai", Profile: "p1", Turn: 1, Step: 1, Class: events.ClassServerError}
	first, err := eng.Decide(ctx, c, scopeVerdict(), t0)
	if err != nil || first.Decision.Action != events.ActionRetry || first.Record == nil || first.Replayed {
		t.Fatalf("first: %+v, %v; want a new retry", first, err)
	}
	if ledger.conflicts != 1 {
		t.Errorf("%d conflicts met, want the one injected", ledger.conflicts)
	}
	again, err := eng.Decide(ctx, c, scopeVerdict(), t0.Add(time.Minute))
	if err != nil || !again.Replayed || again.Record.RetryID != first.Record.RetryID || !again.Decision.DueAt.Equal(first.Decision.DueAt.Time) {
		t.Fatalf("redelivery: %+v, %v; want the first retry replayed", again, err)
	}
	budget := retry.BudgetFor(c, policy.Default().RetryFor("openai")).Token()
	if rec, rev, _ := mem.Stores().Ledger.Latest(ctx, budget); rev != 1 || rec.Retry != 1 {
		t.Fatalf("ledger holds %d records (latest %+v), want 1", rev, rec)
	}
}

// conflictOnce loses the first compare-and-set, as if another replica had
// appended first (it appends nothing: the retry finds the same budget).
type conflictOnce struct {
	engine.Ledger
	conflicts int
}

func (l *conflictOnce) Append(ctx context.Context, rec *retry.Record, rev uint64) error {
	if l.conflicts == 0 {
		l.conflicts++
		return engine.ErrConflict
	}
	return l.Ledger.Append(ctx, rec, rev)
}

// A redelivered refusal is answered as the first time and counted once.
func TestRefuseCountsARedeliveryOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, mem := newEngine(t, "")
	c := events.Classification{OutcomeID: "r1", At: events.At(t0), Agent: "a", Provider: "p", Class: events.ClassContentRefusal,
		Session: "s", Segment: 2, Turn: 1, Step: 1, RefusalScope: refusal.ScopeHistory}
	first, err := eng.Refuse(ctx, c, t0)
	if err != nil || first.Replayed || first.Notification == nil {
		t.Fatalf("first refusal: %+v, %v", first, err)
	}
	again, err := eng.Refuse(ctx, c, t0) // a redelivery carries the same `at`
	if err != nil || !again.Replayed || !reflect.DeepEqual(again.Decision, first.Decision) || !reflect.DeepEqual(again.Notification, first.Notification) {
		t.Fatalf("redelivery: %+v, %v; want the first answer again", again, err)
	}
	if st, _ := mem.RefusalState("s#2", "p", t0.Add(time.Hour)); st.Refusals != 1 {
		t.Fatalf("refusals counted: %d, want 1", st.Refusals)
	}
}

// Admission on the engine's own store follows notification.Admit: a key
// once per lifetime, a held key held again the same day and tried again
// the next, the digest at the first hold, named as the notifier names it.
func TestAdmitFollowsTheNotifiersRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, _ := newEngine(t, "notify: {daily_budget: 1}")
	n := func(key string) events.Notification {
		return events.Notification{DedupeKey: key, Severity: events.SeverityNormal, Title: key}
	}
	lifetime := time.Hour
	steps := []struct {
		key   string
		at    time.Time
		want  notification.Verdict
		dig   bool
		again bool
	}{
		{"a", t0, notification.Send, false, false},
		{"a", t0.Add(59 * time.Minute), notification.Duplicate, false, false},
		{"b", t0.Add(time.Minute), notification.Hold, true, false},
		{"b", t0.Add(2 * time.Minute), notification.Hold, false, true},
		{"a", t0.Add(61 * time.Minute), notification.Hold, false, false}, // a new lifetime, but the day's budget is spent
		{"b", t0.Add(24 * time.Hour), notification.Send, false, false},   // the next day
	}
	for i, s := range steps {
		a, err := eng.Admit(ctx, n(s.key), s.at, lifetime)
		if err != nil {
			t.Fatal(err)
		}
		if a.Verdict != s.want || (a.Digest != nil) != s.dig || a.HeldAgain != s.again {
			t.Fatalf("step %d (%s at +%v): %+v, want %s digest %v held again %v", i, s.key, s.at.Sub(t0), a, s.want, s.dig, s.again)
		}
		if a.Digest != nil {
			d := *a.Digest
			if !notification.IsDigest(d) || !strings.Contains(d.Text, "failbus.audit."+delivery.DefaultService+"."+delivery.AuditHeld) {
				t.Fatalf("digest %+v does not name the notifier's audit subject", d)
			}
		}
	}
}

// Retry episodes, through Step (what simulate and the services run): eleven
// 503s of an agent without turn and step, each call going through on its
// retry, are eleven retry episodes — each gets retry 1, none give_up; a
// redelivered success ends nothing twice.
func TestStepRetryEpisodesWithoutTurnAndStep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, _ := newEngine(t, "")
	now := t0
	step := func(o *events.Outcome) engine.Effects {
		t.Helper()
		o.At = events.At(now)
		fx, err := eng.Step(ctx, engine.Input{Outcome: o}, now, engine.StepOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return fx
	}
	ids := map[string]bool{}
	for i := range 11 {
		fx := step(&events.Outcome{ID: fmt.Sprint("f", i), Agent: "bot3", Provider: "openai", Model: "gpt", Status: 503})
		d := fx.Decision
		if d == nil || d.Action != events.ActionRetry || d.Retry != 1 {
			t.Fatalf("503 #%d: %+v, want retry 1 of its own episode", i+1, d)
		}
		if ids[d.RetryID] {
			t.Fatalf("retry id %s issued twice", d.RetryID)
		}
		ids[d.RetryID] = true
		now = d.DueAt.Add(time.Second) // the retry came due; the agent retried and it went through
		ok := &events.Outcome{ID: fmt.Sprint("ok", i), Agent: "bot3", Provider: "openai", Model: "gpt", OK: true, Status: 200}
		step(ok)
		step(ok) // redelivered
		now = now.Add(time.Minute)
	}
	// After eleven episodes: a failure, its retry failing too (retry 2 of
	// the same episode), then the first failure redelivered — found in its
	// episode, the same retry again, nothing spent.
	first := step(&events.Outcome{ID: "g1", Agent: "bot3", Provider: "openai", Model: "gpt", Status: 503}).Decision
	now = first.DueAt.Add(time.Second)
	second := step(&events.Outcome{ID: "g2", Agent: "bot3", Provider: "openai", Model: "gpt", Status: 503}).Decision
	if first.Retry != 1 || second.Retry != 2 {
		t.Fatalf("retries %d and %d, want 1 and 2 of one episode", first.Retry, second.Retry)
	}
	again := step(&events.Outcome{ID: "g1", Agent: "bot3", Provider: "openai", Model: "gpt", Status: 503})
	if again.Decision.RetryID != first.RetryID || again.Retry != nil {
		t.Fatalf("redelivered g1: %+v (new retry %v), want retry %s again", again.Decision, again.Retry, first.RetryID)
	}
}

// Streams that stall or break after the provider answered (a 2xx, then
// nothing) are the provider's failures, not the network path's: however
// many, they never declare an outage, which needs every profile failing
// at the network layer; refused connections still do.
func TestAFailureAfterAnAnswerIsNoNetworkFailure(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, _ := newEngine(t, "")
	stalled := func(i int) events.Classification {
		o := &events.Outcome{ID: fmt.Sprint("s", i), Agent: "a", Provider: "p", Profile: "k", Status: 200,
			TransportError: "timeout: the stream stopped for 2m0s after 120 bytes (stall_after); the attempt was ended", At: events.At(t0)}
		c := eng.Classify(o)
		engine.Complete(&c, o)
		return c
	}
	c := stalled(0)
	if c.Class != events.ClassTimeout || c.Scope != events.ScopeProvider {
		t.Fatalf("a stalled stream classified %s, scope %s; want timeout, scope provider", c.Class, c.Scope)
	}
	for i := range 10 {
		at := t0.Add(time.Duration(i) * time.Second)
		c := stalled(i)
		c.At = events.At(at)
		o, err := eng.Observe(ctx, c, at)
		if err != nil {
			t.Fatal(err)
		}
		if o.Verdict.Outage {
			t.Fatalf("an outage after %d stalled streams of a provider that answered", i+1)
		}
	}
	var last engine.Observed
	for i := range 3 {
		at := t0.Add(time.Duration(20+i) * time.Second)
		o, err := eng.Observe(ctx, netFail(fmt.Sprint("n", i), "p", "k", at), at)
		if err != nil {
			t.Fatal(err)
		}
		last = o
	}
	if !last.Verdict.Outage {
		t.Fatal("refused connections no longer declare an outage")
	}
}
