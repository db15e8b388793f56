// Package sim is the simulate engine (CONTRACT.md "failbus simulate"): the
// whole decision core — classification, fault scope, the retry chain,
// refusal tiers, notification dedupe and daily budget, health — as one
// single-threaded state machine over input records, on a virtual clock.
//
// Time is only what the inputs' `at` say. The clock is the latest `at` seen
// and never runs backwards: a line stamped earlier than the clock (records
// from several agents interleave) is handled at the clock, as a service
// handles a late message at its own now. Before a timed line is handled,
// every pending retry whose due time is at or before the line's time comes
// due, in due order, each as a retry_due record stamped with its due time.
//
// The engine keeps, in memory, exactly what the services keep durably:
//
//	retry ledger      latest retry.Record per budget (BudgetKey.Token)  the scheduler's ledger stream
//	pending retries   due queue, one entry per retry id                 JetStream message schedules
//	fault scope       scope.ProviderState per provider                  the scheduler's memory, per replica
//	refusal book      refusal.Record per (segment, provider)            KV
//	notifications     dedupe keys and the UTC day's non-critical count  the notifier's KV
//
// Randomness (the backoff jitter) comes from a seeded generator or a
// function the caller passes, so a run is reproducible.
//
// A classification's `retryable` is its class's membership in the
// provider's effective retryable set (false under mode off): the policy's
// answer, not the class default. Always mode may still retry a class
// outside the set, as the fallback of the chain (retry.Decide).
//
// Output records per outcome, in order: classification; health changes;
// decision (none for a success); notifications actually sent (deduplicated
// by key for the whole run — a key dropped by the daily budget counts as
// handled too — and non-critical ones capped per UTC day of their time;
// critical always sent).
package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
	"github.com/failbus/failbus/pkg/policy/classify"
	"github.com/failbus/failbus/pkg/policy/refusal"
	"github.com/failbus/failbus/pkg/policy/retry"
	"github.com/failbus/failbus/pkg/policy/scope"
)

// Config configures a Sim.
type Config struct {
	// Policy is the policy to run; nil runs policy.Default().
	Policy *policy.Policy
	// Seed seeds the jitter's generator (PCG) when Rand is nil.
	Seed uint64
	// Rand, when set, supplies the uniform [0, 1) numbers for the jitter.
	Rand func() float64
}

// Sim is the simulate engine. It is not safe for concurrent use.
type Sim struct {
	pol        *policy.Policy
	classifier *classify.Classifier
	scope      *scope.Tracker
	book       *refusal.Book
	rand       func() float64

	clock     time.Time
	ledger    map[string]*retry.Record
	pending   simQueue
	scheduled map[string]bool
	seq       int
	outcomes  map[string]bool

	sentKeys map[string]bool
	day      string
	daySent  int
}

// New builds an engine running cfg.Policy.
func New(cfg Config) (*Sim, error) {
	p := cfg.Policy
	if p == nil {
		p = policy.Default()
	}
	cl, err := classify.New(p.Classify)
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	r := cfg.Rand
	if r == nil {
		r = rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)).Float64
	}
	return &Sim{
		pol:        p,
		classifier: cl,
		scope:      scope.NewTracker(p.Scope),
		book:       refusal.NewBook(p.Refusal),
		rand:       r,
		ledger:     map[string]*retry.Record{},
		scheduled:  map[string]bool{},
		outcomes:   map[string]bool{},
		sentKeys:   map[string]bool{},
	}, nil
}

// Now is the virtual clock: the latest `at` seen (zero before any).
func (s *Sim) Now() time.Time { return s.clock }

// Scope exposes the fault-scope state, for inspection and tests.
func (s *Sim) Scope() *scope.Tracker { return s.scope }

// Pending returns the retries scheduled and not yet due, in due order.
func (s *Sim) Pending() []retry.Record {
	q := append(simQueue(nil), s.pending...)
	out := make([]retry.Record, 0, len(q))
	for q.Len() > 0 {
		out = append(out, *heap.Pop(&q).(simItem).rec)
	}
	return out
}

