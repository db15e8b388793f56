package scope

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// callsOf makes n outcomes of openai, one every gap from coreT0+start,
// alternating between the profiles; the i-th fails with fail(i)'s class
// ("" is a success).
func callsOf(start time.Duration, n int, gap time.Duration, profiles []string, fail func(i int) string) []scopeObs {
	var out []scopeObs
	for i := range n {
		class := fail(i)
		if class == "" {
			class = events.ClassOK
		}
		out = append(out, scopeObs{start + time.Duration(i)*gap, profiles[i%len(profiles)], "claude", class, 0, ""})
	}
	return out
}

// fourOfSeven fails calls 0, 2, 4 and 5 of every seven (57 %) with
// overloaded and server_error, as the provider of the newcomer's report
// did: no run of successes long enough to look healthy.
func fourOfSeven(i int) string {
	switch i % 7 {
	case 0, 4:
		return events.ClassOverloaded
	case 2, 5:
		return events.ClassServerError
	}
	return ""
}

// TestScopeProviderFailingAShareOfItsCalls: a provider failing a large
// share of its calls on its own side (overloaded, server_error) on every
// profile is degraded, and an outage once nothing succeeds; one failing
// profile, a small share, or too few calls are not the provider's fault.
func TestScopeProviderFailingAShareOfItsCalls(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig() // error_ratio 0.5 over the latest 40 calls, at least 20 within 5m
	both := []string{"key-1", "key-2"}
	degradedAt := func(i int) string {
		return "normal provider-errors:openai:" + scopeItoa(coreT0.Add(time.Duration(i)*5*scopeSec).UnixMilli())
	}
	tests := []struct {
		name    string
		seq     []scopeObs
		health  string
		notes   string
		outage  bool
		reason  string // in the last health record
		erring  bool
		verdict string // the last verdict's reason, when an outage
	}{
		{
			name:   "57% overloaded and server_error on both profiles for 40 minutes: degraded once, throughout",
			seq:    callsOf(0, 480, 5*scopeSec, both, fourOfSeven),
			health: "openai:degraded", notes: degradedAt(19), erring: true,
			reason: "12 of the latest 20 calls within 5m0s failed on the provider's side (overloaded, server_error), on every profile (key-1, key-2)",
		},
		{
			name:   "every call fails on both profiles: degraded, then an outage when twenty came since the last success",
			seq:    append(callsOf(0, 2, 5*scopeSec, both, func(int) string { return "" }), callsOf(10*scopeSec, 22, 5*scopeSec, both, func(int) string { return events.ClassServerError })...),
			health: "openai:degraded openai:outage", outage: true,
			reason: "every profile (key-1, key-2) fails on the provider's side (server_error): 20 calls within 5m0s, none succeeded",
			notes:  "normal provider-errors:openai:" + scopeItoa(coreT0.Add(10*scopeSec+17*5*scopeSec).UnixMilli()) + " | critical provider-outage:openai:" + scopeItoa(coreT0.Add(10*scopeSec+19*5*scopeSec).UnixMilli()),
		},
		{
			name: "57% failing at random for three hours: degraded throughout, never down (runs of ten failures come by chance)",
			seq: callsOf(0, 5000, 2*scopeSec, both, func() func(int) string {
				r := rand.New(rand.NewPCG(57, 57))
				return func(int) string {
					if r.Float64() < 0.57 {
						return events.ClassOverloaded
					}
					return ""
				}
			}()),
			health: "openai:degraded", notes: "normal provider-errors:openai:" + scopeItoa(coreT0.Add(38*scopeSec).UnixMilli()), erring: true,
		},
		{
			name: "one agent retrying a 503 ten times alone is neither: its retry chain decides",
			seq: callsOf(0, 11, 0, []string{"key-1"}, func(i int) string {
				return events.ClassServerError
			}),
		},
		{
			name: "one profile fails every call while the other works: the profile's fault, not the provider's",
			seq: callsOf(0, 60, 5*scopeSec, both, func(i int) string {
				if i%2 == 0 {
					return events.ClassServerError
				}
				return ""
			}),
		},
		{
			name: "20% fail: healthy",
			seq: callsOf(0, 200, 5*scopeSec, both, func(i int) string {
				if i%5 == 0 {
					return events.ClassOverloaded
				}
				return ""
			}),
		},
		{
			name: "twelve failures of nineteen calls in five minutes are too few to tell",
			seq: callsOf(0, 19, 15*scopeSec, both, func(i int) string {
				if i%3 != 2 {
					return events.ClassOverloaded
				}
				return ""
			}),
		},
		{
			name: "the errors stop: healthy again once fewer than a quarter of the latest calls fail",
			seq: append(callsOf(0, 70, 5*scopeSec, both, fourOfSeven),
				callsOf(350*scopeSec, 40, 5*scopeSec, both, func(int) string { return "" })...),
			health: "openai:degraded openai:healthy", notes: degradedAt(19),
			reason: "errors over: 9 of the latest 40 calls failed on the provider's side",
		},
		{
			name: "the provider falls quiet: the errors are over at its next call",
			seq: append(callsOf(0, 20, 5*scopeSec, both, fourOfSeven),
				scopeObs{time.Hour, "key-1", "claude", events.ClassServerError, 0, ""}),
			health: "openai:degraded openai:healthy", notes: degradedAt(19),
			reason: "errors over: fewer than 20 calls within 5m0s",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			last, health, notes, sc := scopeRun(cfg, tt.seq)
			if got := scopeStates(health); got != tt.health {
				t.Errorf("health %q, want %q", got, tt.health)
			}
			if got := scopeKeys(notes); got != tt.notes {
				t.Errorf("notifications %q, want %q", got, tt.notes)
			}
			st := sc.State("openai")
			if st.Outage != tt.outage || last.Verdict.Outage != tt.outage && last.Verdict.Reason != "" {
				t.Errorf("outage %v (verdict %+v), want %v", st.Outage, last.Verdict, tt.outage)
			}
			if st.Erroring != tt.erring {
				t.Errorf("erroring %v, want %v", st.Erroring, tt.erring)
			}
			if tt.reason != "" && !strings.Contains(health[len(health)-1].Reason, tt.reason) {
				t.Errorf("last health reason %q does not say %q", health[len(health)-1].Reason, tt.reason)
			}
			if len(st.Calls) > cfg.ErrorSample {
				t.Errorf("%d calls kept, at most %d", len(st.Calls), cfg.ErrorSample)
			}
		})
	}
}

