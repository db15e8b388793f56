package policy

// Fault scope (seed 002, DESIGN.md §4 "Classification", correlation):
// before choosing how to recover, ask where the fault lives. It is a pure
// state machine per provider over classified outcomes on a virtual clock;
// the caller passes `now`.
//
// Per provider it keeps the latest result of every auth profile and every
// model it has seen (forgotten after scope.forget_after without a result),
// and the network-layer failures since the provider's latest success.
//
//   - Outage: every profile seen within scope.window has, as its latest
//     result, a network-layer failure (class scope network: transport,
//     timeout, tls, dns) within the window, and at least
//     scope.outage_min_failures network failures came since the provider's
//     latest success. Failures then become wait_provider (or switch_provider
//     to a healthy scope.failover alternative): switching models only burns
//     time, tokens and rate limit on a dead network path. A health record
//     {state: outage} and a CRITICAL notification go out — the provider's
//     every caller is stuck, crons included, and a human must know even when
//     the day's budget of non-critical notifications is spent.
//   - Recovery: never on one call. The first success during an outage
//     starts a recovery streak (health degraded); a network failure breaks
//     it (health outage again); the streak recovers the provider once it has
//     scope.recovery_min_successes successes spanning at least
//     scope.recovery_min_time (health recovered, a NORMAL notification:
//     good news is not worth paging for). HTTP responses that are failures
//     (401, 500, a refusal) neither extend nor break the streak.
//   - Profile scope: auth or quota_exhausted on one profile while another
//     profile's latest result is a success → switch_profile to it (the most
//     recently successful), and a normal notification per fault episode so
//     a human refreshes the credential. A 429 on one profile while another
//     works → switch_profile, before any retry.
//   - Provider-wide rate limit: at least two profiles seen within the
//     window, every one's latest result a 429 → health degraded, and
//     retries wait for the cooldown (the hint, or the longest cooldown a
//     profile was given), never switch_profile. A success clears it (health
//     healthy).
//   - Model scope: unsupported_param or model_not_found on one model while
//     another model of the provider has a success as its latest result →
//     switch_model to it, with a normal notification per fault episode; when
//     a second model of the provider fails the same way (the fallback too),
//     a critical notification escalates.
//
// Dedupe keys name the episode, so each state is reported once however many
// outcomes, services or replicas see it:
//
//	provider-outage:<provider>:<outage start, epoch ms>
//	provider-recovered:<provider>:<outage start, epoch ms>
//	profile-fault:<provider>:<profile>:<class>:<episode start, epoch ms>
//	model-fault:<provider>:<model>:<episode start, epoch ms>
//	model-fault-escalated:<provider>:<first episode start, epoch ms>:<sorted models>
//
// ProviderState is exported, with msgpack and JSON keys, so a service can
// keep one per provider in a KV bucket and update it with compare-and-set;
// Scope holds many in memory for `failbus simulate` and tests.

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Defaults of the `scope:` policy section.
const (
	// DefaultScopeWindow is how far back results count for correlation.
	DefaultScopeWindow = 5 * time.Minute
	// DefaultScopeOutageMinFailures is how many network failures since the
	// provider's latest success (within the window) an outage needs, so one
	// connection reset is never an outage.
	DefaultScopeOutageMinFailures = 3
	// DefaultScopeRecoveryMinSuccesses is how many successes recover a
	// provider.
	DefaultScopeRecoveryMinSuccesses = 3
	// DefaultScopeRecoveryMinTime is the least time those successes must
	// span.
	DefaultScopeRecoveryMinTime = 2 * time.Minute
	// DefaultScopeForgetAfter is how long a profile or model without any
	// result is still remembered (and may be a switch target).
	DefaultScopeForgetAfter = 24 * time.Hour
)

