package classify

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/failbus/failbus/pkg/events"
)

// Evaluating the rules against labelled errors: how many rows of a corpus
// land in their expected class, overall, per class and per provider, and —
// the honest estimate of what a provider the rules were not tuned on will
// see — leave-one-provider-out: each provider's rows classified by rules
// built without that provider's own code table (see Tables). The general
// families, the built-in rules and the user's rules stay.

// EvalRow is one labelled outcome: the Outcome's fields plus the class it
// must get (`expect_class`), other classes the body honestly supports
// (`accept`, with `accept_why`) and where the error text comes from
// (`source`), as in testdata/*.jsonl.
type EvalRow struct {
	Line    int            `json:"-"`
	File    string         `json:"-"`
	Outcome events.Outcome `json:"-"`
	ID      string         `json:"id"`
	Expect  string         `json:"expect_class"`
	Accept  []string       `json:"accept,omitempty"`
	Source  string         `json:"source,omitempty"`
}

// Accepts reports whether class is the row's expected class or one it
// accepts.
func (r *EvalRow) Accepts(class string) bool {
	return class == r.Expect || slices.Contains(r.Accept, class)
}

// ReadEvalRows reads labelled outcomes, one JSON object a line; blank lines
// are skipped. name labels errors and rows (usually the file name). A row
// without expect_class, with a class that is not a contract class, or whose
// outcome is not valid is an error naming its line: an evaluation over rows
// it could not read would report a figure for a different corpus.
func ReadEvalRows(r io.Reader, name string) ([]EvalRow, error) {
	var rows []EvalRow
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		row := EvalRow{Line: n, File: name}
		if err := json.Unmarshal(line, &row); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		if row.Expect == "" {
			return nil, fmt.Errorf("%s:%d: no expect_class", name, n)
		}
		for _, c := range append([]string{row.Expect}, row.Accept...) {
			if _, ok := events.LookupClass(c); !ok {
				return nil, fmt.Errorf("%s:%d: %q is not a contract class", name, n, c)
			}
		}
		if err := events.UnmarshalJSON(line, &row.Outcome); err != nil {
			return nil, fmt.Errorf("%s:%d: outcome: %w", name, n, err)
		}
		if err := row.Outcome.Validate(); err != nil {
			return nil, fmt.Errorf("%s:%d: outcome: %w", name, n, err)
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return rows, nil
}

// Tally counts rows and how many landed in an accepted class.
type Tally struct {
	Rows    int `json:"rows"`
	Correct int `json:"correct"`
}

// Accuracy is Correct/Rows (1 for no rows: nothing was wrong).
func (t Tally) Accuracy() float64 {
	if t.Rows == 0 {
		return 1
	}
	return float64(t.Correct) / float64(t.Rows)
}

func (t *Tally) add(ok bool) {
	t.Rows++
	if ok {
		t.Correct++
	}
}

// Miss is a row that did not land in an accepted class.
type Miss struct {
	File     string   `json:"file"`
	Line     int      `json:"line"`
	ID       string   `json:"id"`
	Provider string   `json:"provider"`
	Expect   string   `json:"expect_class"`
	Accept   []string `json:"accept,omitempty"`
	Class    string   `json:"class"`
	Rule     string   `json:"rule"`
	Evidence []string `json:"evidence"`
	// LOPO marks a miss of the leave-one-provider-out pass only.
	LOPO bool `json:"lopo,omitempty"`
}

// EvalReport is the result of Evaluate.
type EvalReport struct {
	Overall    Tally            `json:"overall"`
	ByClass    map[string]Tally `json:"by_class"`    // by expected class
	ByProvider map[string]Tally `json:"by_provider"` // by the row's provider
	// LOPO is leave-one-provider-out: each row classified by rules built
	// without its provider's code tables. LOPOByProvider has the providers
	// that own a table (the others are classified as in Overall).
	LOPO           Tally            `json:"lopo"`
	LOPOByProvider map[string]Tally `json:"lopo_by_provider"`
	// Tables maps each provider that owns tables to their names.
	Tables map[string][]string `json:"tables"`
	Misses []Miss              `json:"misses"`
}

// Evaluate classifies every row with the rules of cfg and again, for the
// rows of providers that own built-in code tables, with those tables left
// out, and returns the figures and the misses.
func Evaluate(cfg Config, rows []EvalRow) (EvalReport, error) {
	full, err := New(cfg)
	if err != nil {
		return EvalReport{}, err
	}
	rep := EvalReport{
		ByClass: map[string]Tally{}, ByProvider: map[string]Tally{},
		LOPOByProvider: map[string]Tally{}, Tables: map[string][]string{},
	}
	without := map[string]*Classifier{} // provider → classifier without its tables
	for i := range rows {
		r := &rows[i]
		c := full.Classify(&r.Outcome)
		ok := r.Accepts(c.Class)
		rep.Overall.add(ok)
		t := rep.ByClass[r.Expect]
		t.add(ok)
		rep.ByClass[r.Expect] = t
		p := strings.ToLower(r.Outcome.Provider)
		t = rep.ByProvider[p]
		t.add(ok)
		rep.ByProvider[p] = t
		if !ok {
			rep.Misses = append(rep.Misses, missOf(r, c, false))
		}

		owned := TablesOf(p)
		if len(owned) == 0 {
			rep.LOPO.add(ok)
			continue
		}
		rep.Tables[p] = owned
		lc := without[p]
		if lc == nil {
			lc, err = newClassifier(cfg, owned)
			if err != nil {
				return EvalReport{}, err
			}
			without[p] = lc
		}
		lcl := lc.Classify(&r.Outcome)
		lok := r.Accepts(lcl.Class)
		rep.LOPO.add(lok)
		t = rep.LOPOByProvider[p]
		t.add(lok)
		rep.LOPOByProvider[p] = t
		if !lok && ok {
			rep.Misses = append(rep.Misses, missOf(r, lcl, true))
		}
	}
	return rep, nil
}

func missOf(r *EvalRow, c events.Classification, lopo bool) Miss {
	return Miss{File: r.File, Line: r.Line, ID: r.ID, Provider: r.Outcome.Provider, Expect: r.Expect,
		Accept: r.Accept, Class: c.Class, Rule: c.Rule, Evidence: c.Evidence, LOPO: lopo}
}

// SortedKeys returns m's keys in order, for reports.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
