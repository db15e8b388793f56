package classifycmd

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestClassifyEval: --eval prints accuracy overall, leave one provider
// out, per class and per provider, and the misses; --json gives the same
// as one object; a row it cannot use is exit 2 naming the line.
func TestClassifyEval(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.jsonl")
	classifyWriteFile(t, good, strings.Join([]string{
		`{"id":"1","agent":"a","provider":"siliconflow","status":400,"body":"{\"code\":20012,\"message\":\"no\",\"data\":null}","expect_class":"model_not_found","source":"https://example.com/1"}`,
		`{"id":"2","agent":"a","provider":"my-gateway","status":400,"expect_class":"server_error"}`,
		`{"id":"3","agent":"a","provider":"my-gateway","status":429,"body":"{\"error\":{\"message\":\"rate limit exceeded\"}}","expect_class":"auth"}`,
	}, "\n"))
	var out, errb bytes.Buffer
	if code := run([]string{"--eval", good}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	text := out.String()
	for _, want := range []string{
		"3 rows from " + good,
		"overall                    66.67%  2/3",
		"leave-one-provider-out     33.33%  1/3",
		"per expected class",
		"per provider",
		"siliconflow",
		"good.jsonl:3 3 my-gateway: rate_limit by",
		"good.jsonl:1 1 siliconflow (leave-one-provider-out)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}

	out.Reset()
	if code := run([]string{"--eval", good, "--json", "--misses", "1"}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errb.String())
	}
	var rep struct {
		Type    string
		Overall struct{ Rows, Correct int }
		LOPO    struct{ Rows, Correct int }
		ByClass map[string]struct{ Rows, Correct int } `json:"by_class"`
		Misses  []struct{ ID string }
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if rep.Type != "eval" || rep.Overall.Rows != 3 || rep.Overall.Correct != 2 || rep.LOPO.Correct != 1 ||
		rep.ByClass["auth"].Rows != 1 || len(rep.Misses) != 1 {
		t.Fatalf("json %+v", rep)
	}

	bad := filepath.Join(dir, "bad.jsonl")
	classifyWriteFile(t, bad, `{"id":"1","agent":"a","provider":"p","status":500}`+"\n")
	errb.Reset()
	if code := run([]string{"--eval", bad}, strings.NewReader(""), &out, &errb); code != 2 || !strings.Contains(errb.String(), "bad.jsonl:1: no expect_class") {
		t.Fatalf("bad row: exit %d, stderr %q", code, errb.String())
	}
	if code := run([]string{"--eval", filepath.Join(dir, "missing.jsonl")}, strings.NewReader(""), &out, &errb); code != 2 {
		t.Fatalf("missing file: exit %d, want 2", code)
	}
	if code := run([]string{"--eval", good, "--explain"}, strings.NewReader(""), &out, &errb); code != 2 {
		t.Fatalf("--eval with --explain: exit %d, want 2", code)
	}
}

// TestClassifyEvalCorpus: the command's figures on the repository's corpus
// stay at or above the acceptance bars (98% overall, 95% leaving each
// provider's code tables out).
func TestClassifyEvalCorpus(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../../internal/policy/classify/testdata/*.jsonl")
	if err != nil || len(files) < 2 {
		t.Fatalf("corpus files %v: %v", files, err)
	}
	var out, errb bytes.Buffer
	if code := run(append([]string{"--json", "--eval"}, files...), strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Overall struct{ Rows, Correct int }
		LOPO    struct{ Rows, Correct int }
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Overall.Rows < 400 || float64(rep.Overall.Correct) < 0.98*float64(rep.Overall.Rows) ||
		float64(rep.LOPO.Correct) < 0.95*float64(rep.LOPO.Rows) {
		t.Fatalf("overall %+v, leave-one-provider-out %+v: below the bars", rep.Overall, rep.LOPO)
	}
}
