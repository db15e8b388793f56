package classify

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/policy/classify/internal/excerpt"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/redact"
)

const corpusPath = "testdata/corpus.jsonl"

// corpusRow is one real provider error response with the class it must get.
type corpusRow struct {
	line     int
	outcome  events.Outcome
	Class    string `json:"expect_class"`
	Overrule string `json:"expect_overruled"`
	HintMS   *int64 `json:"expect_hint_ms"`
	Source   string `json:"source"`
	Note     string `json:"note"`
}

func loadCorpus(tb testing.TB) []corpusRow {
	tb.Helper()
	f, err := os.Open(corpusPath)
	if err != nil {
		tb.Fatalf("open corpus: %v", err)
	}
	defer f.Close()
	var rows []corpusRow
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		r := corpusRow{line: n}
		if err := json.Unmarshal(line, &r); err != nil {
			tb.Fatalf("corpus line %d: %v", n, err)
		}
		if err := events.UnmarshalJSON(line, &r.outcome); err != nil {
			tb.Fatalf("corpus line %d: outcome: %v", n, err)
		}
		if err := r.outcome.Validate(); err != nil {
			tb.Fatalf("corpus line %d: outcome: %v", n, err)
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		tb.Fatalf("read corpus: %v", err)
	}
	return rows
}

// TestCorpus classifies every real error response of the corpus and checks
// class, overrule, retry hint, rule and evidence.
func TestCorpus(t *testing.T) {
	t.Parallel()
	rows := loadCorpus(t)
	if len(rows) < 80 {
		t.Fatalf("corpus has %d rows, want at least 80", len(rows))
	}
	for _, r := range rows {
		name := r.outcome.ID + "_" + r.outcome.Provider + "_" + r.Class
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if r.Source == "" {
				t.Errorf("line %d has no source", r.line)
			}
			c := Classify(&r.outcome)
			if c.Class != r.Class {
				t.Errorf("line %d (%s): class %q (rule %s, evidence %q), want %q", r.line, r.Source, c.Class, c.Rule, c.Evidence, r.Class)
			}
			if c.Overruled != r.Overrule {
				t.Errorf("line %d: overruled %q, want %q (evidence %q)", r.line, c.Overruled, r.Overrule, c.Evidence)
			}
			if r.HintMS != nil {
				if c.Hints == nil || c.Hints.AfterMS != *r.HintMS {
					t.Errorf("line %d: hints %+v, want after_ms %d", r.line, c.Hints, *r.HintMS)
				}
			}
			checkShape(t, &r.outcome, c)
		})
	}
}

// checkShape asserts what holds for every classification.
func checkShape(t *testing.T, o *events.Outcome, c events.Classification) {
	t.Helper()
	info, ok := events.LookupClass(c.Class)
	if !ok {
		t.Fatalf("class %q is not a contract class", c.Class)
	}
	if c.Retryable != info.Retryable || c.Scope != info.Scope {
		t.Errorf("retryable/scope %v/%q, want contract %v/%q", c.Retryable, c.Scope, info.Retryable, info.Scope)
	}
	if c.Rule == "" || len(c.Evidence) == 0 {
		t.Errorf("rule %q evidence %q: both required", c.Rule, c.Evidence)
	}
	if c.Class != events.ClassUnknown && c.Rule == RuleNone {
		t.Errorf("class %q decided by no rule", c.Class)
	}
	for _, e := range c.Evidence {
		if redact.String(e) != e {
			t.Errorf("evidence leaks a secret: %q", e)
		}
		if len(e) > 2*excerpt.Max+64 {
			t.Errorf("evidence too long (%d bytes): %q", len(e), e)
		}
	}
	if c.OutcomeID != o.ID || c.Agent != o.Agent || c.Provider != o.Provider || c.Model != o.Model || !c.At.Equal(o.At.Time) {
		t.Errorf("context fields not copied: %+v", c)
	}
}

// TestCorpusCoverage keeps the corpus honest: every contract class and every
// provider and transport family the classifier must know is represented.
func TestCorpusCoverage(t *testing.T) {
	t.Parallel()
	rows := loadCorpus(t)
	classes := map[string]bool{}
	providers := map[string]bool{}
	var transports []string
	for _, r := range rows {
		classes[r.Class] = true
		providers[r.outcome.Provider] = true
		transports = append(transports, strings.ToLower(r.outcome.TransportError))
	}
	for _, ci := range events.Classes {
		if !classes[ci.Name] {
			t.Errorf("no corpus row for class %q", ci.Name)
		}
	}
	for _, p := range []string{"openai", "azure-openai", "anthropic", "google", "vertex", "bedrock", "mistral", "groq",
		"deepseek", "openrouter", "vllm", "llamacpp", "ollama", "lmstudio", "cerebras", "my-gateway"} {
		if !providers[p] {
			t.Errorf("no corpus row for provider %q", p)
		}
	}
	all := strings.Join(transports, "\n")
	for _, s := range []string{"econnreset", "und_err_socket", "etimedout", "enotfound", "eai_again", "cert_has_expired",
		"x509:", "i/o timeout", "fetch failed", "socket connection was closed", "httpx", "temporary failure in name resolution"} {
		if !strings.Contains(all, s) {
			t.Errorf("no corpus transport error with %q", s)
		}
	}
}
