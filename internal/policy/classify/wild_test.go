package classify

import (
	"bufio"
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// The wild corpus: real error responses from the providers,
// gateways, agents and client libraries the first corpus covers thinly,
// each with its source. A row may name other acceptable classes, with the
// reason, where the body honestly supports more than one reading.
const wildPath = "testdata/wild.jsonl"

type wildRow struct {
	line      int
	outcome   events.Outcome
	ID        string   `json:"id"`
	Class     string   `json:"expect_class"`
	Accept    []string `json:"accept"`
	AcceptWhy string   `json:"accept_why"`
	HintMS    *int64   `json:"expect_hint_ms"`
	Family    string   `json:"family"`
	Library   string   `json:"library"`
	Source    string   `json:"source"`
	Note      string   `json:"note"`
}

func (r *wildRow) accepts(class string) bool {
	return class == r.Class || slices.Contains(r.Accept, class)
}

func loadWild(tb testing.TB) []wildRow {
	tb.Helper()
	f, err := os.Open(wildPath)
	if err != nil {
		tb.Fatalf("open wild corpus: %v", err)
	}
	defer f.Close()
	var rows []wildRow
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		r := wildRow{line: n}
		if err := json.Unmarshal(line, &r); err != nil {
			tb.Fatalf("wild line %d: %v", n, err)
		}
		if err := events.UnmarshalJSON(line, &r.outcome); err != nil {
			tb.Fatalf("wild line %d: outcome: %v", n, err)
		}
		if err := r.outcome.Validate(); err != nil {
			tb.Fatalf("wild line %d: outcome: %v", n, err)
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		tb.Fatalf("read wild corpus: %v", err)
	}
	return rows
}

// wildFamilies are the families the wild corpus covers; a row may belong to none.
var wildFamilies = []string{
	"200_stop_overflow",   // finish/stop reason says the window was exceeded
	"200_empty",           // a success whose body has no content
	"200_stream_error",    // an error object inside a 200 stream
	"credential_pre_http", // credentials missing before any HTTP exchange
	"quota_wording",       // quota, credit, budget, trial-cap or "usage limit" wording under 400/403/429
	"moderation",          // moderation or safety blocks under 403/429
	"disabled",            // disabled organisations or keys
	"overflow_5xx",        // a provider's overflow message inside a gateway's 5xx
	"capability_404",      // capability gaps (no endpoint supports tools) under 404
	"client_config",       // client-side configuration no retry fixes
}

// TestWildCorpus: every row lands in an accepted class, and the row itself
// is well formed (source, id, accepted classes with a reason).
func TestWildCorpus(t *testing.T) {
	t.Parallel()
	rows := loadWild(t)
	if len(rows) < 250 {
		t.Fatalf("wild corpus has %d rows, want at least 250", len(rows))
	}
	ids := map[string]int{}
	for _, r := range rows {
		if j, dup := ids[r.ID]; dup || r.ID == "" {
			t.Errorf("line %d: id %q empty or also on line %d", r.line, r.ID, j)
		}
		ids[r.ID] = r.line
		if !strings.HasPrefix(r.Source, "https://") {
			t.Errorf("line %d (%s): source %q is not a URL", r.line, r.ID, r.Source)
		}
		if _, ok := events.LookupClass(r.Class); !ok {
			t.Errorf("line %d (%s): expect_class %q is not a contract class", r.line, r.ID, r.Class)
		}
		for _, a := range r.Accept {
			if _, ok := events.LookupClass(a); !ok || a == r.Class {
				t.Errorf("line %d (%s): accept %q is not another contract class", r.line, r.ID, a)
			}
		}
		if len(r.Accept) > 0 && strings.TrimSpace(r.AcceptWhy) == "" {
			t.Errorf("line %d (%s): accept without accept_why", r.line, r.ID)
		}
		if r.Family != "" && !slices.Contains(wildFamilies, r.Family) {
			t.Errorf("line %d (%s): family %q not one of %v", r.line, r.ID, r.Family, wildFamilies)
		}
	}
	for _, r := range rows {
		t.Run(r.ID+"_"+r.outcome.Provider, func(t *testing.T) {
			t.Parallel()
			c := Classify(&r.outcome)
			if !r.accepts(c.Class) {
				t.Errorf("line %d (%s): class %q (rule %s, evidence %q), want %q or one of %v", r.line, r.Source, c.Class, c.Rule, c.Evidence, r.Class, r.Accept)
			}
			if r.HintMS != nil && (c.Hints == nil || c.Hints.AfterMS != *r.HintMS) {
				t.Errorf("line %d: hints %+v, want after_ms %d", r.line, c.Hints, *r.HintMS)
			}
			checkShape(t, &r.outcome, c)
		})
	}
}

// TestWildCoverage: each family of wildFamilies has rows from at least two
// providers, and every provider and library it lists has rows.
func TestWildCoverage(t *testing.T) {
	t.Parallel()
	rows := loadWild(t)
	fams := map[string]map[string]bool{}
	providers := map[string]int{}
	var libs []string
	for _, r := range rows {
		if fams[r.Family] == nil {
			fams[r.Family] = map[string]bool{}
		}
		fams[r.Family][r.outcome.Provider] = true
		providers[r.outcome.Provider]++
		libs = append(libs, strings.ToLower(r.Library))
	}
	for _, f := range wildFamilies {
		if len(fams[f]) < 2 {
			t.Errorf("family %s: providers %v, want at least two", f, keys(fams[f]))
		}
	}
	for _, p := range []string{"bedrock", "vertex", "google", "azure-openai", "mistral", "groq", "together", "fireworks",
		"deepseek", "xai", "cohere", "perplexity", "openrouter", "ollama", "vllm", "llamacpp", "tgi", "litellm"} {
		if providers[p] < 2 {
			t.Errorf("provider %s: %d rows, want at least two", p, providers[p])
		}
	}
	all := strings.Join(libs, "\n")
	for _, l := range []string{"undici", "httpx", "go net/http", "claude-code", "codex", "gemini-cli", "litellm"} {
		if !strings.Contains(all, l) {
			t.Errorf("no row from library %q", l)
		}
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
