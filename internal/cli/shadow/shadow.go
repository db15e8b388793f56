// Package shadow is `failbus shadow`: it audits a policy change before it
// is made. It replays recorded history — the outcomes and boundaries on the
// bus, or simulate-format JSON Lines — through the decision engine twice,
// on in-memory stores and the virtual clock at the recorded times, once
// under the base policy and once under the new one, and reports every
// outcome whose decision differs (action, delay, retry number) and a
// summary of the changes by action.
//
// The core is a library (New, Step, Summary; ReadBus reads a range of
// the bus) so tests and `failbus report --shadow` use it as the command
// does. It only reads: the bus history through an ordered
// consumer that is deleted when done; nothing is published, no sink is
// called (notifications stay records in memory).
//
// Jitter: each decision draws its randomness from its outcome's id (and
// the seed; retry.JitterU), as the bus's scheduler does, not from one
// stream shared by all decisions: a decision that changes does not shift
// the jitter of every later one, a policy equal to the base shows no
// difference at all, and with seed 0 (the default) the base run gives each
// retry the delay the bus gave it.
package shadow

import (
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/engine/sim"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// Options configure a Shadow.
type Options struct {
	// Base is the policy the history is compared against. Defaults to
	// policy.Default().
	Base *policy.Policy
	// New is the policy being audited. Required.
	New *policy.Policy
	// Seed varies the jitter (the same seed and history give the same
	// figures); 0 draws it as the bus does.
	Seed uint64
	// DedupeLifetime is notification admission's dedupe lifetime
	// (defaults to the notifier's).
	DedupeLifetime time.Duration
}

// Diff is one outcome whose decision differs (CONTRACT.md "failbus
// shadow"): `{"type":"diff","outcome_id","at","agent","provider","class",
// "base":{decision},"new":{decision}}`. A side without a decision (a
// success, say) is null.
type Diff struct {
	Type      string      `json:"type"`
	OutcomeID string      `json:"outcome_id"`
	At        events.Time `json:"at"`
	Agent     string      `json:"agent"`
	Provider  string      `json:"provider"`
	// Class is the base's classification; NewClass is set when the new
	// policy classifies the outcome differently.
	Class    string           `json:"class"`
	NewClass string           `json:"new_class,omitempty"`
	Base     *events.Decision `json:"base"`
	New      *events.Decision `json:"new"`
	// Seq is where the outcome is stored (bus history only).
	Seq uint64 `json:"seq,omitempty"`
}

// Summary is the last line: `{"type":"summary","outcomes":N,"differ":M,
// "changes":{"<base action>→<new action>":k}}`, with what else was read.
type Summary struct {
	Type     string `json:"type"`
	Outcomes int    `json:"outcomes"`
	Differ   int    `json:"differ"`
	// Changes counts the differing outcomes by "<base action>→<new
	// action>"; "none" stands for no decision. A change of delay or retry
	// number only is counted under "retry→retry".
	Changes map[string]int `json:"changes"`
	// Boundaries, Ticks, Routes and Recovery (heartbeats, cron and write
	// reports, tasks: JSON Lines input only) count the other inputs
	// replayed.
	Boundaries int `json:"boundaries,omitempty"`
	Ticks      int `json:"ticks,omitempty"`
	Routes     int `json:"routes,omitempty"`
	Recovery   int `json:"recovery,omitempty"`
	// Errors counts inputs the engine could not use (a duplicate outcome
	// id, a missing field), identical under both policies.
	Errors int `json:"errors,omitempty"`
	// Skipped counts stored messages that are not outcomes or boundaries
	// (bus history: junk the classifier dead-lettered).
	Skipped int `json:"skipped,omitempty"`
	// FirstSeq and LastSeq bound the bus history read.
	FirstSeq uint64 `json:"first_seq,omitempty"`
	LastSeq  uint64 `json:"last_seq,omitempty"`
	// TookMS is how long the replay took.
	TookMS int64 `json:"took_ms"`
}

// Shadow replays inputs under two policies side by side. Not safe for
// concurrent use.
type Shadow struct {
	base, next *sim.Sim
	sum        Summary
	// The new policy's engine steps on its own goroutine, started on
	// the first Step and kept (a goroutine per step spent a tenth of
	// the time growing its stack again).
	work chan sim.Input
	outs chan []sim.Output
}

// New builds a Shadow on fresh in-memory stores.
func New(o Options) (*Shadow, error) {
	if o.New == nil {
		return nil, fmt.Errorf("shadow: no new policy")
	}
	base := o.Base
	if base == nil {
		base = policy.Default()
	}
	s := &Shadow{sum: Summary{Type: "summary", Changes: map[string]int{}}}
	var err error
	if s.base, err = sim.New(sim.Config{Policy: base, Seed: o.Seed, DedupeLifetime: o.DedupeLifetime}); err != nil {
		return nil, fmt.Errorf("shadow: base policy: %w", err)
	}
	if s.next, err = sim.New(sim.Config{Policy: o.New, Seed: o.Seed, DedupeLifetime: o.DedupeLifetime}); err != nil {
		return nil, fmt.Errorf("shadow: new policy: %w", err)
	}
	return s, nil
}

// Step replays one input under both policies and returns the diff when
// it is an outcome whose decision differs.
func (s *Shadow) Step(in sim.Input) *Diff {
	// The two engines share nothing (stores, clock, jitter), so they step
	// side by side: on two cores a replay takes half the time.
	if s.work == nil {
		s.work, s.outs = make(chan sim.Input), make(chan []sim.Output)
		go func(work <-chan sim.Input, outs chan<- []sim.Output) {
			for in := range work {
				outs <- s.next.Step(in)
			}
		}(s.work, s.outs)
	}
	s.work <- clone(in)
	ob := s.base.Step(clone(in))
	on := <-s.outs
	switch in.Type {
	case sim.InputBoundary:
		s.sum.Boundaries++
	case sim.InputTick:
		s.sum.Ticks++
	case sim.InputRoute:
		s.sum.Routes++
	default:
		if in.Recovery != nil {
			s.sum.Recovery++
		}
	}
	cb, db, errb := pick(ob)
	cn, dn, _ := pick(on)
	if errb {
		s.sum.Errors++
	}
	if in.Type != sim.InputOutcome || in.Outcome == nil || cb == nil {
		return nil
	}
	s.sum.Outcomes++
	if sameDecision(db, dn) && (cn == nil || cn.Class == cb.Class) {
		return nil
	}
	s.sum.Differ++
	s.sum.Changes[action(db)+"→"+action(dn)]++
	d := &Diff{Type: "diff", OutcomeID: in.Outcome.ID, At: cb.At, Agent: in.Outcome.Agent, Provider: in.Outcome.Provider,
		Class: cb.Class, Base: db, New: dn}
	if cn != nil && cn.Class != cb.Class {
		d.NewClass = cn.Class
	}
	return d
}

// Close stops the goroutine the new policy's engine steps on. The
// Shadow must not be stepped after.
func (s *Shadow) Close() {
	if s.work != nil {
		close(s.work)
		s.work = nil
	}
}

// clone copies the records in, so a stage that fills a field (an
// outcome's missing `at`) under one policy does not feed the other.
func clone(in sim.Input) sim.Input {
	if in.Outcome != nil {
		o := *in.Outcome
		in.Outcome = &o
	}
	if in.Boundary != nil {
		b := *in.Boundary
		in.Boundary = &b
	}
	return in
}

// Summary is the figures so far.
func (s *Shadow) Summary() Summary { return s.sum }

// pick finds the outcome's classification and decision among a step's
// outputs (due retries of earlier outcomes come first and are not it),
// and whether the input was an error.
func pick(outs []sim.Output) (*events.Classification, *events.Decision, bool) {
	var (
		c   *events.Classification
		d   *events.Decision
		bad bool
	)
	for _, o := range outs {
		switch o.Type {
		case sim.OutputClassification:
			c = o.Classification
		case sim.OutputDecision:
			if c != nil && o.Decision.OutcomeID == c.OutcomeID {
				d = o.Decision
			}
		case sim.OutputError:
			bad = true
		}
	}
	return c, d, bad
}

// sameDecision compares what the contract names: action, delay, retry
// number.
func sameDecision(a, b *events.Decision) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Action == b.Action && a.DelayMS == b.DelayMS && a.Retry == b.Retry
}

func action(d *events.Decision) string {
	if d == nil {
		return "none"
	}
	return d.Action
}

// InputOf is the simulate input of a recorded outcome or boundary, at its
// recorded time.
func InputOf(rec Record) sim.Input {
	at := events.At(rec.At())
	switch {
	case rec.Outcome != nil:
		return sim.Input{Type: sim.InputOutcome, At: at, Outcome: rec.Outcome}
	case rec.Boundary != nil:
		return sim.Input{Type: sim.InputBoundary, At: at, Boundary: rec.Boundary}
	}
	return sim.Input{Type: sim.InputTick, At: at}
}
