package report

import (
	"fmt"
	"maps"
	"time"

	"github.com/failbus/failbus/internal/cli/shadow"
	"github.com/failbus/failbus/pkg/events"
)

// MaxShadowExamples is how many differing decisions the report lists; the
// counts cover all of them (`failbus shadow` lists every one).
const MaxShadowExamples = 20

// Shadow is what another policy would have decided on the period's
// outcomes (failbus report --shadow NEW): the outcomes and boundaries the
// report reads replayed through the engine under the base and the new
// policy, as `failbus shadow` does over the same range.
type Shadow struct {
	// Policy and Base name the policies compared (file names; "default"
	// for the default policy).
	Policy string `json:"policy"`
	Base   string `json:"base"`
	// Outcomes were replayed; Differ were decided differently.
	Outcomes int `json:"outcomes"`
	Differ   int `json:"differ"`
	// Changes counts the differing outcomes by "<base action>→<new
	// action>"; ByProvider splits them per provider.
	Changes    map[string]int            `json:"changes"`
	ByProvider map[string]map[string]int `json:"by_provider"`
	// Examples are the first MaxShadowExamples differing decisions.
	Examples []shadow.Diff `json:"examples"`
	// TookMS is how long the replay took.
	TookMS int64 `json:"took_ms"`
}

// ShadowOptions ask Collect for the Shadow figures.
type ShadowOptions struct {
	shadow.Options
	// PolicyName and BaseName label the policies on the page.
	PolicyName, BaseName string
}

// shadowing feeds the report's outcomes and boundaries to a shadow.Shadow.
type shadowing struct {
	s    *shadow.Shadow
	fig  *Shadow
	took time.Duration
}

func newShadowing(o ShadowOptions) (*shadowing, error) {
	s, err := shadow.New(o.Options)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	base := o.BaseName
	if base == "" {
		base = "default"
	}
	return &shadowing{s: s, fig: &Shadow{Policy: o.PolicyName, Base: base, Changes: map[string]int{}, ByProvider: map[string]map[string]int{}, Examples: []shadow.Diff{}}}, nil
}

// step replays one stored record, in stream order.
func (sh *shadowing) step(rec shadow.Record) {
	start := time.Now()
	d := sh.s.Step(shadow.InputOf(rec))
	sh.took += time.Since(start)
	if d == nil {
		return
	}
	d.Seq = rec.Seq
	change := action(d.Base) + "→" + action(d.New)
	p := sh.fig.ByProvider[d.Provider]
	if p == nil {
		p = map[string]int{}
		sh.fig.ByProvider[d.Provider] = p
	}
	p[change]++
	if len(sh.fig.Examples) < MaxShadowExamples {
		sh.fig.Examples = append(sh.fig.Examples, *d)
	}
}

// finish closes the replay and returns its figures.
func (sh *shadowing) finish() *Shadow {
	sh.s.Close()
	sum := sh.s.Summary()
	sh.fig.Outcomes, sh.fig.Differ, sh.fig.TookMS = sum.Outcomes, sum.Differ, sh.took.Milliseconds()
	maps.Copy(sh.fig.Changes, sum.Changes)
	return sh.fig
}

func action(d *events.Decision) string {
	if d == nil {
		return "none"
	}
	return d.Action
}
