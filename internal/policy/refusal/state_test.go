package refusal

import (
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/failbus/failbus/pkg/events"
)

var refusalT0 = time.Date(2025, 10, 7, 9, 0, 0, 0, time.UTC)

func TestRefusalConfigYAML(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		want    Config
		wantErr string
	}{
		{"empty section keeps every default", "{}", DefaultConfig(), ""},
		{"delays only keep the other defaults", "reprobe_delays: [1m, 90m]",
			Config{ReprobeDelays: []time.Duration{time.Minute, 90 * time.Minute}, MaxRerenders: 2, StateTTL: DefaultStateTTL}, ""},
		{"every key", "reprobe_delays: [250ms]\nmax_rerenders: 0\nstate_ttl: 1h",
			Config{ReprobeDelays: []time.Duration{250 * time.Millisecond}, MaxRerenders: 0, StateTTL: time.Hour}, ""},
		{"an empty list means no re-probes", "reprobe_delays: []",
			Config{ReprobeDelays: []time.Duration{}, MaxRerenders: 2, StateTTL: DefaultStateTTL}, ""},
		{"unknown key is named", "reprobe_delay: [1m]", Config{}, `unknown key "reprobe_delay"`},
		{"bad duration is named", "reprobe_delays: [15m, soon]", Config{}, "refusal.reprobe_delays[1]"},
		{"bad ttl is named", "state_ttl: forever", Config{}, "refusal.state_ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Config
			err := yaml.Unmarshal([]byte(tt.doc), &got)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !equalRefusalConfig(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			out, err := yaml.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			var back Config
			if err := yaml.Unmarshal(out, &back); err != nil {
				t.Fatalf("round trip of %q: %v", out, err)
			}
			if !equalRefusalConfig(back, got) {
				t.Fatalf("round trip: got %+v, want %+v (yaml %q)", back, got, out)
			}
		})
	}
}

func TestRefusalConfigYAMLKeepsValuesAlreadySet(t *testing.T) {
	type policy struct {
		Refusal Config `yaml:"refusal"`
	}
	p := policy{Refusal: Config{ReprobeDelays: []time.Duration{time.Second}, MaxRerenders: 5, StateTTL: time.Hour}}
	if err := yaml.Unmarshal([]byte("refusal:\n  max_rerenders: 1\n"), &p); err != nil {
		t.Fatal(err)
	}
	want := Config{ReprobeDelays: []time.Duration{time.Second}, MaxRerenders: 1, StateTTL: time.Hour}
	if !equalRefusalConfig(p.Refusal, want) {
		t.Fatalf("got %+v, want %+v", p.Refusal, want)
	}
}

func equalRefusalConfig(a, b Config) bool {
	if len(a.ReprobeDelays) != len(b.ReprobeDelays) || a.MaxRerenders != b.MaxRerenders || a.StateTTL != b.StateTTL {
		return false
	}
	for i := range a.ReprobeDelays {
		if a.ReprobeDelays[i] != b.ReprobeDelays[i] {
			return false
		}
	}
	return true
}

func TestRefusalConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"defaults are valid", DefaultConfig(), ""},
		{"no re-probes is valid", Config{MaxRerenders: 0, StateTTL: time.Hour}, ""},
		{"zero delay", Config{ReprobeDelays: []time.Duration{time.Minute, 0}, StateTTL: time.Hour}, "reprobe_delays[1]"},
		{"negative re-renders", Config{MaxRerenders: -1, StateTTL: time.Hour}, "max_rerenders"},
		{"no ttl", Config{}, "state_ttl: must be positive"},
		{"ttl shorter than the schedule", Config{ReprobeDelays: DefaultReprobeDelays(), StateTTL: 7 * time.Hour}, "must exceed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestRefusalStateAllow(t *testing.T) {
	cfg := DefaultConfig()
	at := events.At(refusalT0)
	tests := []struct {
		name       string
		state      State
		now        time.Time
		wantOK     bool
		wantNext   time.Time
		wantFrozen bool
	}{
		{"no state: allowed", State{}, refusalT0, true, time.Time{}, false},
		{"re-render phase only: allowed", State{Increment: "1.0", Rerenders: 2}, refusalT0, true, time.Time{}, false},
		{"first refusal, 1ns before +15m: skipped", State{Refusals: 1, RefusedAt: at}, refusalT0.Add(15*time.Minute - 1), false, refusalT0.Add(15 * time.Minute), false},
		{"first refusal, at +15m: probe allowed", State{Refusals: 1, RefusedAt: at}, refusalT0.Add(15 * time.Minute), true, time.Time{}, false},
		{"second refusal waits 1h", State{Refusals: 2, RefusedAt: at}, refusalT0.Add(59 * time.Minute), false, refusalT0.Add(time.Hour), false},
		{"second refusal, at +1h: probe allowed", State{Refusals: 2, RefusedAt: at}, refusalT0.Add(time.Hour), true, time.Time{}, false},
		{"third refusal waits 6h", State{Refusals: 3, RefusedAt: at}, refusalT0.Add(5 * time.Hour), false, refusalT0.Add(6 * time.Hour), false},
		{"third refusal, at +6h: probe allowed", State{Refusals: 3, RefusedAt: at}, refusalT0.Add(6 * time.Hour), true, time.Time{}, false},
		{"fourth refusal: frozen however late", State{Refusals: 4, RefusedAt: at}, refusalT0.Add(1000 * time.Hour), false, time.Time{}, true},
		{"beyond four (racing senders): frozen", State{Refusals: 9, RefusedAt: at}, refusalT0.Add(1000 * time.Hour), false, time.Time{}, true},
		{"legacy record without a count: frozen", State{Legacy: true, RefusedAt: at}, refusalT0.Add(1000 * time.Hour), false, time.Time{}, true},
		{"count without a time: frozen", State{Refusals: 1}, refusalT0.Add(1000 * time.Hour), false, time.Time{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, next, frozen := tt.state.Allow(tt.now, cfg)
			if ok != tt.wantOK || !next.Equal(tt.wantNext) || frozen != tt.wantFrozen {
				t.Fatalf("Allow = (%v, %v, %v), want (%v, %v, %v)", ok, next, frozen, tt.wantOK, tt.wantNext, tt.wantFrozen)
			}
		})
	}
}

// TestRefusalStateRefuse runs sequences of real refusals on a virtual clock
// and checks counts, anchor, schedule and when a human is told.
func TestRefusalStateRefuse(t *testing.T) {
	type step struct {
		after      time.Duration // since refusalT0
		refusals   int
		reprobes   int
		refusedAt  time.Duration
		next       time.Duration // since refusalT0; -1 = none
		frozen     bool
		notify     bool
		severity   string
		wantAction string
	}
	skip := events.ActionSkipProvider
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"the default life: three re-probes then frozen, notified at first and at freeze", DefaultConfig(), []step{
			{0, 1, 0, 0, 15 * time.Minute, false, true, events.SeverityNormal, skip},
			{20 * time.Minute, 2, 1, 20 * time.Minute, 80 * time.Minute, false, false, events.SeverityNormal, skip},
			{90 * time.Minute, 3, 2, 90 * time.Minute, 450 * time.Minute, false, false, events.SeverityNormal, skip},
			{8 * time.Hour, 4, 3, 8 * time.Hour, -1, true, true, events.SeverityCritical, skip},
			{9 * time.Hour, 5, 4, 9 * time.Hour, -1, true, false, events.SeverityCritical, skip},
		}},
		{"a refusal reported late never moves the anchor back", DefaultConfig(), []step{
			{time.Hour, 1, 0, time.Hour, 75 * time.Minute, false, true, events.SeverityNormal, skip},
			{30 * time.Minute, 2, 1, time.Hour, 2 * time.Hour, false, false, events.SeverityNormal, skip},
		}},
		{"no re-probes: frozen at the first refusal, one critical notification", Config{StateTTL: time.Hour}, []step{
			{0, 1, 0, 0, -1, true, true, events.SeverityCritical, skip},
			{time.Minute, 2, 1, time.Minute, -1, true, false, events.SeverityCritical, skip},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := State{Segment: "s#0", Provider: "p"}
			for i, st := range tt.steps {
				var ev Event
				s, ev = s.Refuse(refusalT0.Add(st.after), tt.cfg)
				var wantNext time.Time
				if st.next >= 0 {
					wantNext = refusalT0.Add(st.next)
				}
				if ev.Refusals != st.refusals || ev.Reprobes != st.reprobes || !ev.RefusedAt.Equal(refusalT0.Add(st.refusedAt)) ||
					!ev.NextProbeAt.Equal(wantNext) || ev.Frozen != st.frozen || ev.Notify != st.notify ||
					ev.Severity() != st.severity || ev.Action != st.wantAction {
					t.Fatalf("step %d: got %+v (severity %s), want %+v", i, ev, ev.Severity(), st)
				}
				if s.Refusals != st.refusals || !s.RefusedAt.Equal(refusalT0.Add(st.refusedAt)) {
					t.Fatalf("step %d: state %+v", i, s)
				}
			}
		})
	}
}

