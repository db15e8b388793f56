package scope

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/pkg/events"
)

// scopeObs is one classified outcome fed to the fault scope at coreT0+after.
type scopeObs struct {
	after   time.Duration
	profile string
	model   string
	class   string
	hintMS  int64
	// provider defaults to openai.
	provider string
}

func (o scopeObs) classification() events.Classification {
	p := o.provider
	if p == "" {
		p = "openai"
	}
	info, _ := events.LookupClass(o.class)
	c := events.Classification{OutcomeID: "o" + strconv.FormatInt(obsSeq.Add(1), 10), Agent: "a1", Provider: p, Profile: o.profile, Model: o.model, Class: o.class, Scope: info.Scope}
	if o.hintMS > 0 {
		c.Hints = &events.RetryHints{AfterMS: o.hintMS, Source: classify.HintRetryAfter}
	}
	return c
}

// obsSeq numbers the outcomes the tests make up: each is a distinct
// outcome, as on the bus.
var obsSeq atomic.Int64

// run feeds every observation to a fresh Scope and returns what the last
// one produced, plus every health record and notification on the way.
func scopeRun(cfg Config, seq []scopeObs) (last Observation, health []events.Health, notes []events.Notification, sc *tracker) {
	sc = newTracker(cfg)
	for _, o := range seq {
		last = sc.Observe(o.classification(), coreT0.Add(o.after))
		health = append(health, last.Health...)
		notes = append(notes, last.Notify...)
	}
	return last, health, notes, sc
}

func scopeStates(hs []events.Health) string {
	var s []string
	for _, h := range hs {
		s = append(s, h.Provider+":"+h.State)
	}
	return strings.Join(s, " ")
}

func scopeKeys(ns []events.Notification) string {
	var s []string
	for _, n := range ns {
		s = append(s, n.Severity+" "+n.DedupeKey)
	}
	return strings.Join(s, " | ")
}

const (
	//lint:ignore ST1011 short names for the tests' many durations: scopeSec is one second
	scopeSec = time.Second
	scopeMin = time.Minute
)

func TestScopeOutage(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	outageKey := "critical provider-outage:openai:" + scopeItoa(coreT0.Add(2*scopeSec).UnixMilli())
	tests := []struct {
		name       string
		seq        []scopeObs
		wantOutage bool
		health     string
		notes      string
	}{
		{
			name:       "both profiles fail at the network layer, 3 failures: outage",
			seq:        []scopeObs{{0, "main", "gpt", events.ClassTransport, 0, ""}, {scopeSec, "backup", "gpt", events.ClassTLS, 0, ""}, {2 * scopeSec, "main", "gpt-mini", events.ClassTimeout, 0, ""}},
			wantOutage: true, health: "openai:outage", notes: outageKey,
		},
		{
			name: "two failures are not enough",
			seq:  []scopeObs{{0, "main", "gpt", events.ClassTransport, 0, ""}, {scopeSec, "backup", "gpt", events.ClassTLS, 0, ""}},
		},
		{
			name: "the backup profile works: no outage",
			seq: []scopeObs{{0, "backup", "gpt", events.ClassOK, 0, ""}, {scopeSec, "main", "gpt", events.ClassTransport, 0, ""},
				{2 * scopeSec, "main", "gpt", events.ClassTransport, 0, ""}, {3 * scopeSec, "main", "gpt", events.ClassTransport, 0, ""}},
		},
		{
			name: "a success in between resets the count",
			seq: []scopeObs{{0, "main", "gpt", events.ClassTransport, 0, ""}, {scopeSec, "main", "gpt", events.ClassTransport, 0, ""},
				{2 * scopeSec, "main", "gpt", events.ClassOK, 0, ""}, {3 * scopeSec, "main", "gpt", events.ClassTransport, 0, ""}, {4 * scopeSec, "main", "gpt", events.ClassDNS, 0, ""}},
		},
		{
			name: "a profile whose latest result is an HTTP error is not failing at the network layer",
			seq: []scopeObs{{0, "backup", "gpt", events.ClassServerError, 0, ""}, {scopeSec, "main", "gpt", events.ClassTransport, 0, ""},
				{2 * scopeSec, "main", "gpt", events.ClassTransport, 0, ""}, {3 * scopeSec, "main", "gpt", events.ClassTransport, 0, ""}},
		},
		{
			name: "a profile not seen within the window does not block",
			seq: []scopeObs{{0, "backup", "gpt", events.ClassOK, 0, ""}, {10 * scopeMin, "main", "gpt", events.ClassTransport, 0, ""},
				{10*scopeMin + scopeSec, "main", "gpt", events.ClassTransport, 0, ""}, {10*scopeMin + 2*scopeSec, "main", "gpt", events.ClassTransport, 0, ""}},
			wantOutage: true, health: "openai:outage", notes: "critical provider-outage:openai:" + scopeItoa(coreT0.Add(10*scopeMin+2*scopeSec).UnixMilli()),
		},
		{
			name: "failures spread wider than the window are not an outage",
			seq:  []scopeObs{{0, "main", "gpt", events.ClassTransport, 0, ""}, {4 * scopeMin, "main", "gpt", events.ClassTransport, 0, ""}, {9 * scopeMin, "main", "gpt", events.ClassTransport, 0, ""}},
		},
		{
			name: "other providers are independent",
			seq: []scopeObs{{0, "main", "gpt", events.ClassTransport, 0, ""}, {scopeSec, "main", "claude", events.ClassOK, 0, "anthropic"},
				{2 * scopeSec, "main", "gpt", events.ClassTransport, 0, ""}, {3 * scopeSec, "main", "gpt", events.ClassTransport, 0, ""}},
			wantOutage: true, health: "openai:outage", notes: "critical provider-outage:openai:" + scopeItoa(coreT0.Add(3*scopeSec).UnixMilli()),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			last, health, notes, sc := scopeRun(cfg, tt.seq)
			if last.Verdict.Outage != tt.wantOutage || sc.Down("openai") != tt.wantOutage {
				t.Errorf("outage verdict %v, Down %v, want %v", last.Verdict.Outage, sc.Down("openai"), tt.wantOutage)
			}
			if got := scopeStates(health); got != tt.health {
				t.Errorf("health %q, want %q", got, tt.health)
			}
			if got := scopeKeys(notes); got != tt.notes {
				t.Errorf("notifications %q, want %q", got, tt.notes)
			}
			if tt.wantOutage {
				if !strings.Contains(last.Verdict.Reason, "network layer") || !strings.Contains(health[0].Reason, "every profile") {
					t.Errorf("reason %q / %q does not say why", last.Verdict.Reason, health[0].Reason)
				}
				if !strings.Contains(notes[0].Text, "wait_provider") || notes[0].Labels["provider"] != "openai" {
					t.Errorf("notification %+v", notes[0])
				}
			}
		})
	}
}

func scopeItoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestScopeRecovery(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig() // 3 successes over at least 2m
	down := []scopeObs{{0, "main", "gpt", events.ClassTransport, 0, ""}, {scopeSec, "backup", "gpt", events.ClassTransport, 0, ""}, {2 * scopeSec, "main", "gpt", events.ClassTransport, 0, ""}}
	ok := func(after time.Duration) scopeObs { return scopeObs{after, "main", "gpt", events.ClassOK, 0, ""} }
	tests := []struct {
		name      string
		then      []scopeObs
		recovered bool
		health    string
		notes     int
	}{
		{name: "one success is never recovery", then: []scopeObs{ok(10 * scopeMin)}, health: "openai:outage openai:degraded", notes: 1},
		{name: "three quick successes are not sustained", then: []scopeObs{ok(10 * scopeMin), ok(10*scopeMin + scopeSec), ok(10*scopeMin + 2*scopeSec)}, health: "openai:outage openai:degraded", notes: 1},
		{name: "three successes over 2m recover", then: []scopeObs{ok(10 * scopeMin), ok(11 * scopeMin), ok(12 * scopeMin)}, recovered: true, health: "openai:outage openai:degraded openai:recovered", notes: 2},
		{name: "many successes over less than 2m do not", then: []scopeObs{ok(10 * scopeMin), ok(10*scopeMin + 30*scopeSec), ok(11 * scopeMin), ok(11*scopeMin + 30*scopeSec), ok(11*scopeMin + 59*scopeSec)}, health: "openai:outage openai:degraded", notes: 1},
		{
			name: "a network failure breaks the streak, which starts over",
			then: []scopeObs{ok(10 * scopeMin), ok(11 * scopeMin), {11*scopeMin + 30*scopeSec, "main", "gpt", events.ClassTimeout, 0, ""}, ok(12 * scopeMin), ok(13 * scopeMin), ok(14 * scopeMin)},
			// The 12:00 success starts a new streak; 14:00 completes 3 over 2m.
			recovered: true, health: "openai:outage openai:degraded openai:outage openai:degraded openai:recovered", notes: 2,
		},
		{
			name:   "HTTP failures neither extend nor break the streak",
			then:   []scopeObs{ok(10 * scopeMin), {10*scopeMin + scopeSec, "main", "gpt", events.ClassServerError, 0, ""}, ok(11 * scopeMin), {11*scopeMin + scopeSec, "main", "gpt", events.ClassAuth, 0, ""}},
			health: "openai:outage openai:degraded", notes: 2, // the auth episode notifies once
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, health, notes, sc := scopeRun(cfg, append(append([]scopeObs(nil), down...), tt.then...))
			if got := !sc.Down("openai"); got != tt.recovered {
				t.Errorf("recovered = %v, want %v", got, tt.recovered)
			}
			if got := scopeStates(health); got != tt.health {
				t.Errorf("health %q, want %q", got, tt.health)
			}
			if len(notes) != tt.notes {
				t.Errorf("notifications %q, want %d", scopeKeys(notes), tt.notes)
			}
			if tt.recovered {
				last := notes[len(notes)-1]
				if last.Severity != events.SeverityNormal || !strings.HasPrefix(last.DedupeKey, "provider-recovered:openai:"+scopeItoa(coreT0.Add(2*scopeSec).UnixMilli())) {
					t.Errorf("recovery notification %+v", last)
				}
				if st := sc.State("openai").HealthState(); st != events.HealthHealthy {
					t.Errorf("state after recovery %q", st)
				}
			}
		})
	}
	// During the outage every failure's verdict is an outage, whatever its
	// class, also while recovering.
	sc := newTracker(cfg)
	for _, o := range down {
		sc.Observe(o.classification(), coreT0.Add(o.after))
	}
	sc.Observe(ok(10*scopeMin).classification(), coreT0.Add(10*scopeMin))
	if st := sc.State("openai").HealthState(); st != events.HealthDegraded {
		t.Errorf("recovering state %q, want degraded", st)
	}
	for _, class := range []string{events.ClassRateLimit, events.ClassUnsupportedParam, events.ClassServerError} {
		v := sc.Observe(scopeObs{10*scopeMin + scopeSec, "main", "gpt", class, 0, ""}.classification(), coreT0.Add(10*scopeMin+scopeSec)).Verdict
		if !v.Outage {
			t.Errorf("%s during the outage: verdict %+v, want outage", class, v)
		}
	}
}

