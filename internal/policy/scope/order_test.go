package scope

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// arrival is one outcome of anthropic's profile a1 as the scope receives
// it: its own time (minutes after coreT0) and the caller's clock when it
// arrives (the replica's on the bus: other providers' outcomes move it).
type arrival struct {
	id     string
	ok     bool
	ownMin float64
	// callerMin is the caller's clock (minutes after coreT0); 0: the
	// outcome's own time.
	callerMin float64
}

func minutes(m float64) time.Time { return coreT0.Add(time.Duration(m * float64(time.Minute))) }

func (a arrival) observe(cfg Config, st *ProviderState) Observation {
	class := events.ClassTransport
	if a.ok {
		class = events.ClassOK
	}
	info, _ := events.LookupClass(class)
	c := events.Classification{OutcomeID: a.id, Agent: "bot-" + a.id, Provider: "anthropic", Profile: "a1", Class: class, Scope: info.Scope, At: events.At(minutes(a.ownMin))}
	caller := a.callerMin
	if caller == 0 {
		caller = a.ownMin
	}
	return st.Observe(cfg, c, minutes(caller))
}

// The fault scope counts each outcome at its own time, on the provider's
// own clock: whatever order network failures and successes arrive in, and
// however far another provider has moved the caller's clock, the outage is
// declared when (and only when) the failures' own times satisfy the rule
// (OutageMinFailures within Window since the latest success), at the
// provider's clock. Before, a failure or success was marked at the
// caller's clock: old failures arriving late counted as three within the
// window (a false outage), and a success observed at a clock run ahead
// cleared the failures after it (no outage where simulate says 10:02).
func TestObserveCountsOutcomesAtTheirOwnTimes(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig() // window 5m, 3 failures
	cases := []struct {
		name string
		seq  []arrival
		// outageAt is the outage's start (minutes), -1 for none.
		outageAt float64
	}{
		{"a minute apart, in time order", []arrival{{"s", true, -1, 0}, {"f0", false, 0, 0}, {"f1", false, 1, 0}, {"f2", false, 2, 0}, {"f3", false, 3, 0}}, 2},
		{"a minute apart, the caller's clock 5 minutes ahead", []arrival{{"s", true, -1, 6}, {"f0", false, 0, 6}, {"f1", false, 1, 7}, {"f2", false, 2, 7}, {"f3", false, 3, 8}}, 2},
		{"a minute apart, the third first", []arrival{{"s", true, -1, 0}, {"f2", false, 2, 0}, {"f0", false, 0, 0}, {"f1", false, 1, 0}}, 2},
		{"seconds apart, newest first", []arrival{{"f2", false, 0.5, 0}, {"f1", false, 1.0 / 3, 0}, {"f0", false, 1.0 / 6, 0}}, 0.5},
		{"a quarter of an hour apart, in time order", []arrival{{"f0", false, 0, 0}, {"f1", false, 15, 0}, {"f2", false, 30, 0}, {"f3", false, 45, 0}}, -1},
		{"a quarter of an hour apart, newest first", []arrival{{"f3", false, 45, 0}, {"f2", false, 30, 0}, {"f1", false, 15, 0}, {"f0", false, 0, 0}}, -1},
		{"a quarter of an hour apart, late at the caller's clock", []arrival{{"f0", false, 0, 45}, {"f1", false, 15, 45}, {"f2", false, 30, 45}, {"f3", false, 45, 45}}, -1},
		{"a late success clears only the failures before it", []arrival{{"f0", false, 0, 0}, {"f2", false, 2, 0}, {"s", true, 1, 0}, {"f3", false, 3, 0}, {"f4", false, 4, 0}}, 4},
		{"an at more than 30 days before the caller's clock counts at the clock", []arrival{{"f0", false, -31 * 24 * 60, 0.001}, {"f1", false, -31*24*60 + 1, 1}, {"f2", false, -31*24*60 + 2, 2}}, 2},
		{"a late success older than every failure clears none", []arrival{{"f0", false, 0, 0}, {"f1", false, 1, 0}, {"s", true, -1, 0}, {"f2", false, 2, 0}}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &ProviderState{Provider: "anthropic"}
			var health []events.Health
			for _, a := range tc.seq {
				health = append(health, a.observe(cfg, st).Health...)
			}
			var got []string
			for _, h := range health {
				got = append(got, h.State+"@"+h.At.UTC().Format(time.RFC3339))
			}
			var want []string
			if tc.outageAt >= 0 {
				want = []string{events.HealthOutage + "@" + minutes(tc.outageAt).Format(time.RFC3339)}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("health %q, want %q (net failures %v)", got, want, st.NetFailures)
			}
		})
	}
}

