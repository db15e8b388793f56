package scope

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// storyOutcome is one classified outcome of the idempotency story, with its
// own time.
type storyOutcome struct {
	c  events.Classification
	at time.Time
}

// outageStory is an outage of openai on two profiles, a broken recovery
// streak, a recovery, a rate limit on every profile and its end, a profile
// fault and a model fault: every kind of transition and notice.
func outageStory() []storyOutcome {
	var out []storyOutcome
	add := func(after time.Duration, profile, model, class string, hintMS int64) {
		info, _ := events.LookupClass(class)
		c := events.Classification{
			OutcomeID: "s" + strconv.Itoa(len(out)), Agent: "a1", Provider: "openai",
			Profile: profile, Model: model, Class: class, Scope: info.Scope, At: events.At(coreT0.Add(after)),
		}
		if hintMS > 0 {
			c.Hints = &events.RetryHints{AfterMS: hintMS}
		}
		out = append(out, storyOutcome{c: c, at: coreT0.Add(after)})
	}
	add(0, "main", "gpt", events.ClassOK, 0)
	add(scopeSec, "main", "gpt", events.ClassTransport, 0)
	add(2*scopeSec, "backup", "gpt", events.ClassTimeout, 0)
	add(3*scopeSec, "main", "gpt", events.ClassTransport, 0)
	add(10*scopeMin, "main", "gpt", events.ClassOK, 0)
	add(11*scopeMin, "backup", "gpt", events.ClassTransport, 0)
	add(12*scopeMin, "main", "gpt", events.ClassOK, 0)
	add(13*scopeMin, "backup", "gpt", events.ClassOK, 0)
	add(15*scopeMin, "main", "gpt", events.ClassOK, 0)
	add(16*scopeMin, "main", "gpt", events.ClassRateLimit, 2000)
	add(16*scopeMin+scopeSec, "backup", "gpt", events.ClassRateLimit, 0)
	add(17*scopeMin, "backup", "gpt", events.ClassOK, 0)
	add(18*scopeMin, "main", "gpt", events.ClassAuth, 0)
	add(19*scopeMin, "backup", "gpt-5", events.ClassUnsupportedParam, 0)
	return out
}

// effects observes the outcomes in order, each at the later of its own time
// and the time of the previous one, and collects every health record and
// notification.
func effects(cfg Config, seq []storyOutcome) ([]events.Health, []events.Notification, *ProviderState) {
	st := &ProviderState{Provider: "openai"}
	var hs []events.Health
	var ns []events.Notification
	var clock time.Time
	for _, o := range seq {
		if o.at.After(clock) {
			clock = o.at
		}
		obs := st.Observe(cfg, o.c, clock)
		hs = append(hs, obs.Health...)
		ns = append(ns, obs.Notify...)
	}
	return hs, ns, st
}

// TestObserveIsIdempotentPerOutcome: redelivering classifications — right
// after they were observed, or much later, after newer outcomes — changes
// no health transition, no notification and no verdict. This is what lets
// scheduler replicas share one provider state and a redelivery after a
// crash observe again.
func TestObserveIsIdempotentPerOutcome(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	story := outageStory()
	wantH, wantN, want := effects(cfg, story)
	if got := scopeStates(wantH); got != "openai:outage openai:degraded openai:outage openai:degraded openai:recovered openai:degraded openai:healthy" {
		t.Fatalf("the story's health is %q; the test needs every transition", got)
	}
	for seed := range uint64(50) {
		r := rand.New(rand.NewPCG(seed, 7))
		var seq []storyOutcome
		for i, o := range story {
			seq = append(seq, o)
			// Redeliver some earlier outcomes now: the one just observed,
			// or any before it.
			for range r.IntN(3) {
				seq = append(seq, story[r.IntN(i+1)])
			}
		}
		gotH, gotN, got := effects(cfg, seq)
		if !reflect.DeepEqual(gotH, wantH) {
			t.Fatalf("seed %d: health with redeliveries\n got %q\nwant %q", seed, scopeStates(gotH), scopeStates(wantH))
		}
		if !reflect.DeepEqual(gotN, wantN) {
			t.Fatalf("seed %d: notifications with redeliveries\n got %q\nwant %q", seed, scopeKeys(gotN), scopeKeys(wantN))
		}
		if got.Outage != want.Outage || got.RateLimited != want.RateLimited || len(got.NetFailures) != len(want.NetFailures) {
			t.Fatalf("seed %d: state %+v, want %+v", seed, got, want)
		}
	}
}

// A redelivered failure returns the verdict the state gives now, and a
// redelivered success from before an outage does not clear its failures.
func TestObserveReplayedSuccessDoesNotClearLaterFailures(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	story := outageStory()
	st := &ProviderState{Provider: "openai"}
	for _, o := range story[:3] { // ok, then two network failures
		st.Observe(cfg, o.c, o.at)
	}
	st.Observe(cfg, story[0].c, story[2].at) // the early success again
	if len(st.NetFailures) != 2 {
		t.Fatalf("net failures %v after replaying an older success; want the 2 failures kept", st.NetFailures)
	}
	obs := st.Observe(cfg, story[3].c, story[3].at)
	if !obs.Verdict.Outage || len(obs.Health) != 1 {
		t.Fatalf("third failure: %+v, want the outage", obs)
	}
	again := st.Observe(cfg, story[3].c, story[3].at.Add(time.Minute))
	if !again.Verdict.Outage || len(again.Health) != 0 || len(again.Notify) != 0 {
		t.Fatalf("redelivered third failure: %+v, want the outage verdict and nothing new", again)
	}
}
