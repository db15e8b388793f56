package policy

// Refusal state on a shared bus (seed 000 §5, DESIGN.md §4 "Refusal tiers").
//
// RefusalState is enough for one agent on a virtual clock. On the bus several
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
// Both live in RefusalRecord, the value stored per (segment, provider), beside
// the state and in the same compare-and-set unit. This file is pure: the bus
// service (internal/service/refusals) does the I/O.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// DefaultProbeLease is how long a claimed re-probe keeps other agents off the
// provider for the segment when no refusal ends the claim earlier. It must
// cover one LLM call plus the way of its refusal through the classifier and
// the refusal service; a lease that runs out while a refused probe is still
// on its way lets a second agent probe too.
const DefaultProbeLease = 5 * time.Minute

// RefusalAppliedMax is how many applied refusals a record remembers to
// recognise redeliveries. A refusal redelivered after more than this many
// later refusals of the same (segment, provider) is counted again, which
// can only freeze the provider earlier.
const RefusalAppliedMax = 16

// RefusalClaim is a re-probe in flight: Agent was allowed to send the
// segment to the provider at a due re-probe, and nobody else is until Until
// or until Agent's refusal is recorded.
type RefusalClaim struct {
	Agent string
	Until time.Time
}

// Held reports whether the claim still keeps other agents off at now.
func (c RefusalClaim) Held(now time.Time) bool { return c.Agent != "" && now.Before(c.Until) }

// RefusalApplied is one refusal already applied to a record: its outcome id,
// the event it produced and the provider ids of its notification's dedupe
// key, so a redelivery republishes exactly the same decision and
// notification.
type RefusalApplied struct {
	OutcomeID string
	Event     RefusalEvent
	Peers     []string
}

// RefusalRecord is what the refusal bucket holds per (segment, provider): the
// state, the re-probe claim and the recently applied refusals.
type RefusalRecord struct {
	State   RefusalState
	Claim   RefusalClaim
	Applied []RefusalApplied
}

// AppliedRefusal returns the remembered application of outcomeID, if any.
func (r RefusalRecord) AppliedRefusal(outcomeID string) (RefusalApplied, bool) {
	if outcomeID == "" {
		return RefusalApplied{}, false
	}
	for _, a := range r.Applied {
		if a.OutcomeID == outcomeID {
			return a, true
		}
	}
	return RefusalApplied{}, false
}

// Refused applies one content refusal reported by agent at now
// (RefusalState.OnRefusal) and ends agent's claim: its probe came back
// refused, and the next probe is governed by the new refusal time. Another
// agent's refusal leaves a claim alone, because that agent's probe is still
// on its way. The caller checks AppliedRefusal first and records the result
// with Remember.
func (r RefusalRecord) Refused(agent, scope, increment string, now time.Time, cfg RefusalConfig) (RefusalRecord, RefusalEvent) {
	r.State.Agent = agent
	var ev RefusalEvent
	r.State, ev = r.State.OnRefusal(scope, increment, now, cfg)
	if r.Claim.Agent == agent {
		r.Claim = RefusalClaim{}
	}
	return r, ev
}

// Remember records that outcomeID produced ev (notified with peers), keeping
// the RefusalAppliedMax most recent applications.
func (r RefusalRecord) Remember(outcomeID string, ev RefusalEvent, peers []string) RefusalRecord {
	if outcomeID == "" {
		return r
	}
	applied := append(slices.Clone(r.Applied), RefusalApplied{OutcomeID: outcomeID, Event: ev, Peers: slices.Clone(peers)})
	if n := len(applied) - RefusalAppliedMax; n > 0 {
		applied = applied[n:]
	}
	r.Applied = applied
	return r
}

// RefusalProbe is the route verdict for one provider's record.
type RefusalProbe int

