package shadow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/engine/sim"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

func mustPolicy(t testing.TB, yaml string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// history is a day of mixed traffic: successes, rate limits with and
// without hints, server errors repeated on one budget, an outage's
// transport errors, refusals, a boundary.
func history(t0 time.Time, n int) []sim.Input {
	var out []sim.Input
	for i := range n {
		at := events.At(t0.Add(time.Duration(i) * 7 * time.Second))
		o := &events.Outcome{ID: fmt.Sprintf("o-%d", i), At: at, Agent: fmt.Sprintf("bot-%d", i%3), Provider: []string{"openai", "anthropic", "my-gateway"}[i%3], Profile: "p", Turn: i / 6, Step: 1}
		switch i % 10 {
		case 0, 1, 2, 3:
			o.OK, o.Status = true, 200
		case 4:
			o.Status, o.Headers = 429, map[string]string{"retry-after-ms": "1200"}
		case 5:
			o.Status = 429
		case 6, 7:
			o.Status, o.Body = 500, "upstream error"
		case 8:
			o.Status, o.TransportError = 0, "read tcp: ECONNRESET"
		case 9:
			o.Status, o.StopReason, o.RefusalScope, o.Session, o.Segment = 200, "refusal", "history", "s", i/50
		}
		out = append(out, sim.Input{Type: sim.InputOutcome, At: at, Outcome: o})
		if i%50 == 49 {
			out = append(out, sim.Input{Type: sim.InputBoundary, At: at, Boundary: &events.Boundary{At: at, Agent: "bot-0", Session: "s", Segment: i/50 + 1}})
		}
	}
	return out
}

func replay(t testing.TB, o Options, in []sim.Input) ([]*Diff, Summary) {
	t.Helper()
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var diffs []*Diff
	for _, x := range in {
		if d := s.Step(x); d != nil {
			diffs = append(diffs, d)
		}
	}
	return diffs, s.Summary()
}

func TestShadowOfAnEqualPolicyListsNothing(t *testing.T) {
	base := mustPolicy(t, "retry:\n  max_retries: 10\n  jitter_ratio: 0.5\n")
	same := mustPolicy(t, "retry:\n  jitter_ratio: 0.5\n  max_retries: 10\n")
	diffs, sum := replay(t, Options{Base: base, New: same, Seed: 7}, history(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), 2000))
	if len(diffs) != 0 || sum.Differ != 0 || len(sum.Changes) != 0 {
		t.Fatalf("%d diffs (%v) for an equal policy, first %+v", len(diffs), sum.Changes, diffs[0])
	}
	if sum.Outcomes != 2000 || sum.Boundaries != 40 {
		t.Errorf("summary %+v: want 2000 outcomes and 40 boundaries replayed", sum)
	}
}

// TestShadowMaxRetriesTenToOne: one budget failing again and again; under
// max_retries 1 every retry after the first gives up.
func TestShadowMaxRetriesTenToOne(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var in []sim.Input
	for i := range 6 { // six failures of turn 3, step 1: retries 1..6 under the base
		at := events.At(t0.Add(time.Duration(i) * time.Minute))
		in = append(in, sim.Input{Type: sim.InputOutcome, At: at, Outcome: &events.Outcome{ID: fmt.Sprintf("f-%d", i), At: at, Agent: "bot", Provider: "openai", Status: 500, Turn: 3, Step: 1}})
	}
	ok := events.At(t0.Add(time.Hour))
	in = append(in, sim.Input{Type: sim.InputOutcome, At: ok, Outcome: &events.Outcome{ID: "fine", At: ok, Agent: "bot", Provider: "openai", OK: true, Status: 200}})
	// Another budget's first failure after the decisions diverged: decided
	// alike under both (same retry, same jittered delay).
	other := events.At(t0.Add(2 * time.Hour))
	in = append(in, sim.Input{Type: sim.InputOutcome, At: other, Outcome: &events.Outcome{ID: "other", At: other, Agent: "bot", Provider: "openai", Status: 500, Turn: 4, Step: 1}})
	diffs, sum := replay(t, Options{Base: mustPolicy(t, "retry:\n  max_retries: 10\n  jitter_ratio: 0.5\n"), New: mustPolicy(t, "retry:\n  max_retries: 1\n  jitter_ratio: 0.5\n")}, in)
	if len(diffs) != 5 {
		t.Fatalf("%d diffs, want the 5 retries after the first", len(diffs))
	}
	for i, d := range diffs {
		if d.Base == nil || d.Base.Action != events.ActionRetry || d.Base.Retry != i+2 || d.New == nil || d.New.Action != events.ActionGiveUp {
			t.Errorf("diff %d: base %+v new %+v; want retry %d → give_up", i, d.Base, d.New, i+2)
		}
		if d.OutcomeID != fmt.Sprintf("f-%d", i+1) || d.Class != events.ClassServerError || d.Provider != "openai" || d.Agent != "bot" {
			t.Errorf("diff %d: %+v", i, d)
		}
	}
	if sum.Outcomes != 8 || sum.Differ != 5 || len(sum.Changes) != 1 || sum.Changes["retry→give_up"] != 5 {
		t.Errorf("summary %+v", sum)
	}
}

