package scope

// The provider-wide transitions of Observe: outage, recovery and the
// rate limit on every profile, each with its health record and notice.

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// outageTransitions moves the provider in and out of an outage. t is the
// outcome's own time: a success older than the outage or the current
// recovery streak does not count toward recovery, and a network failure
// older than the streak does not break it.
func (s *ProviderState) outageTransitions(cfg Config, c events.Classification, now, t time.Time, ok, net, side bool, obs *Observation) {
	if !s.Outage {
		if !side {
			return
		}
		reason, network, down := s.outageCondition(cfg, now)
		if !down {
			return
		}
		s.Outage, s.OutageSince, s.OutageReason = true, events.At(now), reason
		s.RecoveringSince, s.RecoverySuccesses, s.Streak = events.Time{}, 0, nil
		s.RateLimited = false
		s.Erroring, s.ErroringSince = false, events.Time{}
		path := "the same broken network path"
		if !network {
			path = "the same failing provider"
		}
		obs.Health = append(obs.Health, s.health(now, events.HealthOutage, reason))
		obs.Notify = append(obs.Notify, events.Notification{
			DedupeKey: "provider-outage:" + s.Provider + ":" + millis(s.OutageSince),
			Severity:  events.SeverityCritical,
			Title:     "provider " + s.Provider + " is down",
			Text: fmt.Sprintf("%s. Agents hold (wait_provider) instead of retrying or switching models: every model of %s shares %s, so switching only burns time, tokens and rate limit. failbus declares %s recovered after %d successes spanning at least %s.",
				sentence(reason), s.Provider, path, s.Provider, cfg.RecoveryMinSuccesses, cfg.RecoveryMinTime),
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
				s.RecoverySuccesses, span.Round(time.Second), clock(s.RecoveringSince.Time), clock(since.Time), now.Sub(since.Time).Round(time.Second))
			// The failures before the streak were the outage's, which the
			// recovery ends: they do not make the recovered provider
			// "failing a share of its calls" (degraded by errors) the
			// moment it recovers, whichever order the streak's successes
			// arrived in.
			streak := s.RecoveringSince.Time
			s.Calls = slices.DeleteFunc(s.Calls, func(k Call) bool { return k.Fail && k.At.Before(streak) })
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

// outageCondition checks the outage rules and words their evidence:
// every profile seen within the window has a failure on the provider's
// side as its latest result, and either those are network failures and
// at least outage_min_failures of them came since the latest success
// (the network path is down), or at least half of error_sample calls
// came within the window since the latest success, all failing on the
// provider's side (nothing succeeds: the provider itself is down).
// network says which.
func (s *ProviderState) outageCondition(cfg Config, now time.Time) (reason string, network, down bool) {
	profiles := s.active(cfg, now)
	if len(profiles) == 0 {
		return "", false, false
	}
	classes := map[string]bool{}
	network = true
	for _, p := range profiles {
		e := s.Profiles[p]
		if e.LastOK || !e.LastNetwork && !providerSideClass(e.LastClass) {
			return "", false, false
		}
		network = network && e.LastNetwork
		classes[e.LastClass] = true
	}
	cutoff := now.Add(-cfg.Window)
	names := make([]string, len(profiles))
	for i, p := range profiles {
		names[i] = displayName(p)
	}
	if network {
		n := 0
		for _, m := range s.NetFailures {
			if !m.At.Before(cutoff) {
				n++
			}
		}
		if n >= cfg.OutageMinFailures && !s.mostlySucceeding(cfg, now) {
			return fmt.Sprintf("every profile (%s) fails at the network layer (%s) within %s, %d network failures since the last success",
				strings.Join(names, ", "), strings.Join(sortedKeys(classes), ", "), cfg.Window, n), true, true
		}
	}
	failed := 0
	for _, k := range s.Calls {
		if k.Fail && !k.At.Before(cutoff) && k.At.After(s.LastSuccess.Time) {
			failed++
		}
	}
	if failed == 0 || failed < errorCalls(cfg) {
		return "", false, false
	}
	return fmt.Sprintf("every profile (%s) fails on the provider's side (%s): %d calls within %s, none succeeded",
		strings.Join(names, ", "), strings.Join(sortedKeys(classes), ", "), failed, cfg.Window), false, true
}

// mostlySucceeding reports whether the provider's latest calls within
// the window are enough to judge it by (half of error_sample) and fewer
// than error_ratio of them failed: a provider that busy and that healthy
// is not down because a few network failures came in a row, which
// happens by chance once it serves hundreds of calls a second (a fleet
// at 3k calls/s with 10 % scattered network failures met the count rule
// every few seconds). A path that is really down fails every call, and
// the share crosses error_ratio within half a sample; with fewer calls
// in the window the count rule decides alone, as for a single agent.
func (s *ProviderState) mostlySucceeding(cfg Config, now time.Time) bool {
	calls, failed := s.errorShare(cfg, now)
	return calls >= errorCalls(cfg) && float64(failed) < cfg.ErrorRatio*float64(calls)
}

// errorCalls is how many of the provider's calls within the window the
// degraded rule's share needs, and how many failures in a row since the
// latest success are an outage: half of error_sample, rounded up.
func errorCalls(cfg Config) int { return (cfg.ErrorSample + 1) / 2 }

// errorShare counts the provider's latest calls within the window at now,
// and those of them that failed on the provider's side.
func (s *ProviderState) errorShare(cfg Config, now time.Time) (calls, failed int) {
	cutoff := now.Add(-cfg.Window)
	for _, k := range s.Calls {
		if k.At.Before(cutoff) {
			continue
		}
		calls++
		if k.Fail {
			failed++
		}
	}
	return calls, failed
}

// errorTransitions moves the provider in and out of degraded by errors:
// it begins when at least error_ratio of its latest calls within the
// window (at least half of error_sample of them) failed on its side and
// every profile seen within the window had such a failure within it; it
// ends when the share falls below half of error_ratio, or fewer calls
// than that came within the window (checked at each outcome of the
// provider, at its clock). An outage supersedes it.
func (s *ProviderState) errorTransitions(cfg Config, now time.Time, obs *Observation) {
	if s.Outage {
		return
	}
	calls, failed := s.errorShare(cfg, now)
	enough := calls > 0 && calls >= errorCalls(cfg)
	share := float64(failed) / float64(max(calls, 1))
	if !s.Erroring {
		if !enough || share < cfg.ErrorRatio {
			return
		}
		profiles := s.active(cfg, now)
		cutoff := now.Add(-cfg.Window)
		classes := map[string]bool{}
		names := make([]string, len(profiles))
		for i, p := range profiles {
			e := s.Profiles[p]
			if e.ErrorAt.Before(cutoff) {
				return // a profile without such a failure: not the provider's
			}
			classes[e.ErrorClass] = true
			names[i] = displayName(p)
		}
		s.Erroring, s.ErroringSince = true, events.At(now)
		reason := fmt.Sprintf("%d of the latest %d calls within %s failed on the provider's side (%s), on every profile (%s)",
			failed, calls, cfg.Window, strings.Join(sortedKeys(classes), ", "), strings.Join(names, ", "))
		obs.Health = append(obs.Health, s.health(now, events.HealthDegraded, reason))
		obs.Notify = append(obs.Notify, events.Notification{
			DedupeKey: "provider-errors:" + s.Provider + ":" + millis(s.ErroringSince),
			Severity:  events.SeverityNormal,
			Title:     "provider " + s.Provider + " is failing calls",
			Text: fmt.Sprintf("%s. Retries go on (the failures clear with time); switching models does not help, every model of %s runs on the same provider. It is an outage when nothing succeeds (%d calls in a row within %s).",
				sentence(reason), s.Provider, errorCalls(cfg), cfg.Window),
			Labels: map[string]string{"provider": s.Provider, "state": events.HealthDegraded},
			At:     events.At(now),
		})
		return
	}
	why := ""
	switch {
	case !enough:
		why = fmt.Sprintf("errors over: fewer than %d calls within %s", errorCalls(cfg), cfg.Window)
	case share < cfg.ErrorRatio/2:
		why = fmt.Sprintf("errors over: %d of the latest %d calls failed on the provider's side", failed, calls)
	}
	if why == "" {
		return
	}
	s.Erroring, s.ErroringSince = false, events.Time{}
	obs.Health = append(obs.Health, s.health(now, s.HealthState(), why))
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
	obs.Health = append(obs.Health, s.health(now, s.HealthState(), why))
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