// ScopeConfig is the `scope:` policy section: the fault-scope thresholds.
type ScopeConfig struct {
	// Window is how far back results count when deciding that every profile
	// fails, or that every profile is rate-limited. Must be > 0. Defaults
	// to 5m.
	Window time.Duration `yaml:"window" json:"window"`
	// OutageMinFailures is the least number of network failures since the
	// provider's latest success, within Window, for an outage. Must be >= 1.
	// Defaults to 3.
	OutageMinFailures int `yaml:"outage_min_failures" json:"outage_min_failures"`
	// RecoveryMinSuccesses is how many successes in a row (network failures
	// break the row) recover a provider from an outage. Must be >= 2: never
	// one lucky call. Defaults to 3.
	RecoveryMinSuccesses int `yaml:"recovery_min_successes" json:"recovery_min_successes"`
	// RecoveryMinTime is the least time between the first and the last of
	// those successes. Must be > 0. Defaults to 2m.
	RecoveryMinTime time.Duration `yaml:"recovery_min_time" json:"recovery_min_time"`
	// ForgetAfter drops a profile or model that had no result for this long:
	// it is no longer known, nor a switch target. Must be >= Window.
	// Defaults to 24h.
	ForgetAfter time.Duration `yaml:"forget_after" json:"forget_after"`
	// Failover lists, per provider, the providers to switch to during its
	// outage, in order; the first one not in an outage is chosen. Empty:
	// agents wait (wait_provider).
	Failover map[string][]string `yaml:"failover" json:"failover,omitempty"`
}

// DefaultScopeConfig returns the documented defaults.
func DefaultScopeConfig() ScopeConfig {
	return ScopeConfig{
		Window:               DefaultScopeWindow,
		OutageMinFailures:    DefaultScopeOutageMinFailures,
		RecoveryMinSuccesses: DefaultScopeRecoveryMinSuccesses,
		RecoveryMinTime:      DefaultScopeRecoveryMinTime,
		ForgetAfter:          DefaultScopeForgetAfter,
	}
}

// Validate reports every problem of the section, each naming its key.
func (c ScopeConfig) Validate() error {
	var errs []error
	if c.Window <= 0 {
		errs = append(errs, fmt.Errorf("scope.window: must be positive, got %s", c.Window))
	}
	if c.OutageMinFailures < 1 {
		errs = append(errs, fmt.Errorf("scope.outage_min_failures: must be >= 1, got %d", c.OutageMinFailures))
	}
	if c.RecoveryMinSuccesses < 2 {
		errs = append(errs, fmt.Errorf("scope.recovery_min_successes: must be >= 2 (never recover on one call), got %d", c.RecoveryMinSuccesses))
	}
	if c.RecoveryMinTime <= 0 {
		errs = append(errs, fmt.Errorf("scope.recovery_min_time: must be positive, got %s", c.RecoveryMinTime))
	}
	if c.ForgetAfter < c.Window {
		errs = append(errs, fmt.Errorf("scope.forget_after: %s is below scope.window %s", c.ForgetAfter, c.Window))
	}
	names := make([]string, 0, len(c.Failover))
	for p := range c.Failover {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		for i, alt := range c.Failover[p] {
			switch alt {
			case "":
				errs = append(errs, fmt.Errorf("scope.failover.%s[%d]: empty provider name", p, i))
			case p:
				errs = append(errs, fmt.Errorf("scope.failover.%s[%d]: a provider cannot fail over to itself", p, i))
			}
		}
	}
	return errors.Join(errs...)
}

// FailoverFor picks the provider to switch to during provider's outage: the
// first configured alternative that down does not report; "" when none.
func (c ScopeConfig) FailoverFor(provider string, down func(provider string) bool) string {
	for _, alt := range c.Failover[provider] {
		if down == nil || !down(alt) {
			return alt
		}
	}
	return ""
}