// TestShadowCommandOnJSONLines: the command over simulate-format input,
// an error record for a bad line, the summary last.
func TestShadowCommandOnJSONLines(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := write("base.yaml", "retry:\n  max_retries: 10\n")
	next := write("new.yaml", "retry:\n  max_retries: 1\n")
	var lines bytes.Buffer
	for i := range 3 {
		fmt.Fprintf(&lines, `{"type":"outcome","id":"f-%d","at":"2026-03-01T00:0%d:00Z","agent":"bot","provider":"openai","status":500,"turn":1,"step":1}`+"\n", i, i)
	}
	lines.WriteString("not json\n")
	lines.WriteString(`{"type":"tick","at":"2026-03-01T01:00:00Z"}` + "\n")
	var stdout, stderr bytes.Buffer
	code := run([]string{"--base", base, "--policy", next, "--input", "-"}, &lines, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(out) != 4 {
		t.Fatalf("%d lines, want 2 diffs, 1 error, the summary:\n%s", len(out), stdout.String())
	}
	var sum Summary
	if err := json.Unmarshal([]byte(out[3]), &sum); err != nil || sum.Type != "summary" || sum.Outcomes != 3 || sum.Differ != 2 ||
		sum.Changes["retry→give_up"] != 2 || sum.Errors != 1 || sum.Ticks != 1 {
		t.Errorf("summary %s", out[3])
	}
	if !strings.Contains(out[2], `"type":"error","line":4`) {
		t.Errorf("line 3: %s, want the error record of input line 4", out[2])
	}
	for _, bad := range [][]string{
		{"--input", "-"},
		{"--policy", next, "--input", "-", "--since", "1h"},
		{"--policy", next, "--since", "1h", "--start-seq", "3"},
		{"--policy", filepath.Join(dir, "missing.yaml"), "--input", "-"},
	} {
		var o, e bytes.Buffer
		if code := run(bad, strings.NewReader(""), &o, &e); code != 2 {
			t.Errorf("shadow %v: exit %d, want 2 (%s)", bad, code, e.String())
		}
	}
}

// BenchmarkShadow measures the replay alone: one op is one outcome under
// both policies (go test ./internal/cli/shadow -run X -bench Shadow
// -benchtime 100000x -count 5; the figure to quote is outcomes/s).
func BenchmarkShadow(b *testing.B) {
	in := history(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), b.N)
	s, err := New(Options{Base: mustPolicy(b, "retry:\n  max_retries: 10\n"), New: mustPolicy(b, "retry:\n  max_retries: 1\n")})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for _, x := range in {
		s.Step(x)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "outcomes/s")
}

// TestShadowSpeedFromTheBus measures `failbus shadow` over 100k outcomes
// stored on a real bus (FAILBUS_SHADOW_SPEED=1; it prints the figure and
// asserts nothing about time: speed is measured, not asserted).
func TestShadowSpeedFromTheBus(t *testing.T) {
	if os.Getenv("FAILBUS_SHADOW_SPEED") == "" {
		t.Skip("set FAILBUS_SHADOW_SPEED=1 to measure shadow over 100k outcomes on a bus")
	}
	const n = 100_000
	b := bustest.Start(t, 10*time.Minute)
	in := history(time.Now().Add(-24*time.Hour), n)
	pubStart := time.Now()
	for i, x := range in {
		if x.Outcome == nil {
			continue
		}
		if i%2000 == 0 {
			<-b.JS.PublishAsyncComplete() // a window, so the client does not stall
		}
		data, hdr, err := events.Encode(x.Outcome)
		if err != nil {
			t.Fatal(err)
		}
		hdr.Set(events.HeaderMsgID, x.Outcome.ID)
		if _, err := b.JS.PublishMsgAsync(&nats.Msg{Subject: events.OutcomeSubject(x.Outcome.Provider, x.Outcome.Agent), Header: hdr, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	<-b.JS.PublishAsyncComplete()
	t.Logf("published %d outcomes in %s", n, time.Since(pubStart).Round(time.Millisecond))
	dir := t.TempDir()
	base, next := filepath.Join(dir, "base.yaml"), filepath.Join(dir, "new.yaml")
	_ = os.WriteFile(base, []byte("retry:\n  max_retries: 10\n"), 0o644)
	_ = os.WriteFile(next, []byte("retry:\n  max_retries: 1\n"), 0o644)
	var stdout, stderr bytes.Buffer
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	if code := run([]string{"--server", b.Srv.ClientURL(), "--base", base, "--policy", next}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	took := time.Since(start)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var sum Summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil || sum.Outcomes != n {
		t.Fatalf("summary %s", lines[len(lines)-1])
	}
	t.Logf("shadow of %d outcomes from the bus: %s wall (%.0f outcomes/s), %s CPU of this process (server included: it is embedded); %d differ %v",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), cpu.Round(time.Millisecond), sum.Differ, sum.Changes)
}

// TestShadowReplaysRecoveryRecords: simulate-format history with the
// recovery records agents report (heartbeats, crons, writes, tasks: the
// eight-hour outage story) replays without an error, and the
// summary counts what it replayed.
func TestShadowReplaysRecoveryRecords(t *testing.T) {
	path := filepath.Join("..", "..", "..", "internal", "engine", "sim", "testdata", "recovery-8h.jsonl")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(line), &head); err != nil {
			t.Fatal(err)
		}
		want[head.Type]++
	}
	next := filepath.Join(t.TempDir(), "new.yaml")
	if err := os.WriteFile(next, []byte("retry:\n  max_retries: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--policy", next, "--input", path}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var sum Summary
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		t.Fatal(err)
	}
	recovery := want["heartbeat"] + want["cron_spec"] + want["cron_run"] + want["write"] + want["task"]
	if sum.Errors != 0 || sum.Outcomes != want["outcome"] || sum.Ticks != want["tick"] || sum.Recovery != recovery || recovery == 0 {
		t.Errorf("summary %+v; want %d outcomes, %d tick(s), %d recovery records, no error", sum, want["outcome"], want["tick"], recovery)
	}
}