// TestObserveCountsACallOnce: redelivering the failures of a provider, at
// once or after newer calls, and observing them out of time order, keeps
// the same latest calls and the same transitions as one delivery in
// order.
func TestObserveCountsACallOnce(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	var story []storyOutcome
	for i, o := range callsOf(0, 40, 5*scopeSec, []string{"key-1", "key-2"}, fourOfSeven) {
		c := o.classification()
		c.OutcomeID, c.At = "e"+strconv.Itoa(i), events.At(coreT0.Add(o.after))
		story = append(story, storyOutcome{c: c, at: coreT0.Add(o.after)})
	}
	wantH, wantN, want := effects(cfg, story)
	if got := scopeStates(wantH); got != "openai:degraded" {
		t.Fatalf("the story's health is %q; the test needs it degraded", got)
	}
	var redelivered []storyOutcome
	for i, o := range story {
		redelivered = append(redelivered, o, story[i/2], story[i])
	}
	gotH, gotN, got := effects(cfg, redelivered)
	if !reflect.DeepEqual(gotH, wantH) || !reflect.DeepEqual(gotN, wantN) {
		t.Errorf("with redeliveries: health %q, notes %q; want %q, %q", scopeStates(gotH), scopeKeys(gotN), scopeStates(wantH), scopeKeys(wantN))
	}
	if !reflect.DeepEqual(got.Calls, want.Calls) {
		t.Errorf("with redeliveries the latest calls are\n%v\nwant\n%v", got.Calls, want.Calls)
	}
	// Pairs swapped: each outcome arrives after the next one.
	swapped := append([]storyOutcome(nil), story...)
	for i := 0; i+1 < len(swapped); i += 2 {
		swapped[i], swapped[i+1] = swapped[i+1], swapped[i]
	}
	_, _, got = effects(cfg, swapped)
	if !reflect.DeepEqual(got.Calls, want.Calls) || got.Erroring != want.Erroring {
		t.Errorf("out of order the latest calls are\n%v (erroring %v)\nwant\n%v (erroring %v)", got.Calls, got.Erroring, want.Calls, want.Erroring)
	}
}

