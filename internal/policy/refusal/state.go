package refusal

import (
	"slices"
	"strconv"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// State is one provider's refusal record in one context segment: the
// count of real refusals and the time of the latest one. It is
// the value stored per (segment, provider), in KV or in memory. All
// transitions are pure methods that return a new value, so the bus service
// can apply them under compare-and-set and the simulator in memory, with the
// same result.
type State struct {
	// Segment is the context-segment key `<session>#<segment>`.
	Segment string
	// Provider is the provider id as the agent reported it.
	Provider string
	// Agent is the agent that reported the latest refusal, for humans only;
	// the state is shared by every agent working on the segment.
	Agent string
	// Refusals counts real refusals of the segment by the provider. Zero
	// means the segment was never refused as history (an increment may still
	// be in its re-render phase).
	Refusals int
	// RefusedAt is the time of the latest real refusal. A later refusal
	// moves it forward, an older one reported late never moves it back.
	RefusedAt events.Time
	// Increment identifies the refused increment being re-rendered
	// (Increment); Rerenders is how many rerender decisions it got.
	Increment string
	Rerenders int
	// Legacy is set when a stored value lacked the refusal count or could
	// not be read: nothing is known, so the state is frozen until a
	// boundary (the most conservative reading that a boundary can still
	// undo). It is never written as such: it is the absence of
	// `refusals` in the stored value.
	Legacy bool
}

// Refusal scopes (CONTRACT.md Outcome.refusal_scope).
const (
	// ScopeIncrement is new, not yet accepted content (a tool result,
	// an external event): it can be quarantined or re-rendered.
	ScopeIncrement = "increment"
	// ScopeHistory is accepted history: only a boundary removes it.
	ScopeHistory = "history"
)

// Increment names the increment a refusal is about: the new content of
// one (turn, step). A rerender retries the same turn and step, so its refusal
// counts against the same increment; a later step is a new increment.
func Increment(turn, step int) string {
	return strconv.Itoa(turn) + "." + strconv.Itoa(step)
}

// Reprobes is max(0, refusals-1): how many re-probes were already refused.
func (s State) Reprobes() int { return max(0, s.Refusals-1) }

// Frozen reports whether the provider may no longer receive the segment until
// a boundary: the re-probes are used up, the stored value was legacy or
// unreadable, or it has refusals but no readable refusal time to measure the
// next delay from.
func (s State) Frozen(cfg Config) bool {
	if s.Legacy {
		return true
	}
	if s.Refusals <= 0 {
		return false
	}
	return s.RefusedAt.IsZero() || s.Reprobes() >= cfg.MaxReprobes()
}

// NextProbeAt is refused_at + reprobe_delays[reprobes]: when the provider may
// receive the segment again. It is zero when the provider was never refused
// in the segment or is frozen.
func (s State) NextProbeAt(cfg Config) time.Time {
	if s.Refusals <= 0 || s.Frozen(cfg) {
		return time.Time{}
	}
	return s.RefusedAt.Add(cfg.ReprobeDelays[s.Reprobes()])
}

// Allow answers whether the provider may receive the segment at now. It only
// reads: a skipped turn never moves the clock, and a probe it allows is
// counted only if a real refusal comes back (Refuse). next is the time the
// provider becomes eligible when ok is false and it is not frozen.
func (s State) Allow(now time.Time, cfg Config) (ok bool, next time.Time, frozen bool) {
	if s.Frozen(cfg) {
		return false, time.Time{}, true
	}
	if s.Refusals <= 0 {
		return true, time.Time{}, false
	}
	next = s.NextProbeAt(cfg)
	if now.Before(next) {
		return false, next, false
	}
	return true, time.Time{}, false
}

// Event is what one refusal did to a state, and all that the words
// (Notice) and the decision need: the action for the agent, the
// counts, the schedule and whether a human is told.
type Event struct {
	// Segment, Provider and Agent identify whose refusal it was.
	Segment  string
	Provider string
	Agent    string
	// Action is events.ActionRerender or events.ActionSkipProvider.
	Action string
	// Rerender is the 1-based re-render attempt for ActionRerender.
	Rerender int
	// Refusals and Reprobes are the counts after the refusal.
	Refusals int
	Reprobes int
	// RefusedAt is the latest real refusal after the transition.
	RefusedAt time.Time
	// NextProbeAt is when the provider may receive the segment again; zero
	// when frozen or for a rerender.
	NextProbeAt time.Time
	// Frozen is set when the provider may not receive the segment again
	// before a boundary; Legacy when that is because of a legacy record.
	Frozen bool
	Legacy bool
	// Notify is set only at the first refusal (reprobes 0, normal severity)
	// and at the transition to frozen (critical).
	Notify bool
}

// Severity is the notification severity of the event: critical when it froze
// the provider (bypasses the daily budget: the one moment a human must act),
// normal otherwise.
func (e Event) Severity() string {
	if e.Frozen {
		return events.SeverityCritical
	}
	return events.SeverityNormal
}

// OnRefusal applies one content refusal reported at now. scope is the
// outcome's refusal_scope and increment its Increment.
//
// A refusal of an increment (new, not yet accepted content) while the
// segment's history was never refused by this provider is answered with
// rerender, at most cfg.MaxRerenders times for the same increment; it does
// not touch the refusal count, because after a re-render those bytes are no
// longer in the request. Past that bound, for history, for an unknown scope,
// and for any refusal once the history is already refused (the refused bytes
// are in the request anyway), it is a real refusal: Refuse.
func (s State) OnRefusal(scope, increment string, now time.Time, cfg Config) (State, Event) {
	if scope == ScopeIncrement && s.Refusals <= 0 && !s.Legacy {
		if s.Increment != increment {
			s.Increment, s.Rerenders = increment, 0
		}
		if s.Rerenders < cfg.MaxRerenders {
			s.Rerenders++
			return s, Event{
				Segment: s.Segment, Provider: s.Provider, Agent: s.Agent,
				Action: events.ActionRerender, Rerender: s.Rerenders,
				RefusedAt: s.RefusedAt.Time,
			}
		}
	}
	return s.Refuse(now, cfg)
}

// Refuse records one real refusal at now: the count goes up by one and the
// refusal time moves to now unless a later refusal is already recorded. This
// is the only transition that moves the re-probe clock. The event notifies at
// the first refusal and when the provider becomes frozen, never otherwise
// (a legacy record is already frozen and does not notify again).
func (s State) Refuse(now time.Time, cfg Config) (State, Event) {
	if s.Refusals > 0 && s.RefusedAt.IsZero() {
		s.Legacy = true // a count without a time: nothing to measure from
	}
	wasFrozen := s.Frozen(cfg)
	if !s.Legacy {
		s.Refusals++
	}
	if s.RefusedAt.IsZero() || now.After(s.RefusedAt.Time) {
		s.RefusedAt = events.At(now)
	}
	frozen := s.Frozen(cfg)
	ev := Event{
		Segment: s.Segment, Provider: s.Provider, Agent: s.Agent,
		Action:    events.ActionSkipProvider,
		Refusals:  s.Refusals,
		Reprobes:  s.Reprobes(),
		RefusedAt: s.RefusedAt.Time,
		Frozen:    frozen,
		Legacy:    s.Legacy,
	}
	ev.NextProbeAt = s.NextProbeAt(cfg)
	ev.Notify = !s.Legacy && (s.Refusals == 1 || frozen && !wasFrozen)
	return s, ev
}

// View describes the state at now as an event without changing it, so a
// route answer is worded by the same function as a refusal (Notice).
func (s State) View(now time.Time, cfg Config) Event {
	ok, next, frozen := s.Allow(now, cfg)
	ev := Event{
		Segment: s.Segment, Provider: s.Provider, Agent: s.Agent,
		Refusals: s.Refusals, Reprobes: s.Reprobes(), RefusedAt: s.RefusedAt.Time,
		Frozen: frozen, Legacy: s.Legacy, NextProbeAt: next,
	}
	if !ok {
		ev.Action = events.ActionSkipProvider
	}
	return ev
}

// refusalTier is the notification tier of a state: 0 for a first refusal,
// cfg.MaxReprobes() when frozen by count, and false for states that never
// notify (re-probing in between, legacy, re-render only).
func refusalTier(s State, cfg Config) (int, bool) {
	switch {
	case s.Legacy || s.Refusals <= 0:
		return 0, false
	case s.Frozen(cfg):
		return cfg.MaxReprobes(), true
	case s.Reprobes() == 0:
		return 0, true
	}
	return 0, false
}

// Peers returns the sorted ids of the segment's providers in the same
// notification tier as ev (first refusal, or frozen), ev's provider included:
// the `<sorted provider ids>` of the dedupe key. Each provider enters each
// tier once per segment and tiers only grow, so every notifying event gets a
// key no earlier event of the segment had, and two providers freezing at
// different times are both reported. states are the segment's current states
// (ev's provider's new state among them or not).
func Peers(cfg Config, ev Event, states []State) []string {
	want := 0
	if ev.Frozen {
		want = cfg.MaxReprobes()
	}
	ids := []string{ev.Provider}
	for _, s := range states {
		if s.Segment != ev.Segment || s.Provider == ev.Provider {
			continue
		}
		if t, ok := refusalTier(s, cfg); ok && t == want && s.Frozen(cfg) == ev.Frozen {
			ids = append(ids, s.Provider)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
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