// TestStateKeepsAtMostMaxProfilesAndModels: agents name profiles and
// models; 20,000 names leave at most the configured number in a provider's
// state, the least recently seen dropped and counted, the busy one kept.
func TestStateKeepsAtMostMaxProfilesAndModels(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	cfg.MaxProfiles, cfg.MaxModels = 10, 5
	s := &ProviderState{Provider: "p"}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	evicted := 0
	for i := range 20_000 {
		now = now.Add(time.Millisecond)
		obs := s.Observe(cfg, events.Classification{OutcomeID: fmt.Sprint(i), Provider: "p", Profile: fmt.Sprintf("pr-%d", i), Model: fmt.Sprintf("m-%d", i), Class: events.ClassOK}, now)
		evicted += obs.Evicted
		now = now.Add(time.Millisecond)
		obs = s.Observe(cfg, events.Classification{OutcomeID: fmt.Sprint(i) + "b", Provider: "p", Profile: "busy", Model: "busy", Class: events.ClassOK}, now)
		evicted += obs.Evicted
	}
	if len(s.Profiles) > 10 || len(s.Models) > 5 {
		t.Fatalf("%d profiles, %d models remembered; want at most 10 and 5", len(s.Profiles), len(s.Models))
	}
	if s.Profiles["busy"] == nil || s.Models["busy"] == nil {
		t.Fatal("the profile and model in use were dropped")
	}
	if want := (20_000 + 1 - 10) + (20_000 + 1 - 5); evicted != want {
		t.Fatalf("%d evictions counted, want %d", evicted, want)
	}
	if err := (Config{Window: time.Minute, OutageMinFailures: 1, RecoveryMinSuccesses: 2, RecoveryMinTime: time.Minute, ForgetAfter: time.Hour}).Validate(); err == nil {
		t.Fatal("max_profiles 0 accepted")
	}
}

// A provider serving hundreds of calls a second meets "network failures
// in a row on every profile" by chance when a tenth of its calls fail
// at the network layer; it is not down while most of its calls succeed.
// When its path really goes down, every call fails and it is an outage
// within half a sample of failures.
func TestScopeOutageOnABusyProvider(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	profiles := []string{"key-1", "key-2", "key-3"}
	busy := func(n int, failShare float64, seed uint64) []scopeObs {
		rng := rand.New(rand.NewPCG(seed, 1))
		seq := make([]scopeObs, n)
		for i := range seq {
			class := events.ClassOK
			if rng.Float64() < failShare {
				class = events.ClassTransport
			}
			seq[i] = scopeObs{after: time.Duration(i) * 300 * time.Microsecond, profile: profiles[rng.IntN(len(profiles))], model: "gpt", class: class}
		}
		return seq
	}
	t.Run("a tenth of its calls fail: no outage", func(t *testing.T) {
		t.Parallel()
		for seed := range uint64(3) {
			if _, health, _, _ := scopeRun(cfg, busy(30_000, 0.1, seed)); strings.Contains(scopeStates(health), "outage") {
				t.Errorf("seed %d: %s", seed, scopeStates(health))
			}
		}
	})
	t.Run("then every call fails: outage", func(t *testing.T) {
		t.Parallel()
		seq := busy(3_000, 0.1, 7)
		end := seq[len(seq)-1].after
		for i := range errorCalls(cfg) + 1 {
			seq = append(seq, scopeObs{after: end + time.Duration(i+1)*300*time.Microsecond, profile: profiles[i%len(profiles)], model: "gpt", class: events.ClassTransport})
		}
		if _, health, _, _ := scopeRun(cfg, seq); !strings.HasSuffix(scopeStates(health), "openai:outage") {
			t.Errorf("health %q, want an outage at the end", scopeStates(health))
		}
	})
}
