package simulatecmd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// simulateInput is a small scenario: a 429 with Retry-After, a 503 backing
// off, a bad line, a tick and a sync.
const simulateInput = `{"type":"outcome","id":"o1","at":"2025-03-01T12:00:00Z","agent":"a1","provider":"openai","profile":"p1","model":"gpt","turn":1,"step":1,"status":429,"headers":{"retry-after":"2"}}
{"type":"outcome","id":"o2","at":1740830401000,"agent":"a1","provider":"openai","profile":"p1","model":"gpt","turn":1,"step":2,"status":503}

not json
{"type":"tick","at":"2025-03-01T12:01:00Z"}
{"type":"sync","id":"done"}`

func runSimulateLines(t *testing.T, args []string, input string) (code int, lines []map[string]any, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, strings.NewReader(input), &out, &errb)
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("output line is not JSON: %q", l)
		}
		lines = append(lines, m)
	}
	return code, lines, errb.String()
}

func TestSimulateCommand(t *testing.T) {
	t.Parallel()
	code, lines, stderr := runSimulateLines(t, nil, simulateInput)
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	var types []string
	for _, l := range lines {
		types = append(types, l["type"].(string))
	}
	want := "classification decision classification decision error retry_due retry_due sync"
	if got := strings.Join(types, " "); got != want {
		t.Fatalf("types %q, want %q", got, want)
	}
	if d := lines[1]; d["action"] != "retry" || d["delay_ms"] != 2000.0 || d["due_at"] != "2025-03-01T12:00:02.000Z" {
		t.Errorf("429 decision %v", d)
	}
	if e := lines[4]; e["line"] != 4.0 || !strings.Contains(e["error"].(string), "not a JSON object") {
		t.Errorf("error record %v, want line 4", e)
	}
	if s := lines[7]; s["id"] != "done" {
		t.Errorf("sync %v", s)
	}
}

func TestSimulateSeedAndPolicy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("retry:\n  providers:\n    openai: {max_retries: 0}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, a, _ := runSimulateLines(t, []string{"--seed", "5"}, simulateInput)
	_, b, _ := runSimulateLines(t, []string{"--seed=5"}, simulateInput)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Error("the same seed gave different output")
	}
	code, lines, stderr := runSimulateLines(t, []string{"--policy", pol}, simulateInput)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if d := lines[1]; d["action"] != "give_up" || !strings.Contains(d["reason"].(string), "0 of 0") {
		t.Errorf("policy not applied: %v", d)
	}
}

func TestSimulateUnusableArguments(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("retry:\n  retryable_add: [foo]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"unknown class in the policy", []string{"--policy", bad}, 2, `retry.retryable_add: "foo" is not a class`},
		{"missing policy file", []string{"--policy", filepath.Join(dir, "nope.yaml")}, 2, "nope.yaml"},
		{"unknown flag", []string{"--speed", "2"}, 2, "flag provided but not defined"},
		{"stray argument", []string{"input.jsonl"}, 2, `unexpected argument "input.jsonl"`},
		{"bad seed", []string{"--seed", "-1"}, 2, "invalid value"},
		{"help", []string{"-h"}, 0, "Usage: failbus simulate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			code := run(tt.args, strings.NewReader(simulateInput), &out, &errb)
			if code != tt.code || !strings.Contains(errb.String(), tt.stderr) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errb.String(), tt.code, tt.stderr)
			}
			if tt.code != 0 && out.Len() != 0 {
				t.Errorf("wrote output despite unusable arguments: %s", out.String())
			}
		})
	}
}

// TestSimulateFlushesPerLine drives the command through pipes one line at a
// time: the answer to each line must arrive before the next line is written.
func TestSimulateFlushesPerLine(t *testing.T) {
	t.Parallel()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := run(nil, inR, outW, io.Discard)
		outW.Close()
		done <- code
	}()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("output closed early")
			}
			return l
		case <-time.After(30 * time.Second):
			t.Fatal("no output for a line within 30s: not flushed per line")
		}
		return ""
	}
	for i, id := range []string{"1", "2", "3"} {
		if _, err := io.WriteString(inW, `{"type":"sync","id":`+id+"}\n"); err != nil {
			t.Fatal(err)
		}
		if got, want := next(), `{"type":"sync","id":`+id+`}`; got != want {
			t.Fatalf("answer %d: %s, want %s", i, got, want)
		}
	}
	if _, err := io.WriteString(inW, `{"type":"tick","at":"2025-03-01T12:00:00Z"}`+"\n"+`{"type":"sync","id":"last"}`); err != nil {
		t.Fatal(err)
	}
	inW.Close()
	if got := next(); got != `{"type":"sync","id":"last"}` {
		t.Fatalf("last line without a newline: %s", got)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("did not exit at end of input")
	}
}

