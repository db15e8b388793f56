package sim

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/pkg/policy"
)

func TestSimNotificationBudget(t *testing.T) {
	t.Parallel()
	h := newSimHarness(t, "notify: {daily_budget: 1}", 1)
	auth := func(id string, d time.Duration, profile string) string {
		return simOutcome(id, d, "openai", profile, "gpt", 1, 1, `"status":401,"body":"{\"error\":{\"message\":\"Incorrect API key provided\"}}"`)
	}
	net := func(id string, d time.Duration) string {
		return simOutcome(id, d, "gw", "k", "m", 1, 1, `"transport_error":"fetch failed"`)
	}
	steps := []struct{ line, want string }{
		{auth("a1", 0, "p1"), "class:auth decision:give_up notify:normal"},
		{auth("a2", time.Second, "p1"), "class:auth decision:give_up"},                 // same episode: deduplicated
		{auth("a3", 2*time.Second, "p2"), "class:auth decision:give_up notify:normal"}, // budget of 1 spent today: held, and the day's digest says so
		{net("n1", 3*time.Second), "class:transport decision:retry"},
		{net("n2", 4*time.Second), "class:transport decision:retry"},
		{net("n3", 5*time.Second), "class:transport health:outage decision:wait_provider notify:critical"}, // critical despite the budget
		{auth("a4", 24*time.Hour, "p3"), "class:auth decision:give_up notify:normal"},                      // a new UTC day
	}
	dueOrDelay := regexp.MustCompile(`due#\S+ |#\d+/\d+ms`)
	for i, s := range steps {
		recs := h.feed(s.line)
		got := dueOrDelay.ReplaceAllString(simSummary(recs), "")
		if got != s.want {
			t.Errorf("step %d:\n got %s\nwant %s", i+1, got, s.want)
		}
		if i == 2 {
			// The held request itself is not sent; the notifier's digest
			// for the day is, once, saying one was held back.
			n := recs[len(recs)-1]
			if !strings.HasPrefix(n.str("dedupe_key"), notification.DigestKeyPrefix+"2025-03-01") || !strings.Contains(n.str("text"), "1 non-critical notification has been held back") {
				t.Errorf("step 3 sent %v, want the day's digest counting one held request", n)
			}
		}
	}
}

func TestSimRefusalsAndRoutes(t *testing.T) {
	t.Parallel()
	h := newSimHarness(t, "", 1)
	refusal := simOutcome("r1", 0, "anthropic", "p1", "claude", 1, 1, `"ok":true,"status":200,"stop_reason":"refusal","refusal_scope":"history"`)
	got := h.feed(refusal)
	if s := simSummary(got); s != "class:content_refusal decision:skip_provider notify:normal" {
		t.Fatalf("refusal: %s", s)
	}
	// Take openai down.
	for i, p := range []string{"main", "main", "main"} {
		h.feed(simOutcome(fmt.Sprintf("n%d", i), time.Duration(i+1)*time.Second, "openai", p, "gpt", 1, 1, `"transport_error":"fetch failed"`))
	}
	route := h.feed(`{"type":"route","at":"` + simAt(time.Minute) + `","agent":"a1","session":"s1","segment":1,"providers":["anthropic","openai","google"]}`)
	if n := len(route); n > 0 && route[0].str("type") == OutputRetryDue {
		route = route[n-1:] // the retry of n0 came due first
	}
	if len(route) != 1 || route[0].str("type") != OutputRoute {
		t.Fatalf("route: %v", route)
	}
	r := route[0]
	b, _ := json.Marshal(r["allowed"])
	if string(b) != `["google"]` {
		t.Errorf("allowed %s, want only google", b)
	}
	skipped, _ := r["skipped"].([]any)
	if len(skipped) != 2 {
		t.Fatalf("skipped %v", r["skipped"])
	}
	first, _ := skipped[0].(map[string]any)
	second, _ := skipped[1].(map[string]any)
	if first["provider"] != "anthropic" || first["next_probe_at"] != "2025-03-01T12:15:00.000Z" {
		t.Errorf("refusal skip %v", first)
	}
	if second["provider"] != "openai" || !strings.Contains(fmt.Sprint(second["reason"]), "provider outage") {
		t.Errorf("outage skip %v", second)
	}
	if r.str("at") != "2025-03-01T12:01:00.000Z" || r.str("agent") != "a1" || r.str("session") != "s1" || r.num("segment") != 1 {
		t.Errorf("route identity %v", r)
	}
	// A boundary starts a new segment: anthropic is allowed again there.
	if out := h.feed(`{"type":"boundary","at":"` + simAt(2*time.Minute) + `","agent":"a1","session":"s1","segment":2,"reason":"compaction"}`); simSummary(out) != "" {
		t.Errorf("boundary output %v", out) // (probes of the openai outage aside)
	}
	route = h.feed(`{"type":"route","at":"` + simAt(2*time.Minute) + `","agent":"a1","session":"s1","segment":2,"providers":["anthropic"]}`)
	if b, _ := json.Marshal(route[0]["allowed"]); string(b) != `["anthropic"]` {
		t.Errorf("after the boundary allowed %s", b)
	}
}

