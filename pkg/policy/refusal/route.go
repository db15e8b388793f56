package refusal

import (
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// RouteProviders is the route rule over any state store: lookup returns the
// provider's state in the segment (false when there is none, or it expired).
// It only reads, so asking never moves the re-probe clock; a probe it allows
// advances the state only if a real refusal comes back (seed 000 §5). The
// Book and the KV-backed route service both answer with it.
func RouteProviders(now time.Time, cfg Config, providers []string, lookup func(provider string) (State, bool)) events.RouteResult {
	res := events.RouteResult{Allowed: []string{}, Skipped: []events.RouteSkip{}}
	for _, p := range providers {
		s, found := lookup(p)
		if !found {
			res.Allowed = append(res.Allowed, p)
			continue
		}
		ok, next, frozen := s.Allow(now, cfg)
		if ok {
			res.Allowed = append(res.Allowed, p)
			continue
		}
		if s.Provider == "" {
			s.Provider = p
		}
		skip := events.RouteSkip{
			Provider: p,
			Reason:   Notice(cfg, s.View(now, cfg), nil).Reason,
			Frozen:   frozen,
		}
		if !next.IsZero() {
			t := events.At(next)
			skip.NextProbeAt = &t
		}
		res.Skipped = append(res.Skipped, skip)
	}
	return res
}

// Route answers which of providers, in order, may receive the segment
// `<session>#<segment>` now, as the bus's route service does
// (Record.Probe): a provider never refused, or re-rendering, is
// allowed; one waiting for its next probe or frozen is skipped with its
// reason (Notice); a due re-probe is claimed for agent for
// DefaultProbeLease, so another agent asking before agent's refusal comes
// back is skipped with next_probe_at at the lease's end. It never moves a
// refusal clock: besides the claim, its only write is the TTL refresh of
// TouchDue, which keeps a segment that is still routed from expiring.
// Refusal state belongs to the segment and is shared by every agent on it.
func (b *Book) Route(now time.Time, agent, session string, segment int, providers []string) events.RouteResult {
	res := events.RouteResult{Allowed: []string{}, Skipped: []events.RouteSkip{}}
	for _, p := range providers {
		k := refusalBookKey{session, segment, p}
		e, ok := b.states[k]
		if !ok || b.expired(e, now) {
			res.Allowed = append(res.Allowed, p)
			continue
		}
		rec := e.rec
		if rec.State.Provider == "" {
			rec.State.Provider = p
		}
		if rec.State.Segment == "" {
			rec.State.Segment = events.SegmentKey(session, segment)
		}
		next, verdict := rec.Probe(now, b.cfg, agent, DefaultProbeLease)
		switch {
		case verdict == ProbeClaimed:
			b.states[k] = refusalEntry{rec: next, written: now}
		case TouchDue(e.written, now, b.cfg):
			b.states[k] = refusalEntry{rec: e.rec, written: now}
		}
		switch verdict {
		case ProbeFree, ProbeClaimed:
			res.Allowed = append(res.Allowed, p)
		default:
			res.Skipped = append(res.Skipped, rec.Skip(now, b.cfg, p))
		}
	}
	return res
}

// OutageSkip is the route answer for a provider in an outage (seed 002):
// nothing can reach it now, whatever the segment's refusal state, so it is
// skipped without claiming a re-probe. Simulate and the bus route service
// both answer with it, from the fault scope and from the provider's latest
// health record respectively.
func OutageSkip(provider, reason string) events.RouteSkip {
	if reason == "" {
		reason = "all profiles fail at the network layer"
	}
	return events.RouteSkip{Provider: provider, Reason: "provider outage: " + reason + "; wait until its health says recovered"}
}