// StepLine parses one input line and steps it; a line that cannot be
// parsed yields its error record.
func (s *Sim) StepLine(data []byte, lineNo int) []Output {
	in, err := ParseInput(data, lineNo)
	if err != nil {
		return []Output{ErrorOutput(lineNo, err)}
	}
	return s.Step(in)
}

// Step handles one input record and returns the output records it caused,
// in order.
func (s *Sim) Step(in Input) []Output {
	if in.Type == InputSync {
		return []Output{{Type: OutputSync, SyncID: in.SyncID}}
	}
	switch in.Type {
	case InputOutcome, InputBoundary, InputRoute, InputTick:
	default:
		return []Output{ErrorOutput(in.Line, fmt.Errorf("unknown type %q (want outcome, boundary, route, tick or sync)", in.Type))}
	}
	if in.At.IsZero() && s.clock.IsZero() {
		return []Output{ErrorOutput(in.Line, fmt.Errorf(`%s: "at" is required (no time has been seen yet)`, in.Type))}
	}
	now := s.clock
	if in.At.After(now) {
		now = in.At.Time
	}
	s.clock = now
	out := s.fireDue(now, nil)
	switch in.Type {
	case InputOutcome:
		if in.Outcome == nil {
			return append(out, ErrorOutput(in.Line, errors.New("outcome: missing")))
		}
		return s.outcome(in, now, out)
	case InputBoundary:
		b := in.Boundary
		if b == nil {
			return append(out, ErrorOutput(in.Line, errors.New("boundary: missing")))
		}
		if err := b.Validate(); err != nil {
			return append(out, ErrorOutput(in.Line, fmt.Errorf("boundary: %w", err)))
		}
		bd := *b
		bd.At = events.At(now)
		s.book.OnBoundary(bd)
		return out
	case InputRoute:
		if in.Route == nil {
			return append(out, ErrorOutput(in.Line, errors.New("route: missing")))
		}
		return append(out, s.route(*in.Route, now))
	}
	return out // tick
}

func (s *Sim) outcome(in Input, now time.Time, out []Output) []Output {
	o := in.Outcome
	if err := o.Validate(); err != nil {
		return append(out, ErrorOutput(in.Line, fmt.Errorf("outcome: %w", err)))
	}
	if s.outcomes[o.ID] {
		return append(out, ErrorOutput(in.Line, fmt.Errorf("outcome %q: duplicate id, ignored (the bus deduplicates by Nats-Msg-Id)", o.ID)))
	}
	s.outcomes[o.ID] = true
	if o.At.IsZero() {
		o.At = events.At(now)
	}

	c := s.classifier.Classify(o)
	simFill(&c, o)
	rp := s.pol.RetryFor(o.Provider)
	c.Retryable = rp.IsRetryable(c.Class)
	cc := c
	out = append(out, Output{Type: OutputClassification, Classification: &cc})

	obs := s.scope.Observe(c, now)
	for i := range obs.Health {
		out = append(out, Output{Type: OutputHealth, Health: &obs.Health[i]})
	}
	notes := obs.Notify
	switch c.Class {
	case events.ClassOK:
	case events.ClassContentRefusal:
		d, n := s.book.OnClassified(c, now)
		if d.Action != "" {
			out = append(out, Output{Type: OutputDecision, Decision: &d})
		}
		notes = append(notes, n...)
	default:
		var prior *retry.Record
		var token string
		if rp != nil {
			token = retry.BudgetFor(c, rp).Token()
			prior = s.ledger[token]
		}
		v := retry.Decide(retry.Input{Classification: c, Policy: rp, Scope: obs.Verdict, Prior: prior, Now: now, U: s.rand()})
		if v.Record != nil && !v.Replayed {
			// Persist before waiting: the ledger first, then the schedule.
			s.ledger[token] = v.Record
			s.schedule(v.Record)
		}
		d := v.Decision
		out = append(out, Output{Type: OutputDecision, Decision: &d})
	}
	for i := range notes {
		n := notes[i]
		if n.At.IsZero() {
			n.At = events.At(now)
		}
		if s.sendable(n, now) {
			out = append(out, Output{Type: OutputNotification, Notification: &n})
		}
	}
	return out
}