// ScopeVerdict is what the fault scope says about one failure; DecideRetry
// turns it into an action.
type ScopeVerdict struct {
	// Outage: the provider is down; hold (or fail over), no retry.
	Outage      bool      `json:"outage,omitempty"`
	OutageSince time.Time `json:"outage_since,omitzero"`
	// FailoverProvider is the healthy alternative during an outage, if one
	// is configured.
	FailoverProvider string `json:"failover_provider,omitempty"`
	// SwitchProfile is another profile of the provider whose latest result
	// is a success, set for profile-scope failures (rate_limit, auth,
	// quota_exhausted).
	SwitchProfile string `json:"switch_profile,omitempty"`
	// SwitchModel is another model of the provider whose latest result is a
	// success, set for model faults (unsupported_param, model_not_found).
	SwitchModel string `json:"switch_model,omitempty"`
	// ProviderRateLimited: every profile is rate-limited; wait for the
	// cooldown, never switch profile.
	ProviderRateLimited bool `json:"provider_rate_limited,omitempty"`
	// CooldownUntil is the latest end of a rate-limit hint any profile of
	// the provider was given (zero when unknown).
	CooldownUntil time.Time `json:"cooldown_until,omitzero"`
	// Reason says what the scope saw, in words for the decision's reason.
	Reason string `json:"reason,omitempty"`
}

// ScopeObservation is the result of observing one classified outcome.
type ScopeObservation struct {
	// Verdict is meaningful for failures; zero for successes.
	Verdict ScopeVerdict
	// Health holds the provider's state changes this outcome caused.
	Health []events.Health
	// Notify holds the notification requests it caused (before dedupe and
	// daily budget, which are the notifier's).
	Notify []events.Notification
}

// ScopeEntry is the latest result of one profile or model of a provider.
type ScopeEntry struct {
	LastAt      events.Time `msgpack:"last_at" json:"last_at"`
	LastOK      bool        `msgpack:"last_ok" json:"last_ok"`
	LastClass   string      `msgpack:"last_class" json:"last_class"`
	LastNetwork bool        `msgpack:"last_network,omitempty" json:"last_network,omitempty"`
	// FaultSince starts the current fault episode (auth/quota for a
	// profile, unsupported_param/model_not_found for a model); zero when
	// none. A success ends it.
	FaultSince events.Time `msgpack:"fault_since,omitempty" json:"fault_since,omitzero"`
	// FaultClass is the class that started the episode.
	FaultClass string `msgpack:"fault_class,omitempty" json:"fault_class,omitempty"`
	// CooldownUntil (profiles) is when the latest rate-limit hint expires.
	CooldownUntil events.Time `msgpack:"cooldown_until,omitempty" json:"cooldown_until,omitzero"`
}

// ProviderState is the fault-scope state of one provider. Its zero value
// (with Provider set) is a healthy provider nobody has called yet.
type ProviderState struct {
	Provider string `msgpack:"provider" json:"provider"`
	// Outage is true from outage detection until recovery.
	Outage       bool        `msgpack:"outage,omitempty" json:"outage,omitempty"`
	OutageSince  events.Time `msgpack:"outage_since,omitempty" json:"outage_since,omitzero"`
	OutageReason string      `msgpack:"outage_reason,omitempty" json:"outage_reason,omitempty"`
	// RecoveringSince is the first success of the current recovery streak
	// and RecoverySuccesses its length; zero when no streak runs.
	RecoveringSince   events.Time `msgpack:"recovering_since,omitempty" json:"recovering_since,omitzero"`
	RecoverySuccesses int         `msgpack:"recovery_successes,omitempty" json:"recovery_successes,omitempty"`
	// RateLimited is true while every profile is rate-limited.
	RateLimited bool `msgpack:"rate_limited,omitempty" json:"rate_limited,omitempty"`
	// LastSuccess is the provider's latest success, any profile or model.
	LastSuccess events.Time `msgpack:"last_success,omitempty" json:"last_success,omitzero"`
	// NetFailures are the times of network failures since LastSuccess,
	// oldest first, at most OutageMinFailures of them (all the rule needs).
	NetFailures []events.Time          `msgpack:"net_failures,omitempty" json:"net_failures,omitempty"`
	Profiles    map[string]*ScopeEntry `msgpack:"profiles,omitempty" json:"profiles,omitempty"`
	Models      map[string]*ScopeEntry `msgpack:"models,omitempty" json:"models,omitempty"`
}

