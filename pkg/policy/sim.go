package policy

// The simulate engine (CONTRACT.md "failbus simulate"): the whole decision
// core — classification, fault scope, the retry chain, refusal tiers,
// notification dedupe and daily budget, health — as one single-threaded
// state machine over input records, on a virtual clock.
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
//	retry ledger      latest RetryRecord per budget (BudgetKey.Token)   the scheduler's ledger stream
//	pending retries   due queue, one entry per retry id                 JetStream message schedules
//	fault scope       ProviderState per provider                        KV
//	refusal book      RefusalState per (segment, provider)               KV
//	notifications     dedupe keys and the UTC day's non-critical count  the notifier's KV
//
// Randomness (the backoff jitter) comes from a seeded generator or a
// function the caller passes, so a run is reproducible.
//
// A classification's `retryable` is its class's membership in the
// provider's effective retryable set (false under mode off): the policy's
// answer, not the class default. Always mode may still retry a class
// outside the set, as the fallback of the chain (retry.go).
//
// Output records per outcome, in order: classification; health changes;
// decision (none for a success); notifications actually sent (deduplicated
// by key for the whole run — a key dropped by the daily budget counts as
// handled too — and non-critical ones capped per UTC day of their time;
// critical always sent).

import (
	"container/heap"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Input record types (CONTRACT.md). A line without a type is an outcome, so
// a raw outcome log (e.g. from `failbus tail`) replays as is.
const (
	InputOutcome  = "outcome"
	InputBoundary = "boundary"
	InputRoute    = "route"
	InputTick     = "tick"
	InputSync     = "sync"
)

// Output record types (CONTRACT.md).
const (
	OutputClassification = "classification"
	OutputDecision       = "decision"
	OutputRetryDue       = "retry_due"
	OutputRoute          = "route"
	OutputNotification   = "notification"
	OutputHealth         = "health"
	OutputError          = "error"
	OutputSync           = "sync"
)

// Input is one parsed input record. Exactly the field of its Type is set
// (none for tick; SyncID for sync).
type Input struct {
	Type string
	// Line is the 1-based input line number, echoed in error records.
	Line int
	// At is the record's time (tick, and a copy of the others' `at`).
	At       events.Time
	Outcome  *events.Outcome
	Boundary *events.Boundary
	Route    *RouteRequest
	// SyncID is the sync record's id, echoed verbatim.
	SyncID json.RawMessage
}

// RouteRequest asks which of the providers, in order, may receive the
// segment `<session>#<segment>` now.
type RouteRequest struct {
	At        events.Time `json:"at"`
	Agent     string      `json:"agent"`
	Session   string      `json:"session"`
	Segment   int         `json:"segment"`
	Providers []string    `json:"providers"`
}

// DueRecord is a retry that came due (`retry_due`); At is its due time.
type DueRecord struct {
	RetryID   string      `json:"retry_id"`
	OutcomeID string      `json:"outcome_id"`
	Agent     string      `json:"agent"`
	Retry     int         `json:"retry"`
	At        events.Time `json:"at"`
}

// RouteRecord answers a route request.
type RouteRecord struct {
	At      events.Time `json:"at"`
	Agent   string      `json:"agent"`
	Session string      `json:"session"`
	Segment int         `json:"segment"`
	RouteResult
}

// ErrorRecord reports an input line that could not be used; processing goes
// on.
type ErrorRecord struct {
	Line  int    `json:"line"`
	Error string `json:"error"`
}

// Output is one output record. Exactly the field of its Type is set.
type Output struct {
	Type           string
	Classification *events.Classification
	Decision       *events.Decision
	RetryDue       *DueRecord
	Route          *RouteRecord
	Notification   *events.Notification
	Health         *events.Health
	Error          *ErrorRecord
	// SyncID echoes the sync input's id.
	SyncID json.RawMessage
}

// MarshalJSON writes the record as one flat JSON object whose first key is
// "type".
func (o Output) MarshalJSON() ([]byte, error) {
	var payload any
	switch o.Type {
	case OutputClassification:
		payload = o.Classification
	case OutputDecision:
		payload = o.Decision
	case OutputRetryDue:
		payload = o.RetryDue
	case OutputRoute:
		payload = o.Route
	case OutputNotification:
		payload = o.Notification
	case OutputHealth:
		payload = o.Health
	case OutputError:
		payload = o.Error
	case OutputSync:
		id := o.SyncID
		if len(id) == 0 {
			id = json.RawMessage("null")
		}
		payload = struct {
			ID json.RawMessage `json:"id"`
		}{id}
	default:
		return nil, fmt.Errorf("output: unknown type %q", o.Type)
	}
	body, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("output %s: %w", o.Type, err)
	}
	typ, _ := json.Marshal(o.Type)
	out := make([]byte, 0, len(body)+len(typ)+10)
	out = append(out, `{"type":`...)
	out = append(out, typ...)
	if len(body) > 2 && body[0] == '{' {
		out = append(out, ',')
		out = append(out, body[1:]...)
		return out, nil
	}
	if string(body) == "{}" || string(body) == "null" {
		return append(out, '}'), nil
	}
	return nil, fmt.Errorf("output %s: payload is not an object", o.Type)
}

