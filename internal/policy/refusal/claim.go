package refusal

// Refusal state on a shared bus.
//
// State is enough for one agent on a virtual clock. On the bus several
// agents may work on one segment, and the refusal service may run a message
// twice (at-least-once delivery). Two things keep the worst case at four
// sends per segment there:
//
//   - A probe claim: when a re-probe comes due, the first agent to route the
//     segment claims it for ProbeLease; every other agent is told to fall
//     back until that probe's refusal is recorded (which ends the claim) or
//     the lease runs out (the probe was not refused). Without it, two agents
//     asking at the same moment would both be allowed, and both sends would
//     reach the provider.
//   - A short memory of applied refusals: a redelivered refusal is found by
//     its outcome id and answered with the event it produced the first time,
//     so it is neither counted twice nor worded differently.
//
// Both live in Record, the value stored per (segment, provider), beside
// the state and in the same compare-and-set unit. This file is pure: the bus
// service (internal/service/refusals) does the I/O.

import (
	"fmt"
	"slices"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// DefaultProbeLease is how long a claimed re-probe keeps other agents off the
// provider for the segment when no refusal ends the claim earlier. It must
// cover one LLM call plus the way of its refusal through the classifier and
// the refusal service; a lease that runs out while a refused probe is still
// on its way lets a second agent probe too.
const DefaultProbeLease = 5 * time.Minute

// AppliedMax is how many applied refusals a record remembers to
// recognise redeliveries. A refusal redelivered after more than this many
// later refusals of the same (segment, provider) is counted again, which
// can only freeze the provider earlier.
const AppliedMax = 16

// Claim is a re-probe in flight: Agent was allowed to send the
// segment to the provider at a due re-probe, and nobody else is until Until
// or until Agent's refusal is recorded.
type Claim struct {
	Agent string
	Until time.Time
}

// Held reports whether the claim still keeps other agents off at now.
func (c Claim) Held(now time.Time) bool { return c.Agent != "" && now.Before(c.Until) }

// Applied is one refusal already applied to a record: its outcome id,
// the event it produced and the provider ids of its notification's dedupe
// key, so a redelivery republishes exactly the same decision and
// notification.
type Applied struct {
	OutcomeID string
	Event     Event
	Peers     []string
}

// Record is what the refusal bucket holds per (segment, provider): the
// state, the re-probe claim and the recently applied refusals.
type Record struct {
	State   State
	Claim   Claim
	Applied []Applied
}

// AppliedRefusal returns the remembered application of outcomeID, if any.
func (r Record) AppliedRefusal(outcomeID string) (Applied, bool) {
	if outcomeID == "" {
		return Applied{}, false
	}
	for _, a := range r.Applied {
		if a.OutcomeID == outcomeID {
			return a, true
		}
	}
	return Applied{}, false
}

// Refused applies one content refusal reported by agent at now
// (State.OnRefusal) and ends agent's claim: its probe came back
// refused, and the next probe is governed by the new refusal time. Another
// agent's refusal leaves a claim alone, because that agent's probe is still
// on its way. The caller checks AppliedRefusal first and records the result
// with Remember.
func (r Record) Refused(agent, scope, increment string, now time.Time, cfg Config) (Record, Event) {
	r.State.Agent = agent
	var ev Event
	r.State, ev = r.State.OnRefusal(scope, increment, now, cfg)
	if r.Claim.Agent == agent {
		r.Claim = Claim{}
	}
	return r, ev
}

// Remember records that outcomeID produced ev (notified with peers), keeping
// the AppliedMax most recent applications.
func (r Record) Remember(outcomeID string, ev Event, peers []string) Record {
	if outcomeID == "" {
		return r
	}
	applied := append(slices.Clone(r.Applied), Applied{OutcomeID: outcomeID, Event: ev, Peers: slices.Clone(peers)})
	if n := len(applied) - AppliedMax; n > 0 {
		applied = applied[n:]
	}
	r.Applied = applied
	return r
}

// ProbeVerdict is the route verdict for one provider's record.
type ProbeVerdict int

// Route verdicts (Record.Probe).
const (
	// ProbeFree: the provider may receive the segment and nothing needs to
	// be written (never refused, a re-render in progress, or the asker
	// already holds the claim).
	ProbeFree ProbeVerdict = iota
	// ProbeClaimed: a re-probe is due and the asker may make it; the
	// returned record holds the asker's claim and must be stored (compare
	// and set) before the answer is given.
	ProbeClaimed
	// ProbeHeld: a re-probe is due but another agent holds the claim.
	ProbeHeld
	// ProbeSkip: not before the next probe time, or frozen.
	ProbeSkip
)

// String names the verdict for logs and metrics.
func (p ProbeVerdict) String() string {
	switch p {
	case ProbeFree:
		return "free"
	case ProbeClaimed:
		return "claimed"
	case ProbeHeld:
		return "held"
	case ProbeSkip:
		return "skip"
	}
	return fmt.Sprintf("ProbeVerdict(%d)", int(p))
}

// Probe decides whether agent may send the segment to the provider at now.
// It never moves the refusal clock; the only change it makes is a claim of
// length lease (DefaultProbeLease when not positive) on a due re-probe.
func (r Record) Probe(now time.Time, cfg Config, agent string, lease time.Duration) (Record, ProbeVerdict) {
	ok, _, _ := r.State.Allow(now, cfg)
	switch {
	case !ok:
		return r, ProbeSkip
	case r.State.Refusals <= 0:
		return r, ProbeFree
	case r.Claim.Held(now) && r.Claim.Agent != agent:
		return r, ProbeHeld
	case r.Claim.Held(now):
		return r, ProbeFree
	}
	if lease <= 0 {
		lease = DefaultProbeLease
	}
	r.Claim = Claim{Agent: agent, Until: now.Add(lease)}
	return r, ProbeClaimed
}

// Skip is the route answer for a provider Probe did not allow (ProbeHeld or
// ProbeSkip): the reason the model is told and when to try again. Waiting and
// frozen states are worded by RouteProviders (Notice); a held claim
// says who probes and until when, followed by the same rule.
func (r Record) Skip(now time.Time, cfg Config, provider string) events.RouteSkip {
	if ok, _, _ := r.State.Allow(now, cfg); ok && r.Claim.Held(now) {
		until := events.At(r.Claim.Until)
		return events.RouteSkip{
			Provider:    provider,
			Reason:      ClaimReason(cfg, provider, r.State, r.Claim),
			NextProbeAt: &until,
		}
	}
	res := RouteProviders(now, cfg, []string{provider}, func(string) (State, bool) { return r.State, true })
	if len(res.Skipped) == 1 {
		return res.Skipped[0]
	}
	// Allowed after all (asked about a free record): say so rather than
	// invent a reason.
	return events.RouteSkip{Provider: provider, Reason: provider + " may receive this segment now"}
}

// ClaimReason words a held claim for the model: another agent is
// re-probing provider with this segment, so fall back; the rule comes from
// the same policy values as every other refusal text (Rule).
func ClaimReason(cfg Config, provider string, s State, c Claim) string {
	return fmt.Sprintf("%s refused this context segment %s; re-probe %d of %d is in flight (agent %s). Fall back to the next provider; if that probe is not refused, %s may be tried again at %s. Rule: %s.",
		provider, refusalTimes(s.Refusals), s.Reprobes()+1, cfg.MaxReprobes(), c.Agent, provider,
		refusalAt(c.Until), Rule(cfg))
}

// Decision is the decision for the agent whose content_refusal c
// produced ev at at, worded by t (Notice): rerender with the 1-based
// attempt in retry, or skip_provider with due_at the next probe time (absent
// when frozen). It is what the engine's Refuse stage decides.
func Decision(c events.Classification, ev Event, t Text, at time.Time) events.Decision {
	d := events.Decision{
		OutcomeID: c.OutcomeID,
		At:        events.At(at),
		Agent:     c.Agent,
		Action:    ev.Action,
		Reason:    t.Reason,
		Class:     c.Class,
		Rule:      c.Rule,
		Provider:  c.Provider,
		Model:     c.Model,
		Profile:   c.Profile,
		Retry:     ev.Rerender,
	}
	if !ev.NextProbeAt.IsZero() {
		d.DueAt = events.At(ev.NextProbeAt)
	}
	return d
}
