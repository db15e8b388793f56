package scope

import (
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// tracker holds the fault-scope state of every provider in memory for the
// tests, as the engine's stores do (internal/engine: Observe and its failover).
type tracker struct {
	cfg       Config
	providers map[string]*ProviderState
}

// newTracker returns an empty scope running cfg (which should have passed
// Validate).
func newTracker(cfg Config) *tracker {
	return &tracker{cfg: cfg, providers: map[string]*ProviderState{}}
}

// Observe folds one classified outcome into its provider's state, and picks
// a failover provider for an outage verdict when one is configured and not
// itself down.
func (sc *tracker) Observe(c events.Classification, now time.Time) Observation {
	s := sc.providers[c.Provider]
	if s == nil {
		s = &ProviderState{Provider: c.Provider}
		sc.providers[c.Provider] = s
	}
	obs := s.Observe(sc.cfg, c, now)
	if obs.Verdict.Outage {
		obs.Verdict.FailoverProvider = sc.cfg.FailoverFor(c.Provider, sc.Down)
	}
	return obs
}

// Down reports whether provider is in an outage (recovering included).
func (sc *tracker) Down(provider string) bool {
	s := sc.providers[provider]
	return s != nil && s.Outage
}

// State returns the provider's state (nil when never observed). The caller
// must not modify it.
func (sc *tracker) State(provider string) *ProviderState { return sc.providers[provider] }