// Route verdicts (RefusalRecord.Probe).
const (
	// ProbeFree: the provider may receive the segment and nothing needs to
	// be written (never refused, a re-render in progress, or the asker
	// already holds the claim).
	ProbeFree RefusalProbe = iota
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
func (p RefusalProbe) String() string {
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
	return fmt.Sprintf("RefusalProbe(%d)", int(p))
}

// Probe decides whether agent may send the segment to the provider at now.
// It never moves the refusal clock; the only change it makes is a claim of
// length lease (DefaultProbeLease when not positive) on a due re-probe.
func (r RefusalRecord) Probe(now time.Time, cfg RefusalConfig, agent string, lease time.Duration) (RefusalRecord, RefusalProbe) {
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
	r.Claim = RefusalClaim{Agent: agent, Until: now.Add(lease)}
	return r, ProbeClaimed
}

// Skip is the route answer for a provider Probe did not allow (ProbeHeld or
// ProbeSkip): the reason the model is told and when to try again. Waiting and
// frozen states are worded by RouteProviders (RefusalNotice); a held claim
// says who probes and until when, followed by the same rule.
func (r RefusalRecord) Skip(now time.Time, cfg RefusalConfig, provider string) RouteSkip {
	if ok, _, _ := r.State.Allow(now, cfg); ok && r.Claim.Held(now) {
		until := events.At(r.Claim.Until)
		return RouteSkip{
			Provider:    provider,
			Reason:      RefusalClaimReason(cfg, provider, r.State, r.Claim),
			NextProbeAt: &until,
		}
	}
	res := RouteProviders(now, cfg, []string{provider}, func(string) (RefusalState, bool) { return r.State, true })
	if len(res.Skipped) == 1 {
		return res.Skipped[0]
	}
	// Allowed after all (asked about a free record): say so rather than
	// invent a reason.
	return RouteSkip{Provider: provider, Reason: provider + " may receive this segment now"}
}

// RefusalClaimReason words a held claim for the model: another agent is
// re-probing provider with this segment, so fall back; the rule comes from
// the same policy values as every other refusal text (RefusalRule).
func RefusalClaimReason(cfg RefusalConfig, provider string, s RefusalState, c RefusalClaim) string {
	return fmt.Sprintf("%s refused this context segment %s; re-probe %d of %d is in flight (agent %s). Fall back to the next provider; if that probe is not refused, %s may be tried again at %s. Rule: %s.",
		provider, refusalTimes(s.Refusals), s.Reprobes()+1, cfg.MaxReprobes(), c.Agent, provider,
		refusalAt(c.Until), RefusalRule(cfg))
}

// RefusalDecision is the decision for the agent whose content_refusal c
// produced ev at at, worded by t (RefusalNotice): rerender with the 1-based
// attempt in retry, or skip_provider with due_at the next probe time (absent
// when frozen). It is what RefusalBook.OnClassified sends, for the bus.
func RefusalDecision(c events.Classification, ev RefusalEvent, t RefusalText, at time.Time) events.Decision {
	d := events.Decision{
		OutcomeID: c.OutcomeID,
		At:        events.At(at),
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
	return d
}

// refusalRecordExtras is the part of the stored record beyond the state:
// extra keys in the same map, so `nats kv get` shows one flat value and a
// reader that knows only RefusalState (DecodeRefusalState) still reads it.
type refusalRecordExtras struct {
	ProbeAgent string               `msgpack:"probe_agent,omitempty" json:"probe_agent,omitempty"`
	ProbeUntil events.Time          `msgpack:"probe_until,omitempty" json:"probe_until,omitempty"`
	Applied    []refusalAppliedWire `msgpack:"applied,omitempty" json:"applied,omitempty"`
}

type refusalAppliedWire struct {
	ID          string      `msgpack:"id" json:"id"`
	Agent       string      `msgpack:"agent,omitempty" json:"agent,omitempty"`
	Action      string      `msgpack:"action" json:"action"`
	Rerender    int         `msgpack:"rerender,omitempty" json:"rerender,omitempty"`
	Refusals    int         `msgpack:"refusals" json:"refusals"`
	Reprobes    int         `msgpack:"reprobes" json:"reprobes"`
	RefusedAt   events.Time `msgpack:"refused_at,omitempty" json:"refused_at,omitempty"`
	NextProbeAt events.Time `msgpack:"next_probe_at,omitempty" json:"next_probe_at,omitempty"`
	Frozen      bool        `msgpack:"frozen,omitempty" json:"frozen,omitempty"`
	Legacy      bool        `msgpack:"legacy,omitempty" json:"legacy,omitempty"`
	Notify      bool        `msgpack:"notify,omitempty" json:"notify,omitempty"`
	Peers       []string    `msgpack:"peers,omitempty" json:"peers,omitempty"`
}

func (r RefusalRecord) extras() refusalRecordExtras {
	x := refusalRecordExtras{ProbeAgent: r.Claim.Agent}
	if r.Claim.Agent != "" {
		x.ProbeUntil = events.At(r.Claim.Until)
	}
	for _, a := range r.Applied {
		e := a.Event
		w := refusalAppliedWire{
			ID: a.OutcomeID, Agent: e.Agent, Action: e.Action, Rerender: e.Rerender,
			Refusals: e.Refusals, Reprobes: e.Reprobes,
			Frozen: e.Frozen, Legacy: e.Legacy, Notify: e.Notify, Peers: a.Peers,
		}
		if !e.RefusedAt.IsZero() {
			w.RefusedAt = events.At(e.RefusedAt)
		}
		if !e.NextProbeAt.IsZero() {
			w.NextProbeAt = events.At(e.NextProbeAt)
		}
		x.Applied = append(x.Applied, w)
	}
	return x
}

func (x refusalRecordExtras) apply(r *RefusalRecord) {
	if x.ProbeAgent != "" {
		r.Claim = RefusalClaim{Agent: x.ProbeAgent, Until: x.ProbeUntil.Time}
	}
	for _, w := range x.Applied {
		r.Applied = append(r.Applied, RefusalApplied{
			OutcomeID: w.ID,
			Peers:     w.Peers,
			Event: RefusalEvent{
				Segment: r.State.Segment, Provider: r.State.Provider, Agent: w.Agent,
				Action: w.Action, Rerender: w.Rerender, Refusals: w.Refusals, Reprobes: w.Reprobes,
				RefusedAt: w.RefusedAt.Time, NextProbeAt: w.NextProbeAt.Time,
				Frozen: w.Frozen, Legacy: w.Legacy, Notify: w.Notify,
			},
		})
	}
}

// EncodeRefusalRecord is the KV value of a record: the state's stored form
// (EncodeRefusalState) with the claim and the applied refusals as extra keys
// (probe_agent, probe_until, applied) in the same msgpack map, keys sorted.
func EncodeRefusalRecord(r RefusalRecord) ([]byte, error) {
	state, err := EncodeRefusalState(r.State)
	if err != nil {
		return nil, err
	}
	fields := map[string]msgpack.RawMessage{}
	if err := msgpack.Unmarshal(state, &fields); err != nil {
		return nil, fmt.Errorf("encode refusal record %s/%s: %w", r.State.Segment, r.State.Provider, err)
	}
	extras, err := msgpack.Marshal(r.extras())
	if err != nil {
		return nil, fmt.Errorf("encode refusal record %s/%s: %w", r.State.Segment, r.State.Provider, err)
	}
	if err := msgpack.Unmarshal(extras, &fields); err != nil {
		return nil, fmt.Errorf("encode refusal record %s/%s: %w", r.State.Segment, r.State.Provider, err)
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(fields); err != nil {
		return nil, fmt.Errorf("encode refusal record %s/%s: %w", r.State.Segment, r.State.Provider, err)
	}
	return buf.Bytes(), nil
}

// DecodeRefusalRecord reads a KV value written by EncodeRefusalRecord, by
// EncodeRefusalState (no claim, nothing applied) or by an operator as JSON.
// The state follows DecodeRefusalState: unreadable means Legacy (frozen),
// returned with the error. Unreadable extra keys are dropped and reported
// in the error too, with the state kept.
func DecodeRefusalRecord(data []byte) (RefusalRecord, error) {
	s, err := DecodeRefusalState(data)
	r := RefusalRecord{State: s}
	if err != nil {
		return r, err
	}
	var x refusalRecordExtras
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		err = json.Unmarshal(t, &x)
	} else {
		err = msgpack.Unmarshal(data, &x)
	}
	if err != nil {
		return r, fmt.Errorf("decode refusal record %s/%s: claim and applied refusals dropped: %w", s.Segment, s.Provider, err)
	}
	x.apply(&r)
	return r, nil
}
