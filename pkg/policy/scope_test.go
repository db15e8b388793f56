package policy

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

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
	c := events.Classification{OutcomeID: "x", Agent: "a1", Provider: p, Profile: o.profile, Model: o.model, Class: o.class, Scope: info.Scope}
	if o.hintMS > 0 {
		c.Hints = &events.RetryHints{AfterMS: o.hintMS, Source: HintRetryAfter}
	}
	return c
}

// run feeds every observation to a fresh Scope and returns what the last
// one produced, plus every health record and notification on the way.
func scopeRun(cfg ScopeConfig, seq []scopeObs) (last ScopeObservation, health []events.Health, notes []events.Notification, sc *Scope) {
	sc = NewScope(cfg)
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
	scopeSec = time.Second
	scopeMin = time.Minute
)

func TestScopeOutage(t *testing.T) {
	t.Parallel()
	cfg := DefaultScopeConfig()
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
	cfg := DefaultScopeConfig() // 3 successes over at least 2m
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
	sc := NewScope(cfg)
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

func TestScopeProfilesAndRateLimits(t *testing.T) {
	t.Parallel()
	cfg := DefaultScopeConfig()
	tests := []struct {
		name        string
		seq         []scopeObs
		switchTo    string
		providerRL  bool
		cooldownEnd time.Duration // from coreT0; 0 = none
		health      string
		notes       string
	}{
		{
			name:     "429 on one profile while another works: switch to it",
			seq:      []scopeObs{{0, "p2", "gpt", events.ClassOK, 0, ""}, {scopeSec, "p1", "gpt", events.ClassRateLimit, 2000, ""}},
			switchTo: "p2",
		},
		{
			name:     "the most recently successful profile is chosen",
			seq:      []scopeObs{{0, "p3", "gpt", events.ClassOK, 0, ""}, {scopeSec, "p2", "gpt", events.ClassOK, 0, ""}, {2 * scopeSec, "p1", "gpt", events.ClassRateLimit, 0, ""}},
			switchTo: "p2",
		},
		{
			name: "429 on every profile: provider-wide rate limit, no switch",
			seq: []scopeObs{{0, "p2", "gpt", events.ClassOK, 0, ""}, {scopeSec, "p2", "gpt", events.ClassRateLimit, 30000, ""},
				{2 * scopeSec, "p1", "gpt", events.ClassRateLimit, 0, ""}},
			providerRL: true, cooldownEnd: 31 * scopeSec, health: "openai:degraded",
		},
		{
			name:       "one profile alone rate-limited is not provider-wide",
			seq:        []scopeObs{{0, "p1", "gpt", events.ClassRateLimit, 0, ""}, {scopeSec, "p1", "gpt", events.ClassRateLimit, 0, ""}},
			providerRL: false,
		},
		{
			name: "a success clears the provider-wide rate limit",
			seq: []scopeObs{{0, "p1", "gpt", events.ClassRateLimit, 0, ""}, {scopeSec, "p2", "gpt", events.ClassRateLimit, 0, ""},
				{5 * scopeSec, "p2", "gpt", events.ClassOK, 0, ""}, {6 * scopeSec, "p1", "gpt", events.ClassRateLimit, 0, ""}},
			switchTo: "p2", health: "openai:degraded openai:healthy",
		},
		{
			name:     "auth on one profile while another works: switch, and tell a human once",
			seq:      []scopeObs{{0, "p2", "gpt", events.ClassOK, 0, ""}, {scopeSec, "p1", "gpt", events.ClassAuth, 0, ""}},
			switchTo: "p2", notes: "normal profile-fault:openai:p1:auth:" + scopeItoa(coreT0.Add(scopeSec).UnixMilli()),
		},
		{
			name:  "auth with no other profile: no switch target",
			seq:   []scopeObs{{0, "p1", "gpt", events.ClassAuth, 0, ""}, {scopeSec, "p1", "gpt", events.ClassAuth, 0, ""}},
			notes: "normal profile-fault:openai:p1:auth:" + scopeItoa(coreT0.UnixMilli()),
		},
		{
			name:     "quota after auth is a new episode",
			seq:      []scopeObs{{0, "p2", "gpt", events.ClassOK, 0, ""}, {scopeSec, "p1", "gpt", events.ClassAuth, 0, ""}, {2 * scopeSec, "p1", "gpt", events.ClassQuotaExhausted, 0, ""}},
			switchTo: "p2",
			notes:    "normal profile-fault:openai:p1:auth:" + scopeItoa(coreT0.Add(scopeSec).UnixMilli()) + " | normal profile-fault:openai:p1:quota_exhausted:" + scopeItoa(coreT0.Add(2*scopeSec).UnixMilli()),
		},
		{
			name: "a profile forgotten after forget_after is no switch target",
			seq:  []scopeObs{{0, "p2", "gpt", events.ClassOK, 0, ""}, {25 * time.Hour, "p1", "gpt", events.ClassRateLimit, 0, ""}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			last, health, notes, _ := scopeRun(cfg, tt.seq)
			v := last.Verdict
			if v.SwitchProfile != tt.switchTo {
				t.Errorf("switch profile %q, want %q", v.SwitchProfile, tt.switchTo)
			}
			if v.ProviderRateLimited != tt.providerRL {
				t.Errorf("provider rate limited %v, want %v", v.ProviderRateLimited, tt.providerRL)
			}
			var wantEnd time.Time
			if tt.cooldownEnd > 0 {
				wantEnd = coreT0.Add(tt.cooldownEnd)
			}
			if tt.providerRL && !v.CooldownUntil.Equal(wantEnd) {
				t.Errorf("cooldown until %s, want %s", v.CooldownUntil, wantEnd)
			}
			if got := scopeStates(health); got != tt.health {
				t.Errorf("health %q, want %q", got, tt.health)
			}
			if got := scopeKeys(notes); got != tt.notes {
				t.Errorf("notifications %q, want %q", got, tt.notes)
			}
		})
	}
}

func TestScopeModels(t *testing.T) {
	t.Parallel()
	cfg := DefaultScopeConfig()
	seq := []scopeObs{
		{0, "p1", "gpt-mini", events.ClassOK, 0, ""},
		{scopeSec, "p1", "gpt-5", events.ClassUnsupportedParam, 0, ""},
	}
	last, _, notes, sc := scopeRun(cfg, seq)
	if last.Verdict.SwitchModel != "gpt-mini" || last.Verdict.Outage {
		t.Fatalf("verdict %+v, want switch_model to gpt-mini", last.Verdict)
	}
	wantFirst := "normal model-fault:openai:gpt-5:" + scopeItoa(coreT0.Add(scopeSec).UnixMilli())
	if scopeKeys(notes) != wantFirst || !strings.Contains(notes[0].Text, "switch to model gpt-mini") {
		t.Fatalf("notifications %q (%s), want %q", scopeKeys(notes), notes[0].Text, wantFirst)
	}
	// The same model failing again: same episode, no new notification.
	again := sc.Observe(scopeObs{2 * scopeSec, "p1", "gpt-5", events.ClassUnsupportedParam, 0, ""}.classification(), coreT0.Add(2*scopeSec))
	if len(again.Notify) != 0 {
		t.Errorf("repeat failure notified again: %q", scopeKeys(again.Notify))
	}
	// The fallback fails the same way: escalate, critically.
	fb := sc.Observe(scopeObs{3 * scopeSec, "p1", "gpt-mini", events.ClassModelNotFound, 0, ""}.classification(), coreT0.Add(3*scopeSec))
	if fb.Verdict.SwitchModel != "" {
		t.Errorf("no model works any more, yet switch to %q", fb.Verdict.SwitchModel)
	}
	wantEsc := "normal model-fault:openai:gpt-mini:" + scopeItoa(coreT0.Add(3*scopeSec).UnixMilli()) +
		" | critical model-fault-escalated:openai:" + scopeItoa(coreT0.Add(scopeSec).UnixMilli()) + ":gpt-5,gpt-mini"
	if got := scopeKeys(fb.Notify); got != wantEsc {
		t.Errorf("fallback failure notified %q, want %q", got, wantEsc)
	}
	// A success ends the episode.
	sc.Observe(scopeObs{4 * scopeSec, "p1", "gpt-mini", events.ClassOK, 0, ""}.classification(), coreT0.Add(4*scopeSec))
	if e := sc.State("openai").Models["gpt-mini"]; !e.FaultSince.IsZero() {
		t.Errorf("episode still open after a success: %+v", e)
	}
	// Model faults never make an outage, and a model-scope class that is
	// not a model fault (empty_response) does not switch models.
	v := sc.Observe(scopeObs{5 * scopeSec, "p1", "gpt-5", events.ClassEmptyResponse, 0, ""}.classification(), coreT0.Add(5*scopeSec)).Verdict
	if v.SwitchModel != "" || v.Outage {
		t.Errorf("empty_response verdict %+v", v)
	}
}

func TestScopeFailover(t *testing.T) {
	t.Parallel()
	cfg := DefaultScopeConfig()
	cfg.Failover = map[string][]string{"openai": {"azure", "anthropic"}}
	var seq []scopeObs
	for i, p := range []string{"azure", "azure", "azure", "openai", "openai", "openai"} {
		seq = append(seq, scopeObs{time.Duration(i) * scopeSec, "main", "m", events.ClassTransport, 0, p})
	}
	last, _, _, sc := scopeRun(cfg, seq)
	if !sc.Down("azure") || !last.Verdict.Outage {
		t.Fatalf("azure down %v, openai verdict %+v", sc.Down("azure"), last.Verdict)
	}
	if last.Verdict.FailoverProvider != "anthropic" {
		t.Errorf("failover %q, want anthropic (azure is down too)", last.Verdict.FailoverProvider)
	}
	if got := cfg.FailoverFor("openai", func(string) bool { return true }); got != "" {
		t.Errorf("everything down: failover %q", got)
	}
}

// TestProviderStateRoundTrip shows the state a service keeps in KV: encode
// it after every observation, decode it, and the rules behave exactly as in
// memory.
func TestProviderStateRoundTrip(t *testing.T) {
	t.Parallel()
	cfg := DefaultScopeConfig()
	seq := []scopeObs{
		{0, "main", "gpt", events.ClassOK, 0, ""},
		{scopeSec, "main", "gpt", events.ClassRateLimit, 4000, ""},
		{2 * scopeSec, "main", "gpt", events.ClassTransport, 0, ""},
		{3 * scopeSec, "backup", "gpt", events.ClassTransport, 0, ""},
		{4 * scopeSec, "main", "gpt", events.ClassTLS, 0, ""},
		{5 * scopeMin, "main", "gpt", events.ClassOK, 0, ""},
		{6 * scopeMin, "main", "gpt", events.ClassOK, 0, ""},
		{8 * scopeMin, "main", "gpt", events.ClassOK, 0, ""},
	}
	mem := &ProviderState{}
	for _, codec := range []string{"msgpack", "json"} {
		var stored []byte
		mem = &ProviderState{}
		for i, o := range seq {
			now := coreT0.Add(o.after)
			want := mem.Observe(cfg, o.classification(), now)
			var kv ProviderState
			if stored != nil {
				var err error
				if codec == "msgpack" {
					err = msgpack.Unmarshal(stored, &kv)
				} else {
					err = json.Unmarshal(stored, &kv)
				}
				if err != nil {
					t.Fatalf("%s decode: %v", codec, err)
				}
			}
			got := kv.Observe(cfg, o.classification(), now)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s step %d: from storage %+v, in memory %+v", codec, i, got, want)
			}
			var err error
			if codec == "msgpack" {
				stored, err = msgpack.Marshal(&kv)
			} else {
				stored, err = json.Marshal(&kv)
			}
			if err != nil {
				t.Fatalf("%s encode: %v", codec, err)
			}
		}
	}
	if mem.Outage || mem.HealthState() != events.HealthHealthy {
		t.Errorf("final state %+v, want recovered", mem)
	}
}
