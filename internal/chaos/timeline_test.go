package chaos_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/chaos"
)

// The sample timeline the docs point at loads, and holds what a drill
// needs: an outage, a rate-limit storm, a capped key and refusals.
func TestSampleTimelineLoads(t *testing.T) {
	t.Parallel()
	tl, err := chaos.Load("../../testdata/chaos/drill.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := map[chaos.Kind]bool{chaos.KindReset: false, chaos.KindRateLimit: false, chaos.KindQuota: false, chaos.KindRefusal: false}
	for _, f := range tl.Faults {
		if _, ok := want[f.Kind]; ok {
			want[f.Kind] = true
		}
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("the sample timeline has no %s window", k)
		}
	}
	outage, ok := tl.Fault("outage")
	if !ok || outage.From != 60*time.Second || outage.To != 150*time.Second {
		t.Errorf("outage = %+v, %v; want 60s to 150s", outage, ok)
	}
	if tl.End() != 300*time.Second {
		t.Errorf("End() = %v; want 5m0s, when the last window closes", tl.End())
	}
	capped, _ := tl.Fault("capped-key")
	if capped.To != chaos.Forever || len(capped.Keys) != 1 || capped.Keys[0] != "sk-capped" || capped.AfterRequests != 40 {
		t.Errorf("capped-key = %+v", capped)
	}
}

func TestParseTimelineDefaults(t *testing.T) {
	t.Parallel()
	tl, err := chaos.ParseTimeline([]byte(`
faults:
  - name: r
    kind: refusal
    marker: [a, b]
  - name: s
    kind: stream_error
    from: 1m
    to: 2m
`))
	if err != nil {
		t.Fatal(err)
	}
	if tl.Answer.Text != chaos.DefaultAnswerText || tl.Answer.Chunks != chaos.DefaultChunks || tl.Scale != 0 {
		t.Errorf("answer defaults: %+v, scale %v", tl.Answer, tl.Scale)
	}
	r, s := tl.Faults[0], tl.Faults[1]
	if r.From != 0 || r.To != chaos.Forever || r.Probability != 1 || r.Shape != chaos.ShapeStop || len(r.Markers) != 2 {
		t.Errorf("refusal defaults: %+v", r)
	}
	if s.AfterChunks != chaos.DefaultAfterChunks || s.From != time.Minute || s.To != 2*time.Minute {
		t.Errorf("stream_error defaults: %+v", s)
	}
	empty, err := chaos.ParseTimeline(nil)
	if err != nil || len(empty.Faults) != 0 || empty.Answer.Text == "" {
		t.Errorf("an empty timeline: %+v, %v; want a healthy provider", empty, err)
	}
}

func TestParseTimelineRejects(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, yaml, want string }{
		{"an unknown key", "faults:\n  - name: a\n    kind: reset\n    form: 1s\n", "field form not found"},
		{"an unknown kind", "faults:\n  - name: a\n    kind: meltdown\n", `kind "meltdown"`},
		{"a window without a name", "faults:\n  - kind: reset\n", "give each window a name"},
		{"two windows of one name", "faults:\n  - {name: a, kind: reset}\n  - {name: a, kind: unavailable}\n", "used twice"},
		{"a window that ends before it starts", "faults:\n  - {name: a, kind: reset, from: 2m, to: 1m}\n", "must be after from"},
		{"a duration without a unit", "faults:\n  - {name: a, kind: reset, from: 60}\n", "time.Duration"},
		{"a probability above 1", "faults:\n  - {name: a, kind: reset, probability: 1.5}\n", "probability 1.5"},
		{"a zero probability", "faults:\n  - {name: a, kind: reset, probability: 0}\n", "probability 0"},
		{"a field of another kind", "faults:\n  - {name: a, kind: unavailable, marker: x}\n", "marker: not a field of kind unavailable"},
		{"a filtered refuse", "faults:\n  - {name: a, kind: refuse, key: sk-a}\n", "use reset for a filtered outage"},
		{"a refuse with a probability", "faults:\n  - {name: a, kind: refuse, probability: 0.5}\n", "takes no"},
		{"a quota without a cap", "faults:\n  - {name: a, kind: quota}\n", "after_requests or after_tokens"},
		{"a refusal without a marker", "faults:\n  - {name: a, kind: refusal}\n", "needs a marker"},
		{"an empty marker", "faults:\n  - {name: a, kind: refusal, marker: ''}\n", "empty marker"},
		{"an unknown refusal shape", "faults:\n  - {name: a, kind: refusal, marker: x, shape: polite}\n", `shape "polite"`},
		{"an overflow without a window", "faults:\n  - {name: a, kind: overflow}\n", "needs above_tokens"},
		{"a slow without a delay or stall", "faults:\n  - {name: a, kind: slow}\n", "delay or a stall"},
		{"an unknown api", "faults:\n  - {name: a, kind: reset, api: gemini}\n", `api "gemini"`},
		{"a negative scale", "scale: -1\n", "must be positive"},
		{"no chunks", "answer: {chunks: -1}\n", "at least 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := chaos.ParseTimeline([]byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v; want one containing %q", err, tt.want)
			}
		})
	}
}

func TestLoadNamesTheFile(t *testing.T) {
	t.Parallel()
	_, err := chaos.Load("no-such-timeline.yaml")
	if err == nil || !strings.Contains(err.Error(), "no-such-timeline.yaml") {
		t.Errorf("error %v; want one naming the file", err)
	}
}

// A timeline built in Go takes the defaults a file would (a zero To is
// the end, a zero probability is 1), and New checks it as a file is
// checked.
func TestNewChecksATimelineBuiltInGo(t *testing.T) {
	t.Parallel()
	tl := &chaos.Timeline{Faults: []chaos.Fault{{Name: "busy", Kind: chaos.KindUnavailable, From: time.Minute}}}
	clock := chaos.NewManualClock(epoch)
	srv, err := chaos.New(tl, chaos.Options{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	clock.Advance(time.Hour)
	r, err := post(http.DefaultClient, srv.OpenAIBaseURL("")+"chat/completions", "sk-a", chat("m", "hi"))
	if err != nil || r.status != http.StatusServiceUnavailable {
		t.Errorf("an hour in: %d, %v; want 503 from a window with no end", r.status, err)
	}
	if tl.Faults[0].To != 0 || tl.Faults[0].Probability != 0 {
		t.Errorf("New changed the caller's timeline: %+v", tl.Faults[0])
	}

	for _, bad := range []chaos.Fault{
		{Name: "x", Kind: chaos.KindRefusal},
		{Name: "x", Kind: chaos.KindRefuse, Keys: []string{"sk-a"}},
		{Name: "", Kind: chaos.KindReset},
		{Name: "x", Kind: "meltdown"},
	} {
		if _, err := chaos.New(&chaos.Timeline{Faults: []chaos.Fault{bad}}, chaos.Options{}); err == nil {
			t.Errorf("New accepted %+v", bad)
		}
	}
}
