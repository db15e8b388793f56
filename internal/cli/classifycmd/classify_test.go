package classifycmd

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const classifyCorpus = "../../../internal/policy/classify/testdata/corpus.jsonl"

// TestClassifyCorpus is the classifier's acceptance check: `failbus classify` on
// the corpus puts every row in its expected class, with a rule id and
// evidence.
func TestClassifyCorpus(t *testing.T) {
	t.Parallel()
	in, err := os.ReadFile(classifyCorpus)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(nil, bytes.NewReader(in), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	want := classifyNonEmptyLines(string(in))
	got := classifyNonEmptyLines(out.String())
	if len(got) != len(want) || len(want) < 80 {
		t.Fatalf("%d output lines for %d input lines", len(got), len(want))
	}
	for i := range want {
		var row struct {
			ID       string `json:"id"`
			Class    string `json:"expect_class"`
			Overrule string `json:"expect_overruled"`
		}
		var rec struct {
			Type      string   `json:"type"`
			OutcomeID string   `json:"outcome_id"`
			Class     string   `json:"class"`
			Rule      string   `json:"rule"`
			Evidence  []string `json:"evidence"`
			Overruled string   `json:"overruled"`
		}
		if err := json.Unmarshal([]byte(want[i]), &row); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(got[i]), &rec); err != nil {
			t.Fatalf("line %d: %v: %s", i+1, err, got[i])
		}
		if rec.Type != "classification" || rec.OutcomeID != row.ID || rec.Class != row.Class || rec.Overruled != row.Overrule ||
			rec.Rule == "" || len(rec.Evidence) == 0 {
			t.Errorf("line %d: %s\nwant class %q overruled %q for outcome %s", i+1, got[i], row.Class, row.Overrule, row.ID)
		}
	}
}