// simFill completes a classification with the outcome's identity, whatever
// the classifier already filled in.
func simFill(c *events.Classification, o *events.Outcome) {
	if c.OutcomeID == "" {
		c.OutcomeID = o.ID
	}
	if c.At.IsZero() {
		c.At = o.At
	}
	if c.Agent == "" {
		c.Agent = o.Agent
	}
	if c.Provider == "" {
		c.Provider = o.Provider
	}
	if c.Model == "" {
		c.Model = o.Model
	}
	if c.Profile == "" {
		c.Profile = o.Profile
	}
	if c.Session == "" {
		c.Session = o.Session
	}
	if c.Segment == 0 {
		c.Segment = o.Segment
	}
	if c.Turn == 0 {
		c.Turn = o.Turn
	}
	if c.Step == 0 {
		c.Step = o.Step
	}
	if c.RefusalScope == "" {
		c.RefusalScope = o.RefusalScope
	}
	if c.Scope == "" {
		if info, ok := events.LookupClass(c.Class); ok {
			c.Scope = info.Scope
		}
	}
}

// route skips providers in an outage first (they cannot receive anything
// now, and must not claim a re-probe), then answers the rest from the
// refusal book.
func (s *Sim) route(r events.RouteRequest, now time.Time) Output {
	var down []events.RouteSkip
	up := make([]string, 0, len(r.Providers))
	for _, p := range r.Providers {
		if st := s.scope.State(p); st != nil && st.Outage {
			down = append(down, refusal.OutageSkip(p, st.OutageReason))
			continue
		}
		up = append(up, p)
	}
	res := s.book.Route(now, r.Agent, r.Session, r.Segment, up)
	if res.Allowed == nil {
		res.Allowed = []string{}
	}
	res.Skipped = append(res.Skipped, down...)
	if res.Skipped == nil {
		res.Skipped = []events.RouteSkip{}
	}
	return Output{Type: OutputRoute, Route: &events.RouteRecord{At: events.At(now), Agent: r.Agent, Session: r.Session, Segment: r.Segment, RouteResult: res}}
}

// sendable applies dedupe and the daily budget: a key is handled once for
// the whole run; non-critical notifications are capped per UTC day of now.
func (s *Sim) sendable(n events.Notification, now time.Time) bool {
	if s.sentKeys[n.DedupeKey] {
		return false
	}
	s.sentKeys[n.DedupeKey] = true
	if n.Severity == events.SeverityCritical {
		return true
	}
	if day := now.UTC().Format(time.DateOnly); day != s.day {
		s.day, s.daySent = day, 0
	}
	if s.daySent >= s.pol.Notify.DailyBudget {
		return false
	}
	s.daySent++
	return true
}

// schedule adds a retry to the due queue; one entry per retry id, like one
// JetStream schedule per schedule subject.
func (s *Sim) schedule(rec *retry.Record) {
	if s.scheduled[rec.RetryID] {
		return
	}
	s.scheduled[rec.RetryID] = true
	s.seq++
	heap.Push(&s.pending, simItem{rec: rec, seq: s.seq})
}

// fireDue emits every pending retry due at or before now.
func (s *Sim) fireDue(now time.Time, out []Output) []Output {
	for s.pending.Len() > 0 && !s.pending[0].rec.DueAt.After(now) {
		it := heap.Pop(&s.pending).(simItem)
		r := it.rec
		out = append(out, Output{Type: OutputRetryDue, RetryDue: &DueRecord{
			RetryID: r.RetryID, OutcomeID: r.OutcomeID, Agent: r.Agent, Retry: r.Retry, At: r.DueAt,
		}})
	}
	return out
}

type simItem struct {
	rec *retry.Record
	seq int
}

// simQueue is a min-heap of pending retries by due time, then by
// scheduling order.
type simQueue []simItem

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if !q[i].rec.DueAt.Equal(q[j].rec.DueAt.Time) {
		return q[i].rec.DueAt.Before(q[j].rec.DueAt.Time)
	}
	return q[i].seq < q[j].seq
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(simItem)) }
func (q *simQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}