func TestRefusalStateLegacyStaysFrozenAndSilent(t *testing.T) {
	cfg := DefaultConfig()
	for _, s := range []State{
		{Segment: "s#0", Provider: "p", Legacy: true},
		{Segment: "s#0", Provider: "p", Refusals: 2}, // count, but no time
	} {
		s2, ev := s.OnRefusal(ScopeIncrement, "1.0", refusalT0, cfg)
		if !ev.Frozen || ev.Notify || ev.Action != events.ActionSkipProvider || !s2.Frozen(cfg) {
			t.Fatalf("%+v: event %+v, state %+v; want frozen, silent skip_provider", s, ev, s2)
		}
		if ok, _, frozen := s2.Allow(refusalT0.Add(1000*time.Hour), cfg); ok || !frozen {
			t.Fatalf("%+v: allowed after a refusal", s2)
		}
	}
}

// TestRefusalStateIncrement: a refused increment is re-rendered at most
// MaxRerenders times, then it is a real refusal; once the history is
// refused, a refusal of anything in the segment is real.
func TestRefusalStateIncrement(t *testing.T) {
	cfg := DefaultConfig()
	type call struct {
		scope, inc string
		action     string
		rerender   int
		refusals   int
	}
	rr, skip := events.ActionRerender, events.ActionSkipProvider
	tests := []struct {
		name  string
		cfg   Config
		calls []call
	}{
		{"same increment: two re-renders, then skip_provider", cfg, []call{
			{"increment", "3.1", rr, 1, 0},
			{"increment", "3.1", rr, 2, 0},
			{"increment", "3.1", skip, 0, 1},
		}},
		{"a new increment starts its own count", cfg, []call{
			{"increment", "3.1", rr, 1, 0},
			{"increment", "3.1", rr, 2, 0},
			{"increment", "4.0", rr, 1, 0},
			{"increment", "4.0", rr, 2, 0},
			{"increment", "4.0", skip, 0, 1},
		}},
		{"history: skip_provider at once", cfg, []call{
			{"history", "3.1", skip, 0, 1},
		}},
		{"unknown scope is treated as history", cfg, []call{
			{"", "3.1", skip, 0, 1},
		}},
		{"after the history is refused, an increment refusal is real", cfg, []call{
			{"history", "3.1", skip, 0, 1},
			{"increment", "5.0", skip, 0, 2},
		}},
		{"max_rerenders 0: skip at once", Config{ReprobeDelays: DefaultReprobeDelays(), StateTTL: time.Hour * 24}, []call{
			{"increment", "3.1", skip, 0, 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := State{Segment: "s#0", Provider: "p"}
			for i, c := range tt.calls {
				var ev Event
				s, ev = s.OnRefusal(c.scope, c.inc, refusalT0.Add(time.Duration(i)*time.Minute), tt.cfg)
				if ev.Action != c.action || ev.Rerender != c.rerender || s.Refusals != c.refusals {
					t.Fatalf("call %d: event %+v state %+v, want %+v", i, ev, s, c)
				}
				if ev.Action == rr && (ev.Notify || ok(s.Allow(refusalT0, tt.cfg)) == false) {
					t.Fatalf("call %d: a re-render must neither notify nor skip the provider", i)
				}
			}
		})
	}
}

func ok(allowed bool, _ time.Time, _ bool) bool { return allowed }

func TestRefusalPeersAndDedupeKey(t *testing.T) {
	cfg := DefaultConfig()
	at := events.At(refusalT0)
	states := []State{
		{Segment: "s#0", Provider: "zeta", Refusals: 1, RefusedAt: at},
		{Segment: "s#0", Provider: "alpha", Refusals: 4, RefusedAt: at},
		{Segment: "s#0", Provider: "mid", Refusals: 2, RefusedAt: at},
		{Segment: "s#0", Provider: "old", Legacy: true},
		{Segment: "s#1", Provider: "other", Refusals: 1, RefusedAt: at},
	}
	first := Event{Segment: "s#0", Provider: "beta", Refusals: 1}
	if got := Notice(cfg, first, Peers(cfg, first, states)).DedupeKey; got != "provider-refusal:s#0:0:beta,zeta" {
		t.Fatalf("first-refusal key = %q", got)
	}
	frozen := Event{Segment: "s#0", Provider: "beta", Refusals: 4, Reprobes: 3, Frozen: true}
	if got := Notice(cfg, frozen, Peers(cfg, frozen, states)).DedupeKey; got != "provider-refusal:s#0:3:alpha,beta" {
		t.Fatalf("freeze key = %q", got)
	}
	if got := DedupeKey("s#0", 0, []string{"b", "a", "b"}); got != "provider-refusal:s#0:0:a,b" {
		t.Fatalf("dedupe key = %q", got)
	}
}