func TestClassifyLines(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	goodPolicy := filepath.Join(dir, "policy.yaml")
	classifyWriteFile(t, goodPolicy, `
retry:
  max_retries: 3
classify:
  rules:
    - id: my-gateway.upstream_busy
      class: overloaded
      providers: [my-gateway]
      body: ["upstream busy"]
`)
	badClass := filepath.Join(dir, "bad-class.yaml")
	classifyWriteFile(t, badClass, "classify:\n  rules:\n    - id: x.y\n      class: overflow\n      status: [400]\n")
	badKey := filepath.Join(dir, "bad-key.yaml")
	classifyWriteFile(t, badKey, "classify:\n  rulez: []\n")

	tests := []struct {
		name      string
		args      []string
		input     string
		code      int
		want      []string // substrings of the output lines, in order
		stderrHas string
	}{
		{
			name:  "classifies outcomes, epoch-ms and RFC 3339 times, and reports bad lines without stopping",
			input: "{\"id\":\"a\",\"agent\":\"x\",\"provider\":\"openai\",\"status\":429,\"at\":1772446500120}\n\nnot json\n{\"id\":\"b\",\"agent\":\"x\"}\n{\"id\":\"c\",\"agent\":\"x\",\"provider\":\"cerebras\",\"status\":413,\"at\":\"2026-03-02T10:15:00Z\",\"request_tokens\":130900,\"context_window\":131000}",
			want: []string{
				`{"type":"classification","outcome_id":"a","at":"2026-03-02T10:15:00.120Z"`,
				`{"type":"error","line":3,"error":`,
				`{"type":"error","line":4,"error":"outcome: field \"provider\"`,
				`"class":"context_overflow"`,
			},
		},
		{
			name:  "--policy adds user rules before the built-ins",
			args:  []string{"--policy", goodPolicy},
			input: `{"id":"d","agent":"x","provider":"my-gateway","status":400,"body":"{\"error\":\"upstream busy\"}"}`,
			want:  []string{`"class":"overloaded","retryable":true,"scope":"provider","rule":"my-gateway.upstream_busy"`},
		},
		{name: "an unknown class in a rule is exit 2 naming the rule", args: []string{"--policy", badClass}, code: 2,
			stderrHas: `classify.rules[0] (id "x.y"): class: "overflow"`},
		{name: "an unknown key in classify is exit 2 naming it", args: []string{"--policy", badKey}, code: 2, stderrHas: "rulez"},
		{name: "a missing policy file is exit 2", args: []string{"--policy", filepath.Join(dir, "none.yaml")}, code: 2, stderrHas: "none.yaml"},
		{name: "a stray argument is exit 2", args: []string{"extra"}, code: 2, stderrHas: `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			code := run(tt.args, strings.NewReader(tt.input), &out, &errb)
			if code != tt.code {
				t.Fatalf("exit %d, want %d; stderr %s", code, tt.code, errb.String())
			}
			if !strings.Contains(errb.String(), tt.stderrHas) {
				t.Fatalf("stderr %q lacks %q", errb.String(), tt.stderrHas)
			}
			lines := classifyNonEmptyLines(out.String())
			if len(lines) != len(tt.want) {
				t.Fatalf("%d lines, want %d:\n%s", len(lines), len(tt.want), out.String())
			}
			for i, w := range tt.want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("line %d %s\nlacks %s", i+1, lines[i], w)
				}
			}
		})
	}
}

// TestClassifyFlushesEachLine drives the command line by line through a
// pipe: each answer must arrive before the next outcome is written.
func TestClassifyFlushesEachLine(t *testing.T) {
	t.Parallel()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- run(nil, inR, outW, io.Discard)
		outW.Close()
	}()
	answers := bufio.NewReader(outR)
	for i, status := range []string{"429", "529", "401"} {
		if _, err := io.WriteString(inW, `{"id":"o`+status+`","agent":"a","provider":"anthropic","status":`+status+"}\n"); err != nil {
			t.Fatal(err)
		}
		line, err := answers.ReadString('\n') // blocks until this line's answer is flushed
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if !strings.Contains(line, `"outcome_id":"o`+status+`"`) {
			t.Fatalf("answer %d: %s", i, line)
		}
	}
	inW.Close()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func classifyNonEmptyLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}

func classifyWriteFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestClassifyExplain: --explain groups the weakly explained outcomes by
// signature, largest first; --json gives the same as one object.
func TestClassifyExplain(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"id":"1","agent":"a","provider":"gw-a","status":400,"body":"{\"error\":{\"message\":\"Widget 7 is frobnicated\"}}"}`,
		`{"id":"2","agent":"a","provider":"gw-b","status":400,"body":"{\"error\":{\"message\":\"Widget 12 is frobnicated\"}}"}`,
		`not an outcome`,
		`{"id":"3","agent":"a","provider":"openai","status":429,"body":"{\"error\":{\"code\":\"rate_limit_exceeded\"}}"}`,
		`{"id":"4","agent":"a","provider":"gw-a","status":418,"body":"teapot"}`,
	}, "\n")
	var out, errb bytes.Buffer
	if code := run([]string{"--explain"}, strings.NewReader(in), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := classifyNonEmptyLines(out.String())
	if !strings.HasPrefix(lines[0], "4 outcomes: 1 decided by a specific rule, 3 weakly explained") || !strings.Contains(lines[0], "2 signatures; 1 line skipped") {
		t.Fatalf("summary %q", lines[0])
	}
	if len(lines) != 5 || !strings.HasPrefix(lines[2], "COUNT") {
		t.Fatalf("table:\n%s", out.String())
	}
	if f := strings.Fields(lines[3]); f[0] != "2" || f[1] != "bad_request" || f[2] != "status.4xx" || f[3] != "gw-a,gw-b" || f[4] != "1" ||
		!strings.Contains(lines[3], "status 400 | widget N is frobnicated") {
		t.Fatalf("top group %q", lines[3])
	}

	out.Reset()
	if code := run([]string{"--explain", "--json"}, strings.NewReader(in), &out, &errb); code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errb.String())
	}
	var rep struct {
		Type                 string
		Total, Weak, Skipped int
		Groups               []struct {
			Signature string
			Count     int
			Providers []string
		}
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if rep.Type != "explain" || rep.Total != 4 || rep.Weak != 3 || rep.Skipped != 1 || len(rep.Groups) != 2 || rep.Groups[0].Count != 2 {
		t.Fatalf("json %+v", rep)
	}
	if code := run([]string{"--json"}, strings.NewReader(in), &out, &errb); code != 2 {
		t.Fatalf("--json without --explain: exit %d, want 2", code)
	}
}