func TestSimDeterministic(t *testing.T) {
	t.Parallel()
	lines := []string{
		simOutcome("o1", 0, "openai", "p1", "gpt", 1, 1, `"status":503`),
		simOutcome("o2", time.Second, "openai", "p1", "gpt", 1, 2, `"status":502`),
		simOutcome("o3", 2*time.Second, "openai", "p1", "gpt", 1, 3, `"transport_error":"ECONNRESET"`),
		simTick(time.Hour),
	}
	render := func(seed uint64) string {
		h := newSimHarness(t, "", seed)
		for _, l := range lines {
			h.feed(l)
		}
		b, _ := json.Marshal(h.out)
		return string(b)
	}
	if a, b := render(7), render(7); a != b {
		t.Error("same seed, different output")
	}
	if render(7) == render(8) {
		t.Error("different seeds, same jitter")
	}
}

func TestSimErrorsAndSync(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line string
		want string // substring of the error; "" = no error
	}{
		{"not JSON", "{oops", "not a JSON object"},
		{"unknown type", `{"type":"nap","at":"2025-03-01T12:00:00Z"}`, `unknown type "nap"`},
		{"tick without at", `{"type":"tick"}`, `tick: "at" is required`},
		{"outcome before any time", `{"id":"x","agent":"a","provider":"p","status":500}`, `"at" is required`},
		{"outcome without agent", `{"id":"x","at":"2025-03-01T12:00:00Z","provider":"p","status":500}`, `field "agent"`},
		{"bad time", `{"id":"x","at":"yesterday","agent":"a","provider":"p"}`, `at`},
		{"wrong field type", `{"id":"x","at":"2025-03-01T12:00:00Z","agent":"a","provider":"p","status":"500"}`, `status`},
		{"boundary without session", `{"type":"boundary","at":"2025-03-01T12:00:00Z","agent":"a"}`, `session`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newSimHarness(t, "", 1)
			h.line = 41
			out := h.feed(tt.line)
			if len(out) != 1 || out[0].str("type") != OutputError {
				t.Fatalf("output %v, want one error record", out)
			}
			if out[0].num("line") != 42 || !strings.Contains(out[0].str("error"), tt.want) {
				t.Errorf("error record %v, want line 42 and %q", out[0], tt.want)
			}
			// Processing goes on.
			if got := h.feed(`{"type":"sync","id":"after"}`); len(got) != 1 || got[0].str("id") != "after" {
				t.Errorf("sync after an error: %v", got)
			}
		})
	}
	h := newSimHarness(t, "", 1)
	line := simOutcome("dup", 0, "openai", "p1", "gpt", 1, 1, `"status":500`)
	h.feed(line)
	if out := h.feed(line); len(out) != 1 || !strings.Contains(out[0].str("error"), "duplicate id") {
		t.Errorf("duplicate outcome: %v", out)
	}
	for _, id := range []string{`7`, `"s"`, `{"k":[1,2]}`, `null`} {
		out := h.feed(`{"type":"sync","id":` + id + `}`)
		b, _ := json.Marshal(out[0]["id"])
		if len(out) != 1 || out[0].str("type") != OutputSync || string(b) != id {
			t.Errorf("sync %s echoed %v", id, out)
		}
	}
}

