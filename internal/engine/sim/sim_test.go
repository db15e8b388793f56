package sim

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// simRec is one decoded output line.
type simRec map[string]any

func (r simRec) str(k string) string {
	v, _ := r[k].(string)
	return v
}

func (r simRec) num(k string) int64 {
	v, _ := r[k].(float64)
	return int64(v)
}

// simHarness drives a Sim line by line, as `failbus simulate` does, and
// keeps every output line decoded.
type simHarness struct {
	t    *testing.T
	sim  *Sim
	line int
	out  []simRec
}

func newSimHarness(t *testing.T, policyDoc string, seed uint64) *simHarness {
	t.Helper()
	s, err := New(Config{Policy: coreMustPolicy(t, policyDoc), Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return &simHarness{t: t, sim: s}
}

// feed steps one line and returns its output records.
func (h *simHarness) feed(line string) []simRec {
	h.t.Helper()
	h.line++
	var recs []simRec
	for _, o := range h.sim.StepLine([]byte(line), h.line) {
		b, err := json.Marshal(o)
		if err != nil {
			h.t.Fatalf("line %d: marshal %s: %v", h.line, o.Type, err)
		}
		var r simRec
		if err := json.Unmarshal(b, &r); err != nil {
			h.t.Fatalf("line %d: output is not one JSON object: %s", h.line, b)
		}
		recs = append(recs, r)
	}
	h.out = append(h.out, recs...)
	return recs
}

// at formats the virtual time t0+d as an input `at`.
func simAt(d time.Duration) string { return coreT0.Add(d).Format(time.RFC3339Nano) }

// outcome renders an outcome line; extra is raw JSON fields.
func simOutcome(id string, d time.Duration, provider, profile, model string, turn, step int, extra string) string {
	s := fmt.Sprintf(`{"type":"outcome","id":%q,"at":%q,"agent":"a1","session":"s1","segment":1,"provider":%q,"profile":%q,"model":%q,"turn":%d,"step":%d`,
		id, simAt(d), provider, profile, model, turn, step)
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

func simTick(d time.Duration) string { return fmt.Sprintf(`{"type":"tick","at":%q}`, simAt(d)) }

// summary renders records compactly: type and the fields that matter.
// The recovery stage's records (probes during an outage, the checklist
// after it) are left out: recovery_test.go checks them.
func simSummary(recs []simRec) string {
	var parts []string
	for _, r := range recs {
		switch r.str("type") {
		case OutputDispatch, OutputControl, OutputRecovery:
			continue
		case OutputClassification:
			parts = append(parts, "class:"+r.str("class"))
		case OutputDecision:
			s := "decision:" + r.str("action")
			if r.str("action") == events.ActionRetry {
				s += fmt.Sprintf("#%d/%dms", r.num("retry"), r.num("delay_ms"))
			}
			parts = append(parts, s)
		case OutputRetryDue:
			parts = append(parts, fmt.Sprintf("due#%d@%s", r.num("retry"), r.str("at")))
		case OutputHealth:
			parts = append(parts, "health:"+r.str("state"))
		case OutputNotification:
			parts = append(parts, "notify:"+r.str("severity"))
		default:
			parts = append(parts, r.str("type"))
		}
	}
	return strings.Join(parts, " ")
}

func TestSim429WithRetryAfter(t *testing.T) {
	t.Parallel()
	h := newSimHarness(t, "", 1)
	got := h.feed(simOutcome("o1", 0, "openai", "p1", "gpt", 1, 1, `"status":429,"headers":{"retry-after":"2"},"body":"{\"error\":{\"message\":\"Rate limit reached\"}}"`))
	if s := simSummary(got); s != "class:rate_limit decision:retry#1/2000ms" {
		t.Fatalf("got %s", s)
	}
	d := got[1]
	if d.str("due_at") != "2025-03-01T12:00:02.000Z" || !strings.Contains(d.str("reason"), "retry-after") || d.str("retry_id") == "" {
		t.Errorf("decision %v", d)
	}
	if s := simSummary(h.feed(simTick(1999 * time.Millisecond))); s != "" {
		t.Errorf("came due early: %s", s)
	}
	due := h.feed(simTick(10 * time.Second))
	if s := simSummary(due); s != "due#1@2025-03-01T12:00:02.000Z" {
		t.Fatalf("tick: %s", s)
	}
	if due[0].str("retry_id") != d.str("retry_id") || due[0].str("outcome_id") != "o1" || due[0].str("agent") != "a1" {
		t.Errorf("due %v does not match decision %v", due[0], d)
	}
	if s := simSummary(h.feed(simTick(time.Hour))); s != "" {
		t.Errorf("came due twice: %s", s)
	}
}

func TestSim503BacksOffToItsBudget(t *testing.T) {
	t.Parallel()
	h := newSimHarness(t, "retry: {max_retries: 4, initial_delay: 1s, max_delay: 5s, jitter_ratio: 0}", 1)
	var at time.Duration
	var got []string
	for i := 1; i <= 5; i++ {
		recs := h.feed(simOutcome(fmt.Sprintf("o%d", i), at, "openai", "p1", "gpt", 3, 7, `"status":503,"body":"Service Unavailable"`))
		got = append(got, simSummary(recs))
		if len(recs) > 0 {
			if last := recs[len(recs)-1]; last.str("action") == events.ActionRetry {
				due, _ := time.Parse(time.RFC3339Nano, last.str("due_at"))
				at = due.Sub(coreT0) + 100*time.Millisecond
			}
		}
	}
	want := []string{
		"class:server_error decision:retry#1/1000ms",
		"due#1@2025-03-01T12:00:01.000Z class:server_error decision:retry#2/2000ms",
		"due#2@2025-03-01T12:00:03.100Z class:server_error decision:retry#3/4000ms",
		"due#3@2025-03-01T12:00:07.200Z class:server_error decision:retry#4/5000ms",
		"due#4@2025-03-01T12:00:12.300Z class:server_error decision:give_up",
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("outcome %d:\n got %s\nwant %s", i+1, got[i], want[i])
		}
	}
	if last := h.out[len(h.out)-1]; !strings.Contains(last.str("reason"), "retry budget exhausted: 4 of 4") {
		t.Errorf("give_up reason %q", last.str("reason"))
	}
	// The next step has a budget of its own.
	if s := simSummary(h.feed(simOutcome("o6", 20*time.Second, "openai", "p1", "gpt", 3, 8, `"status":503`))); s != "class:server_error decision:retry#1/1000ms" {
		t.Errorf("next step: %s", s)
	}
}

func TestSimProviderOutageAndRecovery(t *testing.T) {
	t.Parallel()
	h := newSimHarness(t, "retry: {jitter_ratio: 0}", 1)
	net := func(id string, d time.Duration, profile, err string) string {
		return simOutcome(id, d, "openai", profile, "gpt", 1, 1, fmt.Sprintf(`"transport_error":%q`, err))
	}
	okLine := func(id string, d time.Duration) string {
		return simOutcome(id, d, "openai", "main", "gpt", 2, 1, `"ok":true,"status":200`)
	}
	steps := []struct {
		line string
		want string
	}{
		{net("f1", 0, "main", "fetch failed"), "class:transport decision:retry#1/1000ms"},
		{net("f2", 100*time.Millisecond, "backup", "tls: handshake failure"), "class:tls decision:give_up"},
		// The third network failure, every profile failing: outage.
		{net("f3", 200*time.Millisecond, "main", "read tcp: connection reset by peer (ECONNRESET)"), "class:transport health:outage decision:wait_provider notify:critical"},
		// The retry scheduled before the outage still comes due (it was
		// persisted); new failures only wait.
		{net("f4", 2*time.Second, "backup", "fetch failed"), "due#1@2025-03-01T12:00:01.000Z class:transport decision:wait_provider"},
		{simOutcome("f5", 3*time.Second, "openai", "main", "gpt-mini", 1, 2, `"status":400,"body":"{\"error\":{\"message\":\"Unsupported parameter: 'temperature'\",\"code\":\"unsupported_parameter\"}}"`), "class:unsupported_param decision:wait_provider notify:normal"},
		// Recovery: sustained successes over the minimum time.
		{okLine("s1", 10*time.Minute), "class:ok health:degraded"},
		{okLine("s2", 11*time.Minute), "class:ok"},
		{net("f6", 11*time.Minute+time.Second, "main", "fetch failed"), "class:transport health:outage decision:wait_provider"},
		{okLine("s3", 12*time.Minute), "class:ok health:degraded"},
		{okLine("s4", 13*time.Minute), "class:ok"},
		// Recovered: the scope's notification, then the recovery
		// checklist runs (recovery_test.go) and sends its own.
		{okLine("s5", 14*time.Minute), "class:ok health:recovered notify:normal notify:normal"},
		// Healthy again: failures are retried (f1's budget: retry 2).
		{net("f7", 15*time.Minute, "main", "fetch failed"), "class:transport decision:retry#2/2000ms"},
		{simTick(16 * time.Minute), "due#2@2025-03-01T12:15:02.000Z"},
	}
	for i, s := range steps {
		if got := simSummary(h.feed(s.line)); got != s.want {
			t.Errorf("step %d:\n got %s\nwant %s", i+1, got, s.want)
		}
	}
	for _, r := range h.out {
		switch {
		case r.str("action") == events.ActionWaitProvider:
			if r.str("retry_id") != "" || r.num("delay_ms") != 0 || !strings.Contains(r.str("reason"), "every profile (backup, main) fails at the network layer") {
				t.Errorf("wait_provider decision %v", r)
			}
		case r.str("type") == OutputNotification && r.str("severity") == events.SeverityCritical:
			if !strings.HasPrefix(r.str("dedupe_key"), "provider-outage:openai:") || !strings.Contains(r.str("text"), "wait_provider") {
				t.Errorf("outage notification %v", r)
			}
		case r.str("type") == OutputHealth && r.str("state") == events.HealthRecovered:
			if !strings.Contains(r.str("reason"), "3 successes over 2m0s") {
				t.Errorf("recovered reason %q", r.str("reason"))
			}
		}
	}
}

func TestSimRateLimitsAcrossProfiles(t *testing.T) {
	t.Parallel()
	h := newSimHarness(t, "", 1)
	r429 := func(id string, d time.Duration, profile, hint string) string {
		extra := `"status":429`
		if hint != "" {
			extra += `,"headers":{"retry-after":"` + hint + `"}`
		}
		return simOutcome(id, d, "openai", profile, "gpt", 1, 1, extra)
	}
	steps := []struct{ line, want string }{
		{simOutcome("ok2", 0, "openai", "p2", "gpt", 1, 1, `"ok":true,"status":200`), "class:ok"},
		{r429("a", time.Second, "p1", "20"), "class:rate_limit decision:switch_profile"},
		{r429("b", 2*time.Second, "p2", "30"), "class:rate_limit health:degraded decision:retry#1/30000ms"},
		// Provider-wide: no hint of its own → the longest cooldown (p2's, until +32s).
		// (Same agent, turn and step as b: the same budget, so retry 2.)
		{r429("c", 3*time.Second, "p1", ""), "class:rate_limit decision:retry#2/29000ms"},
		{simOutcome("ok1", 40*time.Second, "openai", "p1", "gpt", 2, 1, `"ok":true,"status":200`), "due#1@2025-03-01T12:00:32.000Z due#2@2025-03-01T12:00:32.000Z class:ok health:healthy"},
	}
	for i, s := range steps {
		if got := simSummary(h.feed(s.line)); got != s.want {
			t.Errorf("step %d:\n got %s\nwant %s", i+1, got, s.want)
		}
	}
	if d := h.out[2]; d.str("profile") != "p2" {
		t.Errorf("switch_profile target %q, want p2", d.str("profile"))
	}
}
