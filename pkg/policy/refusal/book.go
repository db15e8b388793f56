package refusal

import (
	"cmp"
	"slices"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Book keeps refusal records per (segment, provider) in memory, for
// `failbus simulate` and tests. It runs the same pure transitions
// (Record.Refused and Probe, so also the re-probe claim of
// DefaultProbeLease) and words (Notice) as the KV-backed bus
// service, with a map in place of compare-and-set, so a recorded run gets
// the answers the bus would have given: of two agents asking for one due
// re-probe only one is allowed. It is not safe for concurrent use; the
// simulator is single-threaded by design.
type Book struct {
	cfg    Config
	states map[refusalBookKey]refusalEntry
}

type refusalBookKey struct {
	session  string
	segment  int
	provider string
}

// refusalEntry remembers when the record was last written, to apply the
// same TTL backstop the KV bucket applies per key.
type refusalEntry struct {
	rec     Record
	written time.Time
}

// NewBook returns an empty book running cfg. cfg should have passed
// Validate; a non-positive StateTTL disables expiry.
func NewBook(cfg Config) *Book {
	return &Book{cfg: cfg, states: make(map[refusalBookKey]refusalEntry)}
}

// Config returns the policy section the book runs.
func (b *Book) Config() Config { return b.cfg }

// State returns the live state of provider in `<session>#<segment>` at now;
// false when there is none or it outlived StateTTL since its last write.
func (b *Book) State(now time.Time, session string, segment int, provider string) (State, bool) {
	e, ok := b.states[refusalBookKey{session, segment, provider}]
	if !ok || b.expired(e, now) {
		return State{}, false
	}
	return e.rec.State, true
}

// States returns every live state at now, ordered by session, segment and
// provider, for inspection and tests.
func (b *Book) States(now time.Time) []State {
	keys := make([]refusalBookKey, 0, len(b.states))
	for k, e := range b.states {
		if !b.expired(e, now) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(x, y refusalBookKey) int {
		return cmp.Or(cmp.Compare(x.session, y.session), cmp.Compare(x.segment, y.segment), cmp.Compare(x.provider, y.provider))
	})
	out := make([]State, len(keys))
	for i, k := range keys {
		out[i] = b.states[k].rec.State
	}
	return out
}

func (b *Book) expired(e refusalEntry, now time.Time) bool {
	return b.cfg.StateTTL > 0 && !now.Before(e.written.Add(b.cfg.StateTTL))
}

// TouchDue reports whether a stored state last written at written
// should be rewritten unchanged at now, when a route read finds it: once half
// of StateTTL has passed. The TTL is a backstop for segments nobody uses any
// more; a segment still being routed must keep its state, or a frozen
// provider would receive the refused history again a TTL after freezing.
// Rewriting the same value moves no refusal clock (RefusedAt is unchanged).
func TouchDue(written, now time.Time, cfg Config) bool {
	return cfg.StateTTL > 0 && now.Sub(written) >= cfg.StateTTL/2
}

// OnClassified applies one content_refusal classification at now and returns
// the decision for the agent (rerender or skip_provider, its reason worded by
// Notice) and the notifications to request: only at the first refusal
// (normal) and when the provider freezes (critical). A classification of any
// other class is not the book's: it returns a zero Decision and no
// notifications.
//
// The decision's due_at, for skip_provider, is when the provider may be
// probed again (absent when frozen); retry, for rerender, is the 1-based
// re-render attempt.
func (b *Book) OnClassified(c events.Classification, now time.Time) (events.Decision, []events.Notification) {
	if c.Class != events.ClassContentRefusal {
		return events.Decision{}, nil
	}
	k := refusalBookKey{c.Session, c.Segment, c.Provider}
	e, ok := b.states[k]
	if !ok || b.expired(e, now) {
		e.rec = Record{State: State{Segment: events.SegmentKey(c.Session, c.Segment), Provider: c.Provider}}
	}
	// Refused also ends the reporter's re-probe claim, as on the bus.
	rec, ev := e.rec.Refused(c.Agent, c.RefusalScope, Increment(c.Turn, c.Step), now, b.cfg)
	b.states[k] = refusalEntry{rec: rec, written: now}

	var peers []string
	if ev.Notify {
		peers = Peers(b.cfg, ev, b.segmentStates(now, c.Session, c.Segment))
	}
	t := Notice(b.cfg, ev, peers)
	d := events.Decision{
		OutcomeID: c.OutcomeID,
		At:        events.At(now),
		Agent:     c.Agent,
		Action:    ev.Action,
		Reason:    t.Reason,
		Class:     c.Class,
		Provider:  c.Provider,
		Model:     c.Model,
		Profile:   c.Profile,
		Retry:     ev.Rerender,
	}
	if !ev.NextProbeAt.IsZero() {
		d.DueAt = events.At(ev.NextProbeAt)
	}
	if !ev.Notify {
		return d, nil
	}
	return d, []events.Notification{t.Notification(ev, now)}
}

func (b *Book) segmentStates(now time.Time, session string, segment int) []State {
	var out []State
	for k, e := range b.states {
		if k.session == session && k.segment == segment && !b.expired(e, now) {
			out = append(out, e.rec.State)
		}
	}
	return out
}

// OnBoundary retires refusal state a boundary makes obsolete. bd names the
// NEW segment; it retires every earlier segment (number < bd.Segment) of
// bd.Session, whichever agent reported the refusals, because the segment is a
// property of the session (its key has no agent) and a boundary means the
// refused bytes left the request. It keeps the new segment and any later
// one, so a boundary delivered late cannot wipe newer state; it leaves other
// sessions alone, because an agent may run several sessions at once and a
// new session id does not say which old one it replaced: the StateTTL
// backstop retires those. It also drops every expired entry, at bd.At.
func (b *Book) OnBoundary(bd events.Boundary) {
	for k, e := range b.states {
		if k.session == bd.Session && k.segment < bd.Segment || !bd.At.IsZero() && b.expired(e, bd.At.Time) {
			delete(b.states, k)
		}
	}
}