// Whether network failures are an outage does not depend on the order they
// arrive in: every order of failures six minutes apart is none, every
// order of three within a minute (and one long before) is one.
func TestObserveOutageDoesNotDependOnArrivalOrder(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	for _, tc := range []struct {
		set    []arrival
		outage bool
	}{
		{[]arrival{{"f0", false, 0, 0}, {"f1", false, 6, 0}, {"f2", false, 12, 0}, {"f3", false, 18, 0}, {"f4", false, 24, 0}}, false},
		{[]arrival{{"f0", false, 0, 0}, {"f1", false, 20, 0}, {"f2", false, 20.5, 0}, {"f3", false, 21, 0}}, true},
	} {
		n := 0
		for order := range permutations(tc.set) {
			n++
			st := &ProviderState{Provider: "anthropic"}
			var ids []string
			for _, a := range order {
				ids = append(ids, a.id)
				a.observe(cfg, st)
			}
			if st.Outage != tc.outage {
				t.Fatalf("arrival order %s: outage %v, want %v (net failures %v)", strings.Join(ids, " "), st.Outage, tc.outage, st.NetFailures)
			}
		}
		if want := []int{0, 1, 2, 6, 24, 120}[len(tc.set)]; n != want {
			t.Fatalf("%d orders tried, want %d", n, want)
		}
	}
}

// permutations yields every order of set (set is not changed).
func permutations(set []arrival) func(yield func([]arrival) bool) {
	return func(yield func([]arrival) bool) {
		a := slices.Clone(set)
		var perm func(k int) bool
		perm = func(k int) bool {
			if k == len(a) {
				return yield(slices.Clone(a))
			}
			for i := k; i < len(a); i++ {
				a[k], a[i] = a[i], a[k]
				if !perm(k + 1) {
					return false
				}
				a[k], a[i] = a[i], a[k]
			}
			return true
		}
		perm(0)
	}
}

// A redelivered network failure older than the ones counted (dropped to
// keep OutageMinFailures) changes nothing: it is not counted again as new.
// Before, it was appended at the caller's clock, and two such redeliveries
// made an outage of failures six minutes apart.
func TestObserveRedeliveredOldFailureIsNotCountedAgain(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	st := &ProviderState{Provider: "anthropic"}
	seq := []arrival{{"f0", false, 0, 0}, {"f1", false, 1, 0}, {"f2", false, 7, 0}, {"f3", false, 13, 0}, {"f4", false, 19, 0}}
	for _, a := range seq {
		if obs := a.observe(cfg, st); len(obs.Health) != 0 {
			t.Fatalf("%s: %+v; failures six minutes apart are no outage", a.id, obs.Health)
		}
	}
	before := fmt.Sprint(*st)
	for _, a := range seq[:2] {
		a.callerMin = 19.5 // redelivered after f4
		if obs := a.observe(cfg, st); len(obs.Health) != 0 || obs.Verdict.Outage {
			t.Fatalf("redelivered %s: %+v; want no outage", a.id, obs)
		}
	}
	if after := fmt.Sprint(*st); after != before {
		t.Fatalf("redelivering old failures changed the state:\n%s\nwas\n%s", after, before)
	}
}

// TestRecoveryLeavesTheOutagesFailuresBehind: a recovery streak whose
// successes arrive newest first spans recovery_min_time after a few of
// them, while the outage's failures still fill the latest calls; the
// provider recovers and is then healthy, not at once "degraded: failing a
// share of its calls" on the outage's own failures.
func TestRecoveryLeavesTheOutagesFailuresBehind(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig() // 3 network failures in 5m; recovered after 3 successes over 2m; error share over the latest 40
	st := &ProviderState{Provider: "anthropic"}
	var health []string
	for i := range 25 { // the outage: 25 network failures
		obs := arrival{id: fmt.Sprintf("f%02d", i), ownMin: float64(i) * 0.1}.observe(cfg, st)
		for _, h := range obs.Health {
			health = append(health, h.State)
		}
	}
	// The streak: its first success, then its newest, then one between.
	for _, a := range []arrival{{id: "s1", ok: true, ownMin: 3}, {id: "s3", ok: true, ownMin: 5}, {id: "s2", ok: true, ownMin: 4.9}} {
		obs := a.observe(cfg, st)
		for _, h := range obs.Health {
			health = append(health, h.State)
		}
		for _, n := range obs.Notify {
			if strings.HasPrefix(n.DedupeKey, "provider-errors:") {
				t.Errorf("%s: a notice of errors after the recovery: %s", a.id, n.Text)
			}
		}
	}
	want := []string{events.HealthOutage, events.HealthDegraded, events.HealthRecovered}
	if !slices.Equal(health, want) {
		t.Errorf("health %v, want %v", health, want)
	}
	if st.Erroring {
		t.Error("erroring after the recovery, on the outage's failures")
	}
}