// Retry episodes through failbus simulate: twelve 503s of an agent without turn
// and step, spread over two days, were retries 1-10 and then "retry budget
// exhausted". Each now begins its own retry episode (the idle gap), and a
// 503 after a success of the same model does too.
func TestSimulateRetryEpisodesWithoutTurnAndStep(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 3, 1, 8, 0, 0, 0, time.UTC)
	var in strings.Builder
	for i := range 12 {
		at := t0.Add(time.Duration(i) * 4 * time.Hour).Format(time.RFC3339)
		in.WriteString(`{"type":"outcome","id":"o` + strconv.Itoa(i) + `","at":"` + at + `","agent":"bot3","provider":"openai","model":"gpt","status":503}` + "\n")
	}
	// Then a 503, its retry going through 5 s later, and another 503.
	late := t0.Add(50 * time.Hour)
	in.WriteString(`{"type":"outcome","id":"x1","at":"` + late.Format(time.RFC3339) + `","agent":"bot3","provider":"openai","model":"gpt","status":503}` + "\n")
	in.WriteString(`{"type":"outcome","id":"x2","at":"` + late.Add(5*time.Second).Format(time.RFC3339) + `","agent":"bot3","provider":"openai","model":"gpt","ok":true,"status":200}` + "\n")
	in.WriteString(`{"type":"outcome","id":"x3","at":"` + late.Add(6*time.Second).Format(time.RFC3339) + `","agent":"bot3","provider":"openai","model":"gpt","status":503}` + "\n")
	code, lines, stderr := runSimulateLines(t, nil, in.String())
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got []string
	for _, l := range lines {
		if l["type"] != "decision" {
			continue
		}
		got = append(got, l["outcome_id"].(string)+":"+l["action"].(string)+":"+strconv.Itoa(int(l["retry"].(float64))))
		if l["outcome_id"] != "o0" && l["outcome_id"] != "x1" && !strings.Contains(l["reason"].(string), "new retry episode") {
			t.Errorf("%s: reason %q does not say a new retry episode began", l["outcome_id"], l["reason"])
		}
	}
	var want []string
	for i := range 12 {
		want = append(want, "o"+strconv.Itoa(i)+":retry:1")
	}
	want = append(want, "x1:retry:1", "x3:retry:1")
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("decisions\n%s\nwant\n%s", strings.Join(got, " "), strings.Join(want, " "))
	}
}

// A rate limit's end through failbus simulate: two 429s at 10:00 on two profiles make
// openai rate-limited on every profile (health degraded); a day later a 503
// on a never-seen profile is no longer told to wait for that cooldown, and
// the health record says the rate limit is over.
func TestSimulateRateLimitOnEveryProfileEnds(t *testing.T) {
	t.Parallel()
	in := `{"type":"outcome","id":"r1","at":"2025-03-01T10:00:00Z","agent":"a1","provider":"openai","profile":"p1","model":"gpt","status":429}
{"type":"outcome","id":"r2","at":"2025-03-01T10:00:01Z","agent":"a1","provider":"openai","profile":"p2","model":"gpt","status":429}
{"type":"outcome","id":"s1","at":"2025-03-02T10:00:00Z","agent":"a1","provider":"openai","profile":"p3","model":"gpt","status":503}
`
	code, lines, stderr := runSimulateLines(t, nil, in)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var health []string
	for _, l := range lines {
		switch l["type"] {
		case "health":
			health = append(health, l["state"].(string))
		case "decision":
			if l["outcome_id"] == "s1" && strings.Contains(l["reason"].(string), "rate-limited") {
				t.Errorf("the 503 a day later: reason %q still waits for the rate limit", l["reason"])
			}
		}
	}
	if strings.Join(health, " ") != "degraded healthy" {
		t.Fatalf("health %v, want degraded (both profiles 429) then healthy (the day after)", health)
	}
}