// HealthState is the provider's current health as CONTRACT.md names it:
// outage, degraded (recovering from an outage, or rate-limited on every
// profile) or healthy.
func (s *ProviderState) HealthState() string {
	switch {
	case s.Outage && s.RecoverySuccesses > 0:
		return events.HealthDegraded
	case s.Outage:
		return events.HealthOutage
	case s.RateLimited:
		return events.HealthDegraded
	}
	return events.HealthHealthy
}

// scopeNetwork reports whether a classification is a network-layer
// failure: the classifier's scope, else the contract default of the class.
func scopeNetwork(c events.Classification) bool {
	sc := c.Scope
	if sc == "" {
		if info, ok := events.LookupClass(c.Class); ok {
			sc = info.Scope
		}
	}
	return sc == events.ScopeNetwork && c.Class != events.ClassOK
}

// Observe folds one classified outcome at now into the state and returns the
// verdict for it (when it is a failure), the health changes and the
// notification requests. It mutates s; a KV-backed caller writes s back
// with compare-and-set and retries on conflict from a fresh read.
func (s *ProviderState) Observe(cfg ScopeConfig, c events.Classification, now time.Time) ScopeObservation {
	var obs ScopeObservation
	if s.Provider == "" {
		s.Provider = c.Provider
	}
	if s.Profiles == nil {
		s.Profiles = map[string]*ScopeEntry{}
	}
	if s.Models == nil {
		s.Models = map[string]*ScopeEntry{}
	}
	s.forget(cfg, now)

	ok := c.Class == events.ClassOK
	net := scopeNetwork(c)
	at := events.At(now)

	// Profile and model entries.
	pe := s.Profiles[c.Profile]
	if pe == nil {
		pe = &ScopeEntry{}
		s.Profiles[c.Profile] = pe
	}
	pe.LastAt, pe.LastOK, pe.LastClass, pe.LastNetwork = at, ok, c.Class, net
	profileFaultStarted := false
	switch {
	case ok:
		pe.FaultSince, pe.FaultClass, pe.CooldownUntil = events.Time{}, "", events.Time{}
	case c.Class == events.ClassAuth || c.Class == events.ClassQuotaExhausted:
		if pe.FaultSince.IsZero() || pe.FaultClass != c.Class {
			pe.FaultSince, pe.FaultClass = at, c.Class
			profileFaultStarted = true
		}
	case c.Class == events.ClassRateLimit && c.Hints != nil && c.Hints.AfterMS > 0:
		pe.CooldownUntil = events.At(now.Add(time.Duration(c.Hints.AfterMS) * time.Millisecond))
	}
	var me *ScopeEntry
	modelFaultStarted := false
	if c.Model != "" {
		me = s.Models[c.Model]
		if me == nil {
			me = &ScopeEntry{}
			s.Models[c.Model] = me
		}
		me.LastAt, me.LastOK, me.LastClass, me.LastNetwork = at, ok, c.Class, net
		switch {
		case ok:
			me.FaultSince, me.FaultClass = events.Time{}, ""
		case retryModelFault(c.Class):
			if me.FaultSince.IsZero() {
				me.FaultSince, me.FaultClass = at, c.Class
				modelFaultStarted = true
			}
		}
	}

	// Provider-wide counters.
	if ok {
		s.LastSuccess = at
		s.NetFailures = nil
	}
	if net {
		s.NetFailures = append(s.NetFailures, at)
		if n := cfg.OutageMinFailures; n > 0 && len(s.NetFailures) > n {
			s.NetFailures = append([]events.Time(nil), s.NetFailures[len(s.NetFailures)-n:]...)
		}
	}

	s.outageTransitions(cfg, c, now, ok, net, &obs)
	s.rateLimitTransitions(cfg, c, now, ok, &obs)

	if ok {
		return obs
	}
	v := &obs.Verdict
	if s.Outage {
		v.Outage = true
		v.OutageSince = s.OutageSince.Time
		v.Reason = s.OutageReason
	}
	switch c.Class {
	case events.ClassRateLimit, events.ClassAuth, events.ClassQuotaExhausted:
		v.SwitchProfile = scopeWorking(s.Profiles, c.Profile)
	}
	if retryModelFault(c.Class) {
		v.SwitchModel = scopeWorking(s.Models, c.Model)
	}
	if s.RateLimited {
		v.ProviderRateLimited = true
		for _, e := range s.Profiles {
			if e.CooldownUntil.After(v.CooldownUntil) {
				v.CooldownUntil = e.CooldownUntil.Time
			}
		}
	}
	if profileFaultStarted {
		obs.Notify = append(obs.Notify, s.profileFaultNotice(c, pe, v.SwitchProfile, now))
	}
	if modelFaultStarted {
		obs.Notify = append(obs.Notify, s.modelFaultNotice(c, me, v.SwitchModel, now))
		if n, ok := s.modelEscalation(c, now); ok {
			obs.Notify = append(obs.Notify, n)
		}
	}
	return obs
}

