package scope

// The provider-wide transitions of Observe: outage, recovery and the
// rate limit on every profile, each with its health record and notice.

import (
	"fmt"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// outageTransitions moves the provider in and out of an outage. t is the
// outcome's own time: a success older than the outage or the current
// recovery streak does not count toward recovery, and a network failure
// older than the streak does not break it.
func (s *ProviderState) outageTransitions(cfg Config, c events.Classification, now, t time.Time, ok, net bool, obs *Observation) {
	if !s.Outage {
		if !net {
			return
		}
		reason, down := s.outageCondition(cfg, now)
		if !down {
			return
		}
		s.Outage, s.OutageSince, s.OutageReason = true, events.At(now), reason
		s.RecoveringSince, s.RecoverySuccesses, s.Streak = events.Time{}, 0, nil
		s.RateLimited = false
		obs.Health = append(obs.Health, s.health(now, events.HealthOutage, reason))
		obs.Notify = append(obs.Notify, events.Notification{
			DedupeKey: "provider-outage:" + s.Provider + ":" + millis(s.OutageSince),
			Severity:  events.SeverityCritical,
			Title:     "provider " + s.Provider + " is down",
			Text: fmt.Sprintf("%s. Agents hold (wait_provider) instead of retrying or switching models: every model of %s shares the same broken network path, so switching only burns time, tokens and rate limit. failbus declares %s recovered after %d successes spanning at least %s.",
				sentence(reason), s.Provider, s.Provider, cfg.RecoveryMinSuccesses, cfg.RecoveryMinTime),
			Labels: map[string]string{"provider": s.Provider, "state": events.HealthOutage},
			At:     events.At(now),
		})
		return
	}
	switch {
	case ok:
		if t.Before(s.OutageSince.Time) || s.RecoverySuccesses > 0 && t.Before(s.RecoveringSince.Time) {
			return // a success from before the outage or before this streak
		}
		if s.RecoverySuccesses == 0 {
			s.RecoveringSince = events.At(now)
		}
		s.RecoverySuccesses++
		s.Streak = append(s.Streak, c.OutcomeID)
		if n := cfg.RecoveryMinSuccesses; n > 0 && len(s.Streak) > n {
			s.Streak = append([]string(nil), s.Streak[len(s.Streak)-n:]...)
		}
		span := now.Sub(s.RecoveringSince.Time)
		if s.RecoverySuccesses >= cfg.RecoveryMinSuccesses && span >= cfg.RecoveryMinTime {
			since := s.OutageSince
			reason := fmt.Sprintf("%d successes over %s since %s; the outage began %s and lasted %s",
				s.RecoverySuccesses, span.Round(time.Millisecond), clock(s.RecoveringSince.Time), clock(since.Time), now.Sub(since.Time).Round(time.Millisecond))
			s.Outage, s.OutageSince, s.OutageReason = false, events.Time{}, ""
			s.RecoveringSince, s.RecoverySuccesses, s.Streak = events.Time{}, 0, nil
			obs.Health = append(obs.Health, s.health(now, events.HealthRecovered, reason))
			obs.Notify = append(obs.Notify, events.Notification{
				DedupeKey: "provider-recovered:" + s.Provider + ":" + millis(since),
				Severity:  events.SeverityNormal,
				Title:     "provider " + s.Provider + " recovered",
				Text:      fmt.Sprintf("%s recovered: %s. Held agents may call it again.", s.Provider, reason),
				Labels:    map[string]string{"provider": s.Provider, "state": events.HealthRecovered},
				At:        events.At(now),
			})
			return
		}
		if s.RecoverySuccesses == 1 {
			obs.Health = append(obs.Health, s.health(now, events.HealthDegraded,
				fmt.Sprintf("recovering: first success since the outage began %s (profile %s); recovered after %d successes spanning at least %s",
					clock(s.OutageSince.Time), displayName(c.Profile), cfg.RecoveryMinSuccesses, cfg.RecoveryMinTime)))
		}
	case net:
		if s.RecoverySuccesses > 0 && !t.Before(s.RecoveringSince.Time) {
			s.RecoveringSince, s.RecoverySuccesses, s.Streak = events.Time{}, 0, nil
			obs.Health = append(obs.Health, s.health(now, events.HealthOutage,
				fmt.Sprintf("recovery interrupted: %s on profile %s", c.Class, displayName(c.Profile))))
		}
	}
}

// outageCondition checks the outage rule and words its evidence.
func (s *ProviderState) outageCondition(cfg Config, now time.Time) (string, bool) {
	profiles := s.active(cfg, now)
	if len(profiles) == 0 {
		return "", false
	}
	classes := map[string]bool{}
	for _, p := range profiles {
		e := s.Profiles[p]
		if e.LastOK || !e.LastNetwork {
			return "", false
		}
		classes[e.LastClass] = true
	}
	cutoff := now.Add(-cfg.Window)
	n := 0
	for _, m := range s.NetFailures {
		if !m.At.Before(cutoff) {
			n++
		}
	}
	if n < cfg.OutageMinFailures {
		return "", false
	}
	names := make([]string, len(profiles))
	for i, p := range profiles {
		names[i] = displayName(p)
	}
	return fmt.Sprintf("every profile (%s) fails at the network layer (%s) within %s, %d network failures since the last success",
		strings.Join(names, ", "), strings.Join(sortedKeys(classes), ", "), cfg.Window, n), true
}

// rateLimitEnd ends a provider-wide rate limit that is over: a success
// (on any profile), a profile seen within the window whose latest result
// is not a 429, fewer than two profiles left within the window (the ones
// it counted fell out of scope.window), or every counted profile's
// cooldown (the hint its latest 429 came with) passed without a new 429.
// A 429 without a hint has no cooldown of its own here (its wait is the
// retry policy's backoff): its profile ends the episode by leaving the
// window. It runs for every outcome, also one older than what its profile
// knows, at the provider's clock: a late outcome brings no news of time.
func (s *ProviderState) rateLimitEnd(cfg Config, c events.Classification, now time.Time, ok bool, obs *Observation) {
	if s.Outage || !s.RateLimited {
		return
	}
	why := ""
	if ok {
		why = fmt.Sprintf("rate limit cleared: success on profile %s", displayName(c.Profile))
	} else {
		why = s.rateLimitOver(cfg, now)
	}
	if why == "" {
		return
	}
	s.RateLimited = false
	obs.Health = append(obs.Health, s.health(now, events.HealthHealthy, why))
}

// rateLimitOver says why the provider-wide rate limit is over at now
// (see rateLimitEnd), "" while it holds.
func (s *ProviderState) rateLimitOver(cfg Config, now time.Time) string {
	profiles := s.active(cfg, now)
	if len(profiles) < 2 {
		return fmt.Sprintf("rate limit over: no 429 on two profiles within scope.window %s", cfg.Window)
	}
	var until time.Time
	known := true
	for _, p := range profiles {
		e := s.Profiles[p]
		if e.LastOK || e.LastClass != events.ClassRateLimit {
			return fmt.Sprintf("rate limit over: profile %s's latest result is %s", displayName(p), e.LastClass)
		}
		if e.CooldownUntil.Before(e.LastAt.Time) {
			known = false // a 429 after its cooldown, without a hint
		}
		if e.CooldownUntil.After(until) {
			until = e.CooldownUntil.Time
		}
	}
	if known && !now.Before(until) {
		return fmt.Sprintf("rate limit over: every profile's cooldown ended by %s without a new 429", clock(until))
	}
	return ""
}

// rateLimitStart begins a provider-wide rate limit: a 429 that makes every
// profile seen within the window (at least two) rate-limited.
func (s *ProviderState) rateLimitStart(cfg Config, c events.Classification, now time.Time, obs *Observation) {
	if s.Outage || s.RateLimited || c.Class != events.ClassRateLimit {
		return
	}
	profiles := s.active(cfg, now)
	if len(profiles) < 2 {
		return
	}
	for _, p := range profiles {
		e := s.Profiles[p]
		if e.LastOK || e.LastClass != events.ClassRateLimit {
			return
		}
	}
	if s.rateLimitOver(cfg, now) != "" {
		return // every cooldown already over: nothing to wait for
	}
	s.RateLimited = true
	names := make([]string, len(profiles))
	for i, p := range profiles {
		names[i] = displayName(p)
	}
	obs.Health = append(obs.Health, s.health(now, events.HealthDegraded,
		fmt.Sprintf("rate-limited on every profile (%s): waiting for the cooldown, no profile switching", strings.Join(names, ", "))))
}

func (s *ProviderState) health(now time.Time, state, reason string) events.Health {
	return events.Health{At: events.At(now), Provider: s.Provider, State: state, Reason: reason}
}
