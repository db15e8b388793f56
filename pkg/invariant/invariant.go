// Package invariant checks the grammar of an LLM provider's event stream:
// seven rules (a harness's validateStream), wrapped around every provider
// stream before any consumer sees an event, so an adapter that translates a provider's stream
// wrongly fails at once, naming the rule, instead of a token meter or a UI
// quietly getting it wrong later. A violation is reported as an Outcome that
// the classifier files as `invariant` (rule stream.invariant), which is not
// retryable by default: the model's stream, not the clock, is at fault.
//
// The seven rules, with their ids:
//
//  1. usage_at_most_once — usage is reported at most once.
//  2. usage_before_finish — usage comes before finish.
//  3. nothing_after_finish — no event after finish.
//  4. block_paired — block start and block end are paired per index: a
//     block is started before it ends, not started again while open, and
//     closed before finish.
//  5. delta_in_open_block — a delta goes into an open block.
//  6. block_end_type — a block end that names its type names the type its
//     start declared.
//  7. finish_exactly_once — finish comes exactly once: a stream that ends
//     without it, or finishes twice, did not terminate normally.
//
// When one event breaks several rules the most specific is named: after
// finish, a usage breaks usage_before_finish and a second finish
// finish_exactly_once; anything else there is nothing_after_finish. A stream
// that breaks off with an error (a transport failure) is not a grammar
// violation: the error is passed on as it is.
//
// The rules are checked on grammar events (Event); a provider's own events
// are mapped to them by the caller (Stream's grammar function), and events
// that are not part of the grammar (pings, metadata) are skipped. The same
// fixtures (testdata/invariants at the repository root) drive this package's
// tests and the TypeScript client's.
package invariant

import (
	"fmt"
	"iter"
	"sort"
	"strings"

	"github.com/failbus/failbus/pkg/events"
)

// Rule ids, named by Violation.Rule and in the outcome's transport error;
// the package doc and Rules list them. Public as strings: never rename one.
const (
	ruleUsageAtMostOnce    = "usage_at_most_once"
	ruleUsageBeforeFinish  = "usage_before_finish"
	ruleNothingAfterFinish = "nothing_after_finish"
	ruleBlockPaired        = "block_paired"
	ruleDeltaInOpenBlock   = "delta_in_open_block"
	ruleBlockEndType       = "block_end_type"
	ruleFinishExactlyOnce  = "finish_exactly_once"
)

// Rules lists the rule ids (Violation.Rule) in the order of the package doc.
var Rules = []string{
	ruleUsageAtMostOnce, ruleUsageBeforeFinish, ruleNothingAfterFinish, ruleBlockPaired,
	ruleDeltaInOpenBlock, ruleBlockEndType, ruleFinishExactlyOnce,
}

// Grammar event types.
const (
	// BlockStart opens the content block Index, of type Block (text,
	// thinking, tool_call, …).
	BlockStart = "block_start"
	// Delta adds content to the open block Index.
	Delta = "delta"
	// BlockEnd closes the block Index; Block, when set, must be its type.
	BlockEnd = "block_end"
	// Usage reports the call's token usage.
	Usage = "usage"
	// Finish ends the stream normally.
	Finish = "finish"
)

// Event is one event of the stream grammar. Fields other than Type, Index
// and Block (a provider's text, token counts, stop reason) do not take part
// in the rules; the JSON fixtures carry some for readability.
type Event struct {
	Type  string `json:"type"`
	Index int    `json:"index,omitempty"`
	Block string `json:"block,omitempty"`
}

// upstreamCode is the upstream_code a violation's outcome carries: the code
// a stream validator throws, a hint the classifier accepts only with
// the transport error's evidence.
const upstreamCode = "INVARIANT"

// Violation is the first broken rule of a stream.
type Violation struct {
	// Rule is the id of the broken rule (Rules).
	Rule string
	// At is the 0-based position of the offending event among all events
	// the stream delivered (grammar or not); at the end of the stream it is
	// the number of events.
	At int
	// Event is the offending grammar event; the zero Event at the end of
	// the stream.
	Event Event
	// Detail says what happened, in words.
	Detail string
}

// Error names the rule and the position: "stream invariant violated:
// block_paired at event 4: finish while block 0 (text) is open".
func (v *Violation) Error() string {
	return fmt.Sprintf("stream invariant violated: %s at event %d: %s", v.Rule, v.At, v.Detail)
}