// forget drops profiles and models without a result for ForgetAfter.
func (s *ProviderState) forget(cfg ScopeConfig, now time.Time) {
	if cfg.ForgetAfter <= 0 {
		return
	}
	cutoff := now.Add(-cfg.ForgetAfter)
	for k, e := range s.Profiles {
		if e.LastAt.Before(cutoff) {
			delete(s.Profiles, k)
		}
	}
	for k, e := range s.Models {
		if e.LastAt.Before(cutoff) {
			delete(s.Models, k)
		}
	}
}

// active returns the names of profiles with a result within the window,
// sorted.
func (s *ProviderState) active(cfg ScopeConfig, now time.Time) []string {
	cutoff := now.Add(-cfg.Window)
	var out []string
	for k, e := range s.Profiles {
		if !e.LastAt.Before(cutoff) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func (s *ProviderState) outageTransitions(cfg ScopeConfig, c events.Classification, now time.Time, ok, net bool, obs *ScopeObservation) {
	if !s.Outage {
		if !net {
			return
		}
		reason, down := s.outageCondition(cfg, now)
		if !down {
			return
		}
		s.Outage, s.OutageSince, s.OutageReason = true, events.At(now), reason
		s.RecoveringSince, s.RecoverySuccesses = events.Time{}, 0
		s.RateLimited = false
		obs.Health = append(obs.Health, s.health(now, events.HealthOutage, reason))
		obs.Notify = append(obs.Notify, events.Notification{
			DedupeKey: "provider-outage:" + s.Provider + ":" + scopeMillis(s.OutageSince),
			Severity:  events.SeverityCritical,
			Title:     "provider " + s.Provider + " is down",
			Text: fmt.Sprintf("%s. Agents hold (wait_provider) instead of retrying or switching models: every model of %s shares the same broken network path, so switching only burns time, tokens and rate limit. failbus declares %s recovered after %d successes spanning at least %s.",
				scopeSentence(reason), s.Provider, s.Provider, cfg.RecoveryMinSuccesses, cfg.RecoveryMinTime),
			Labels: map[string]string{"provider": s.Provider, "state": events.HealthOutage},
			At:     events.At(now),
		})
		return
	}
	switch {
	case ok:
		if s.RecoverySuccesses == 0 {
			s.RecoveringSince = events.At(now)
		}
		s.RecoverySuccesses++
		span := now.Sub(s.RecoveringSince.Time)
		if s.RecoverySuccesses >= cfg.RecoveryMinSuccesses && span >= cfg.RecoveryMinTime {
			since := s.OutageSince
			reason := fmt.Sprintf("%d successes over %s since %s; the outage began %s and lasted %s",
				s.RecoverySuccesses, span.Round(time.Millisecond), scopeClock(s.RecoveringSince.Time), scopeClock(since.Time), now.Sub(since.Time).Round(time.Millisecond))
			s.Outage, s.OutageSince, s.OutageReason = false, events.Time{}, ""
			s.RecoveringSince, s.RecoverySuccesses = events.Time{}, 0
			obs.Health = append(obs.Health, s.health(now, events.HealthRecovered, reason))
			obs.Notify = append(obs.Notify, events.Notification{
				DedupeKey: "provider-recovered:" + s.Provider + ":" + scopeMillis(since),
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
					scopeClock(s.OutageSince.Time), retryName(c.Profile), cfg.RecoveryMinSuccesses, cfg.RecoveryMinTime)))
		}
	case net:
		if s.RecoverySuccesses > 0 {
			s.RecoveringSince, s.RecoverySuccesses = events.Time{}, 0
			obs.Health = append(obs.Health, s.health(now, events.HealthOutage,
				fmt.Sprintf("recovery interrupted: %s on profile %s", c.Class, retryName(c.Profile))))
		}
	}
}

// outageCondition checks the outage rule and words its evidence.
func (s *ProviderState) outageCondition(cfg ScopeConfig, now time.Time) (string, bool) {
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
	for _, t := range s.NetFailures {
		if !t.Before(cutoff) {
			n++
		}
	}
	if n < cfg.OutageMinFailures {
		return "", false
	}
	names := make([]string, len(profiles))
	for i, p := range profiles {
		names[i] = retryName(p)
	}
	return fmt.Sprintf("every profile (%s) fails at the network layer (%s) within %s, %d network failures since the last success",
		strings.Join(names, ", "), strings.Join(scopeSorted(classes), ", "), cfg.Window, n), true
}

func (s *ProviderState) rateLimitTransitions(cfg ScopeConfig, c events.Classification, now time.Time, ok bool, obs *ScopeObservation) {
	if s.Outage {
		return
	}
	if s.RateLimited {
		if ok {
			s.RateLimited = false
			obs.Health = append(obs.Health, s.health(now, events.HealthHealthy,
				fmt.Sprintf("rate limit cleared: success on profile %s", retryName(c.Profile))))
		}
		return
	}
	if c.Class != events.ClassRateLimit {
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
	s.RateLimited = true
	names := make([]string, len(profiles))
	for i, p := range profiles {
		names[i] = retryName(p)
	}
	obs.Health = append(obs.Health, s.health(now, events.HealthDegraded,
		fmt.Sprintf("rate-limited on every profile (%s): waiting for the cooldown, no profile switching", strings.Join(names, ", "))))
}

func (s *ProviderState) health(now time.Time, state, reason string) events.Health {
	return events.Health{At: events.At(now), Provider: s.Provider, State: state, Reason: reason}
}

func (s *ProviderState) profileFaultNotice(c events.Classification, e *ScopeEntry, target string, now time.Time) events.Notification {
	what := "No other profile of " + s.Provider + " is known to work."
	if target != "" {
		what = "Agents switch to profile " + target + "."
	}
	return events.Notification{
		DedupeKey: "profile-fault:" + s.Provider + ":" + c.Profile + ":" + c.Class + ":" + scopeMillis(e.FaultSince),
		Severity:  events.SeverityNormal,
		Title:     fmt.Sprintf("profile %s of %s fails with %s", retryName(c.Profile), s.Provider, c.Class),
		Text:      fmt.Sprintf("The credential %s of %s fails with %s since %s: refresh or replace it. %s", retryName(c.Profile), s.Provider, c.Class, scopeClock(e.FaultSince.Time), what),
		Labels:    map[string]string{"provider": s.Provider, "profile": c.Profile, "class": c.Class},
		At:        events.At(now),
	}
}

func (s *ProviderState) modelFaultNotice(c events.Classification, e *ScopeEntry, target string, now time.Time) events.Notification {
	what := "No other model of " + s.Provider + " is known to work."
	if target != "" {
		what = "Agents switch to model " + target + "."
	}
	return events.Notification{
		DedupeKey: "model-fault:" + s.Provider + ":" + c.Model + ":" + scopeMillis(e.FaultSince),
		Severity:  events.SeverityNormal,
		Title:     fmt.Sprintf("model %s of %s fails with %s", c.Model, s.Provider, c.Class),
		Text:      fmt.Sprintf("Model %s of %s rejects requests with %s since %s (the model, not the provider: other models are unaffected). %s", c.Model, s.Provider, c.Class, scopeClock(e.FaultSince.Time), what),
		Labels:    map[string]string{"provider": s.Provider, "model": c.Model, "class": c.Class},
		At:        events.At(now),
	}
}

// modelEscalation reports a second (or further) model of the provider in a
// model-fault episode: the fallback fails the same way.
func (s *ProviderState) modelEscalation(c events.Classification, now time.Time) (events.Notification, bool) {
	var models []string
	var first events.Time
	for name, e := range s.Models {
		if e.FaultSince.IsZero() {
			continue
		}
		models = append(models, name)
		if first.IsZero() || e.FaultSince.Before(first.Time) {
			first = e.FaultSince
		}
	}
	if len(models) < 2 {
		return events.Notification{}, false
	}
	sort.Strings(models)
	return events.Notification{
		DedupeKey: "model-fault-escalated:" + s.Provider + ":" + scopeMillis(first) + ":" + strings.Join(models, ","),
		Severity:  events.SeverityCritical,
		Title:     fmt.Sprintf("the fallback model fails too on %s", s.Provider),
		Text:      fmt.Sprintf("Models %s of %s all reject requests with model errors (latest: %s on %s). Switching models did not help; a human must look at the request shape or the provider's API changes.", strings.Join(models, ", "), s.Provider, c.Class, c.Model),
		Labels:    map[string]string{"provider": s.Provider, "models": strings.Join(models, ",")},
		At:        events.At(now),
	}, true
}

// scopeWorking picks another entry whose latest result is a success: the
// most recent one, by name on a tie; "" when none.
func scopeWorking(entries map[string]*ScopeEntry, except string) string {
	best := ""
	var bestAt time.Time
	for name, e := range entries {
		if name == except || !e.LastOK {
			continue
		}
		if best == "" || e.LastAt.After(bestAt) || e.LastAt.Equal(bestAt) && name < best {
			best, bestAt = name, e.LastAt.Time
		}
	}
	return best
}

func scopeSorted(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func scopeMillis(t events.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

func scopeClock(t time.Time) string { return t.UTC().Format(events.JSONTimeLayout) }

// scopeSentence capitalises a reason for use as a sentence.
func scopeSentence(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// Scope holds the fault-scope state of every provider in memory, for
// `failbus simulate` and tests; services keep ProviderState per provider in
// KV and call the same Observe. Not safe for concurrent use.
type Scope struct {
	cfg       ScopeConfig
	providers map[string]*ProviderState
}

// NewScope returns an empty scope running cfg (which should have passed
// Validate).
func NewScope(cfg ScopeConfig) *Scope {
	return &Scope{cfg: cfg, providers: map[string]*ProviderState{}}
}

// Observe folds one classified outcome into its provider's state, and picks
// a failover provider for an outage verdict when one is configured and not
// itself down.
func (sc *Scope) Observe(c events.Classification, now time.Time) ScopeObservation {
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
func (sc *Scope) Down(provider string) bool {
	s := sc.providers[provider]
	return s != nil && s.Outage
}

// State returns the provider's state (nil when never observed). The caller
// must not modify it.
func (sc *Scope) State(provider string) *ProviderState { return sc.providers[provider] }
