package refusal

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

func TestRouteProviders(t *testing.T) {
	cfg := DefaultConfig()
	at := events.At(refusalT0)
	states := map[string]State{
		"waiting":   {Segment: "s#0", Provider: "waiting", Refusals: 2, RefusedAt: at},
		"due":       {Segment: "s#0", Provider: "due", Refusals: 1, RefusedAt: at},
		"frozen":    {Segment: "s#0", Provider: "frozen", Refusals: 4, RefusedAt: at},
		"legacy":    {Segment: "s#0", Provider: "legacy", Legacy: true},
		"rerenders": {Segment: "s#0", Provider: "rerenders", Increment: "1.0", Rerenders: 1},
	}
	lookup := func(p string) (State, bool) { s, ok := states[p]; return s, ok }
	now := refusalT0.Add(30 * time.Minute)

	tests := []struct {
		name      string
		providers []string
		allowed   []string
		skipped   []string
		json      string
	}{
		{"keeps the caller's order", []string{"frozen", "fresh", "waiting", "due", "rerenders"},
			[]string{"fresh", "due", "rerenders"}, []string{"frozen", "waiting"}, ""},
		{"all skipped still lists allowed as an empty array", []string{"frozen"}, []string{}, []string{"frozen"},
			`{"allowed":[],"skipped":[{"provider":"frozen","reason":"`},
		{"no providers", nil, []string{}, []string{}, `{"allowed":[],"skipped":[]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := RouteProviders(now, cfg, tt.providers, lookup)
			var skipped []string
			for _, s := range r.Skipped {
				skipped = append(skipped, s.Provider)
			}
			if !reflect.DeepEqual(r.Allowed, tt.allowed) || strings.Join(skipped, ",") != strings.Join(tt.skipped, ",") {
				t.Fatalf("got allowed %v skipped %v, want %v %v", r.Allowed, skipped, tt.allowed, tt.skipped)
			}
			if tt.json != "" {
				b, _ := json.Marshal(r)
				if !strings.HasPrefix(string(b), tt.json) {
					t.Fatalf("json %s, want prefix %s", b, tt.json)
				}
			}
		})
	}

	r := RouteProviders(now, cfg, []string{"waiting", "frozen", "legacy"}, lookup)
	w, f, l := r.Skipped[0], r.Skipped[1], r.Skipped[2]
	if w.Frozen || w.NextProbeAt == nil || !w.NextProbeAt.Equal(refusalT0.Add(time.Hour)) || !strings.Contains(w.Reason, "Next probe at 2025-10-07T10:00:00.000Z") {
		t.Fatalf("waiting: %+v", w)
	}
	if !f.Frozen || f.NextProbeAt != nil || !strings.Contains(f.Reason, "frozen") {
		t.Fatalf("frozen: %+v", f)
	}
	if !l.Frozen || l.NextProbeAt != nil || !strings.Contains(l.Reason, "without a usable refusal count") {
		t.Fatalf("legacy: %+v", l)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"next_probe_at":"2025-10-07T10:00:00.000Z"`, `"frozen":true`} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("json %s lacks %s", b, want)
		}
	}
	if strings.Count(string(b), "next_probe_at") != 1 {
		t.Fatalf("frozen entries must not carry next_probe_at: %s", b)
	}
}
