package refusal

import (
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// RouteProviders is the route rule over any state store: lookup returns the
// provider's state in the segment (false when there is none, or it expired).
// It only reads, so asking never moves the re-probe clock; a probe it allows
// advances the state only if a real refusal comes back. The
// engine's Route stage answers with it.
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

// OutageSkip is the route answer for a provider in an outage:
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