// Outcome reports the call whose stream broke the grammar: base (the call's
// identity, provider, model, status, headers) with ok false, the violation
// as its transport error, and upstream_code INVARIANT. The classifier files
// it as `invariant`. Evidence base already holds (body, headers) is kept.
func (v *Violation) Outcome(base events.Outcome) events.Outcome {
	o := base
	o.OK = false
	o.TransportError = v.Error()
	o.UpstreamCode = upstreamCode
	return o
}

// Validator checks one stream, event by event. The zero value is ready to
// use; it is not safe for concurrent use. After the first violation every
// call returns that violation again.
type Validator struct {
	n        int
	usage    bool
	finished bool
	open     map[int]string
	err      *Violation
}

// Skip counts an event that is not part of the grammar, so positions in
// violations match the provider's stream.
func (v *Validator) Skip() { v.n++ }

// Check checks the next event; it returns a *Violation for the first event
// that breaks a rule, and nil otherwise.
func (v *Validator) Check(e Event) error {
	if v.err != nil {
		return v.err
	}
	at := v.n
	v.n++
	fail := func(rule, format string, args ...any) error {
		v.err = &Violation{Rule: rule, At: at, Event: e, Detail: fmt.Sprintf(format, args...)}
		return v.err
	}
	if v.finished {
		switch e.Type {
		case Usage:
			return fail(ruleUsageBeforeFinish, "usage after finish")
		case Finish:
			return fail(ruleFinishExactlyOnce, "a second finish")
		default:
			return fail(ruleNothingAfterFinish, "%s after finish", describe(e))
		}
	}
	switch e.Type {
	case Usage:
		if v.usage {
			return fail(ruleUsageAtMostOnce, "a second usage")
		}
		v.usage = true
	case BlockStart:
		if t, ok := v.open[e.Index]; ok {
			return fail(ruleBlockPaired, "block %d started again while open (%s)", e.Index, t)
		}
		if v.open == nil {
			v.open = map[int]string{}
		}
		v.open[e.Index] = e.Block
	case Delta:
		if _, ok := v.open[e.Index]; !ok {
			return fail(ruleDeltaInOpenBlock, "delta into block %d, which is not open", e.Index)
		}
	case BlockEnd:
		t, ok := v.open[e.Index]
		if !ok {
			return fail(ruleBlockPaired, "end of block %d, which is not open", e.Index)
		}
		if e.Block != "" && e.Block != t {
			return fail(ruleBlockEndType, "block %d started as %s ends as %s", e.Index, t, e.Block)
		}
		delete(v.open, e.Index)
	case Finish:
		if len(v.open) > 0 {
			return fail(ruleBlockPaired, "finish while %s open", v.openBlocks())
		}
		v.finished = true
	}
	return nil
}

// End checks the end of the stream: it must have finished.
func (v *Validator) End() error {
	if v.err != nil {
		return v.err
	}
	if !v.finished {
		v.err = &Violation{Rule: ruleFinishExactlyOnce, At: v.n, Detail: fmt.Sprintf("the stream ended after %d events without finish", v.n)}
		return v.err
	}
	return nil
}

func (v *Validator) openBlocks() string {
	idx := make([]int, 0, len(v.open))
	for i := range v.open {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	parts := make([]string, len(idx))
	for k, i := range idx {
		parts[k] = fmt.Sprintf("block %d (%s)", i, v.open[i])
	}
	if len(parts) == 1 {
		return parts[0] + " is"
	}
	return strings.Join(parts, ", ") + " are"
}

func describe(e Event) string {
	switch e.Type {
	case BlockStart, BlockEnd, Delta:
		return fmt.Sprintf("%s of block %d", e.Type, e.Index)
	}
	return e.Type
}

// Stream wraps a provider's event stream: each event is mapped to the
// grammar by grammar (false: not a grammar event, passed on unchecked),
// checked, and only then passed on. At the first violation it yields the
// *Violation as the error instead of the offending event, and stops; at the
// end of a stream that did not finish it yields the *Violation last. An
// error of the provider's stream is passed on as it is, and ends it.
func Stream[E any](src iter.Seq2[E, error], grammar func(E) (Event, bool)) iter.Seq2[E, error] {
	return func(yield func(E, error) bool) {
		var v Validator
		var zero E
		for e, err := range src {
			if err != nil {
				yield(zero, err)
				return
			}
			g, ok := grammar(e)
			if !ok {
				v.Skip()
			} else if verr := v.Check(g); verr != nil {
				yield(zero, verr)
				return
			}
			if !yield(e, nil) {
				return
			}
		}
		if err := v.End(); err != nil {
			yield(zero, err)
		}
	}
}