func TestSimClockNeverRunsBackwards(t *testing.T) {
	t.Parallel()
	h := newSimHarness(t, "retry: {jitter_ratio: 0}", 1)
	h.feed(simTick(time.Minute))
	got := h.feed(simOutcome("late", 0, "openai", "p1", "gpt", 1, 1, `"status":500`))
	if got[0].str("at") != "2025-03-01T12:00:00.000Z" {
		t.Errorf("classification keeps the outcome's own at, got %q", got[0].str("at"))
	}
	if d := got[1]; d.str("at") != "2025-03-01T12:01:00.000Z" || d.str("due_at") != "2025-03-01T12:01:01.000Z" {
		t.Errorf("late outcome decided at %q due %q, want at the clock", d.str("at"), d.str("due_at"))
	}
	if !h.sim.Now().Equal(coreT0.Add(time.Minute)) {
		t.Errorf("clock %s", h.sim.Now())
	}
	// An outcome without at is stamped with the clock.
	if got := h.feed(`{"id":"noat","agent":"a1","provider":"openai","status":500}`); got[0].str("at") != "2025-03-01T12:01:00.000Z" {
		t.Errorf("outcome without at: %v", got[0])
	}
	if p := h.sim.Pending(); len(p) != 2 || p[0].OutcomeID != "late" {
		t.Errorf("pending %+v", p)
	}
}

// TestSimOutputShape checks every record of a mixed run against the
// contract: a known type first, and `at` with milliseconds on every timed
// record.
func TestSimOutputShape(t *testing.T) {
	t.Parallel()
	h := newSimHarness(t, "", 3)
	lines := []string{
		simOutcome("o1", 0, "openai", "main", "gpt", 1, 1, `"status":429,"headers":{"retry-after":"1"}`),
		simOutcome("o2", time.Second, "openai", "main", "gpt", 1, 2, `"transport_error":"fetch failed"`),
		simOutcome("o3", 2*time.Second, "openai", "main", "gpt", 1, 3, `"transport_error":"fetch failed"`),
		simOutcome("o4", 3*time.Second, "openai", "main", "gpt", 1, 4, `"transport_error":"fetch failed"`),
		simOutcome("o5", 4*time.Second, "anthropic", "p", "claude", 1, 1, `"ok":true,"stop_reason":"refusal","refusal_scope":"increment"`),
		`{"type":"route","at":"` + simAt(5*time.Second) + `","agent":"a1","session":"s1","segment":1,"providers":["openai"]}`,
		simTick(time.Hour),
		`{"type":"sync","id":1}`,
	}
	raw := []string{}
	for _, l := range lines {
		h.line++
		for _, o := range h.sim.StepLine([]byte(l), h.line) {
			b, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			raw = append(raw, string(b))
		}
	}
	ms := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)
	timed := map[string]bool{OutputClassification: true, OutputDecision: true, OutputRetryDue: true, OutputRoute: true, OutputNotification: true, OutputHealth: true}
	seen := map[string]bool{}
	for _, line := range raw {
		if !strings.HasPrefix(line, `{"type":"`) {
			t.Errorf("line does not start with its type: %s", line)
		}
		var r simRec
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		typ := r.str("type")
		seen[typ] = true
		if timed[typ] && !ms.MatchString(r.str("at")) {
			t.Errorf("%s record without an RFC 3339 ms `at`: %s", typ, line)
		}
	}
	for _, typ := range []string{OutputClassification, OutputDecision, OutputRetryDue, OutputRoute, OutputNotification, OutputHealth, OutputSync} {
		if !seen[typ] {
			t.Errorf("no %s record in the run", typ)
		}
	}
}

// coreT0 is the virtual clock's origin in the simulate tests.
var coreT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func coreMustPolicy(t *testing.T, doc string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse(%q): %v", doc, err)
	}
	return p
}
