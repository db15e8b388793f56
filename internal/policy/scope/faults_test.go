package scope

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

func TestScopeProfilesAndRateLimits(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
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
			name: "two 429s, then hours later a 503 on a never-seen profile: the rate limit is over",
			seq: []scopeObs{{0, "p1", "gpt", events.ClassRateLimit, 0, ""}, {scopeSec, "p2", "gpt", events.ClassRateLimit, 0, ""},
				{26 * time.Hour, "p3", "gpt", events.ClassServerError, 0, ""}},
			health: "openai:degraded openai:healthy",
		},
		{
			name: "a profile within the window whose latest result is no 429 ends the rate limit",
			seq: []scopeObs{{0, "p1", "gpt", events.ClassRateLimit, 0, ""}, {scopeSec, "p2", "gpt", events.ClassRateLimit, 0, ""},
				{2 * scopeSec, "p3", "gpt", events.ClassServerError, 0, ""}},
			health: "openai:degraded openai:healthy",
		},
		{
			name: "the profiles it counted left scope.window: a 429 on one of them alone is no provider-wide rate limit",
			seq: []scopeObs{{0, "p1", "gpt", events.ClassRateLimit, 0, ""}, {scopeSec, "p2", "gpt", events.ClassRateLimit, 0, ""},
				{10 * time.Minute, "p1", "gpt", events.ClassRateLimit, 0, ""}},
			health: "openai:degraded openai:healthy",
		},
		{
			name: "429s on every profile within the window keep it",
			seq: []scopeObs{{0, "p1", "gpt", events.ClassRateLimit, 0, ""}, {scopeSec, "p2", "gpt", events.ClassRateLimit, 0, ""},
				{2 * time.Minute, "p1", "gpt", events.ClassRateLimit, 0, ""}},
			providerRL: true, health: "openai:degraded",
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
	cfg := DefaultConfig()
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
	cfg := DefaultConfig()
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
	cfg := DefaultConfig()
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

// coreT0 is the virtual clock's origin in the fault-scope tests.
var coreT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// A provider-wide rate limit ends at the provider's next outcome, and not
// at a late one: a
// late outcome (older than what its profile knows) brings no news of the
// provider's time, however late the caller's clock (another provider's
// outcomes move it) — simulate and the bus, whose lanes run providers
// concurrently, then end it at the same outcome.
func TestScopeRateLimitEndsAtTheProvidersNextOutcome(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	_, health, _, sc := scopeRun(cfg, []scopeObs{
		{0, "p1", "gpt", events.ClassRateLimit, 2000, ""}, {scopeSec, "p2", "gpt", events.ClassRateLimit, 2000, ""},
	})
	if got := scopeStates(health); got != "openai:degraded" {
		t.Fatalf("health %q, want degraded", got)
	}
	for _, callerAt := range []time.Duration{2 * scopeSec, 10 * scopeSec} {
		late := scopeObs{callerAt, "p1", "gpt", events.ClassServerError, 0, ""}.classification()
		late.At = events.At(coreT0.Add(-time.Minute)) // older than p1's latest result: it does not replace it
		obs := sc.Observe(late, coreT0.Add(callerAt))
		if len(obs.Health) != 0 || !obs.Verdict.ProviderRateLimited {
			t.Fatalf("late outcome at the caller's %s: health %v, verdict %+v; want still rate-limited", callerAt, obs.Health, obs.Verdict)
		}
	}
	next := scopeObs{10 * scopeSec, "p2", "gpt", events.ClassServerError, 0, ""}.classification()
	obs := sc.Observe(next, coreT0.Add(10*scopeSec))
	if got := scopeStates(obs.Health); got != "openai:healthy" || obs.Verdict.ProviderRateLimited {
		t.Fatalf("after the cooldown: health %q, verdict %+v; want healthy, not rate-limited", got, obs.Verdict)
	}
	if !strings.Contains(obs.Health[0].Reason, "server_error") {
		t.Errorf("reason %q does not name the result that ended it", obs.Health[0].Reason)
	}
}