// TestSwitchProfileOnlyToTheAgentsOwn: switch_profile names a profile
// only to an agent that reported it (CONTRACT.md: "A decision names a
// profile only among those the agent itself has reported or declared"):
// an agent without a profile, or with one other agents' credential works
// for, gets no switch target (its retry waits for the cooldown).
func TestSwitchProfileOnlyToTheAgentsOwn(t *testing.T) {
	t.Parallel()
	at := func(sec int) time.Time { return coreT0.Add(time.Duration(sec) * scopeSec) }
	obs := func(id, agent, profile, class string) events.Classification {
		info, _ := events.LookupClass(class)
		return events.Classification{OutcomeID: id, Agent: agent, Provider: "openai", Profile: profile, Model: "gpt", Class: class, Scope: info.Scope}
	}
	t.Run("an agent without a profile is not sent to another agent's", func(t *testing.T) {
		st := &ProviderState{Provider: "openai"}
		st.Observe(DefaultConfig(), obs("b1", "bob", "key-1", events.ClassOK), at(0))
		v := st.Observe(DefaultConfig(), obs("a1", "ann", "", events.ClassRateLimit), at(1)).Verdict
		if v.SwitchProfile != "" {
			t.Errorf("ann (no profile) is told to switch to %q, bob's", v.SwitchProfile)
		}
	})
	t.Run("an agent with its own second profile switches to it", func(t *testing.T) {
		st := &ProviderState{Provider: "openai"}
		st.Observe(DefaultConfig(), obs("b1", "bob", "key-9", events.ClassOK), at(0))
		st.Observe(DefaultConfig(), obs("a1", "ann", "key-2", events.ClassOK), at(1))
		v := st.Observe(DefaultConfig(), obs("a2", "ann", "key-1", events.ClassRateLimit), at(2)).Verdict
		if v.SwitchProfile != "key-2" {
			t.Errorf("ann is told to switch to %q, want her own key-2 (not bob's more recent key-9)", v.SwitchProfile)
		}
		v = st.Observe(DefaultConfig(), obs("a3", "ann", "key-1", events.ClassAuth), at(3)).Verdict
		if v.SwitchProfile != "key-2" {
			t.Errorf("auth: ann is told to switch to %q, want key-2", v.SwitchProfile)
		}
	})
	t.Run("the unnamed profile is never a target", func(t *testing.T) {
		st := &ProviderState{Provider: "openai"}
		st.Observe(DefaultConfig(), obs("a1", "ann", "", events.ClassOK), at(0))
		v := st.Observe(DefaultConfig(), obs("a2", "ann", "key-1", events.ClassRateLimit), at(1)).Verdict
		if v.SwitchProfile != "" {
			t.Errorf("told to switch to %q", v.SwitchProfile)
		}
	})
	t.Run("a profile remembers its latest agents only", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.MaxAgentsPerProfile = 2
		st := &ProviderState{Provider: "openai"}
		for i, agent := range []string{"ann", "bob", "cat"} {
			st.Observe(cfg, obs("k"+strconv.Itoa(i), agent, "key-2", events.ClassOK), at(i))
		}
		st.Observe(cfg, obs("a9", "ann", "key-1", events.ClassOK), at(5))
		if v := st.Observe(cfg, obs("a10", "ann", "key-1", events.ClassRateLimit), at(6)).Verdict; v.SwitchProfile != "" {
			t.Errorf("ann, forgotten by key-2, is told to switch to %q", v.SwitchProfile)
		}
		if v := st.Observe(cfg, obs("c10", "cat", "key-1", events.ClassRateLimit), at(7)).Verdict; v.SwitchProfile != "key-2" {
			t.Errorf("cat is told to switch to %q, want key-2", v.SwitchProfile)
		}
	})
}