// ErrorOutput builds the error record for input line `line`.
func ErrorOutput(line int, err error) Output {
	return Output{Type: OutputError, Error: &ErrorRecord{Line: line, Error: err.Error()}}
}

// ParseInput reads one JSON Lines record. lineNo is kept in Input.Line.
func ParseInput(data []byte, lineNo int) (Input, error) {
	in := Input{Line: lineNo}
	var head struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return in, fmt.Errorf("not a JSON object: %w", err)
	}
	if head.Type != nil {
		in.Type = *head.Type
	} else {
		in.Type = InputOutcome
	}
	switch in.Type {
	case InputOutcome:
		o := &events.Outcome{}
		if err := events.UnmarshalJSON(data, o); err != nil {
			return in, fmt.Errorf("outcome: %w", err)
		}
		in.Outcome, in.At = o, o.At
	case InputBoundary:
		b := &events.Boundary{}
		if err := events.UnmarshalJSON(data, b); err != nil {
			return in, fmt.Errorf("boundary: %w", err)
		}
		in.Boundary, in.At = b, b.At
	case InputRoute:
		r := &RouteRequest{}
		if err := json.Unmarshal(data, r); err != nil {
			return in, fmt.Errorf("route: %w", err)
		}
		in.Route, in.At = r, r.At
	case InputTick:
		var t struct {
			At events.Time `json:"at"`
		}
		if err := json.Unmarshal(data, &t); err != nil {
			return in, fmt.Errorf("tick: %w", err)
		}
		if t.At.IsZero() {
			return in, errors.New(`tick: "at" is required`)
		}
		in.At = t.At
	case InputSync:
		var s struct {
			ID json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(data, &s); err != nil {
			return in, fmt.Errorf("sync: %w", err)
		}
		in.SyncID = s.ID
	default:
		return in, fmt.Errorf("unknown type %q (want outcome, boundary, route, tick or sync)", in.Type)
	}
	return in, nil
}

// SimConfig configures a Sim.
type SimConfig struct {
	// Policy is the policy to run; nil runs Default().
	Policy *Policy
	// Seed seeds the jitter's generator (PCG) when Rand is nil.
	Seed uint64
	// Rand, when set, supplies the uniform [0, 1) numbers for the jitter.
	Rand func() float64
}

// Sim is the simulate engine. It is not safe for concurrent use.
type Sim struct {
	pol        *Policy
	classifier *Classifier
	scope      *Scope
	book       *RefusalBook
	rand       func() float64

	clock     time.Time
	ledger    map[string]*RetryRecord
	pending   simQueue
	scheduled map[string]bool
	seq       int
	outcomes  map[string]bool

	sentKeys map[string]bool
	day      string
	daySent  int
}

// NewSim builds an engine running cfg.Policy.
func NewSim(cfg SimConfig) (*Sim, error) {
	p := cfg.Policy
	if p == nil {
		p = Default()
	}
	cl, err := NewClassifier(p.Classify)
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
		scope:      NewScope(p.Scope),
		book:       NewRefusalBook(p.Refusal),
		rand:       r,
		ledger:     map[string]*RetryRecord{},
		scheduled:  map[string]bool{},
		outcomes:   map[string]bool{},
		sentKeys:   map[string]bool{},
	}, nil
}

// Now is the virtual clock: the latest `at` seen (zero before any).
func (s *Sim) Now() time.Time { return s.clock }

// Scope exposes the fault-scope state, for inspection and tests.
func (s *Sim) Scope() *Scope { return s.scope }

// Pending returns the retries scheduled and not yet due, in due order.
func (s *Sim) Pending() []RetryRecord {
	q := append(simQueue(nil), s.pending...)
	out := make([]RetryRecord, 0, len(q))
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
		var prior *RetryRecord
		var token string
		if rp != nil {
			token = BudgetFor(c, rp).Token()
			prior = s.ledger[token]
		}
		v := DecideRetry(RetryInput{Classification: c, Policy: rp, Scope: obs.Verdict, Prior: prior, Now: now, U: s.rand()})
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
func (s *Sim) route(r RouteRequest, now time.Time) Output {
	var down []RouteSkip
	up := make([]string, 0, len(r.Providers))
	for _, p := range r.Providers {
		if st := s.scope.State(p); st != nil && st.Outage {
			down = append(down, OutageSkip(p, st.OutageReason))
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
		res.Skipped = []RouteSkip{}
	}
	return Output{Type: OutputRoute, Route: &RouteRecord{At: events.At(now), Agent: r.Agent, Session: r.Session, Segment: r.Segment, RouteResult: res}}
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
func (s *Sim) schedule(rec *RetryRecord) {
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
	rec *RetryRecord
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
