// Package scope is the fault scope (correlation across outcomes): before choosing how to recover, ask where the fault lives. It is a pure
// state machine per provider over classified outcomes on the provider's own
// clock: the latest own time (`at`) of its outcomes, each believed within
// events.EventTime's bounds around the `now` the caller passes (a stored
// clock already ahead of that now stays). Network failures and successes count at their
// own times, so the order in which outcomes of several agents reach the
// scope, or how far other providers have moved the caller's clock, does
// not decide whether failures are an outage.
//
// Per provider it keeps the latest result of every auth profile and every
// model it has seen (forgotten after scope.forget_after without a result),
// and the network-layer failures since the provider's latest success.
//
//   - Outage: every profile seen within scope.window has, as its latest
//     result, a network-layer failure (class scope network: transport,
//     timeout, tls, dns) within the window, and at least
//     scope.outage_min_failures network failures came since the provider's
//     latest success — unless half of scope.error_sample of its latest
//     calls lie within the window and fewer than scope.error_ratio of them
//     failed (a busy provider meets a few failures in a row by chance).
//     Failures then become wait_provider (or switch_provider
//     to a healthy scope.failover alternative): switching models only burns
//     time, tokens and rate limit on a dead network path. A health record
//     {state: outage} and a CRITICAL notification go out — the provider's
//     every caller is stuck, crons included, and a human must know even when
//     the day's budget of non-critical notifications is spent.
//   - Nothing succeeds: every profile seen within scope.window has, as its
//     latest result, a failure on the provider's side (overloaded,
//     server_error, or network), and at least half of scope.error_sample
//     calls (20) came within the window since the provider's latest
//     success, all such failures: rare by chance even for a provider
//     failing most calls (a false outage holds every agent until the
//     recovery streak), and out of reach of one agent retrying alone,
//     whose retry chain decides. The provider itself is down (a provider-level fault is
//     the provider failing, not only its sockets): an outage as
//     above, with its reason naming the classes.
//   - Degraded by errors: at least scope.error_ratio of the provider's
//     latest calls (scope.error_sample of them, at least half within the
//     window) failed on its side, and every profile seen within the window
//     had such a failure within it → health degraded and a normal
//     notification; retries go on. It ends when the share falls below half
//     of error_ratio or too few calls came within the window (checked at
//     each outcome, at the provider's clock); an outage supersedes it.
//   - Recovery: never on one call. The first success during an outage
//     starts a recovery streak (health degraded); a network failure breaks
//     it (health outage again); the streak recovers the provider once it has
//     scope.recovery_min_successes successes spanning at least
//     scope.recovery_min_time (health recovered, a NORMAL notification:
//     good news is not worth paging for). The outage's failures (own
//     time before the streak began) then leave the latest calls, so the
//     recovered provider is not degraded by errors on them. HTTP responses that are failures
//     (401, 500, a refusal) neither extend nor break the streak.
//   - Profile scope: auth or quota_exhausted on one profile while another
//     profile's latest result is a success → switch_profile to it (the most
//     recently successful), and a normal notification per fault episode so
//     a human refreshes the credential. A 429 on one profile while another
//     works → switch_profile, before any retry. The target is only ever a
//     named profile the failing outcome's agent reported itself (a profile
//     remembers its latest scope.max_agents_per_profile agents): another
//     agent's credential is not one this agent holds (CONTRACT.md), so
//     without one of its own the agent retries after the cooldown.
//   - Provider-wide rate limit: at least two profiles seen within the
//     window, every one's latest result a 429 → health degraded, and
//     retries wait for the cooldown (the hint, or the longest cooldown a
//     profile was given), never switch_profile. It ends (health healthy)
//     at a success, when a profile seen within the window has a latest
//     result other than a 429, when fewer than two profiles are left
//     within the window (the ones it counted fell out of scope.window), or
//     when every counted profile's cooldown (the hint of its latest 429)
//     has passed without a new 429 — checked at each outcome of the
//     provider (at the provider's clock: a late outcome, older than what
//     its profile knows, does not move it), so it never stays degraded on
//     stale evidence.
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
//	provider-errors:<provider>:<degraded since, epoch ms>
//
// ProviderState is the stored value, with msgpack and JSON keys: the engine
// (internal/engine) keeps one per provider in its Providers store — one KV key
// per provider, updated with compare-and-set, shared by every scheduler
// replica (FAILBUS_SCOPE), or memory in simulate — and Observe is
// idempotent per outcome, so redelivery and replicas never count twice.
package scope

import (
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Verdict is what the fault scope says about one failure; retry.Decide
// turns it into an action.
type Verdict struct {
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

// Observation is the result of observing one classified outcome.
type Observation struct {
	// Verdict is meaningful for failures; zero for successes.
	Verdict Verdict
	// Health holds the provider's state changes this outcome caused.
	Health []events.Health
	// Notify holds the notification requests it caused (before dedupe and
	// daily budget, which are the notifier's).
	Notify []events.Notification
	// Evicted counts the profile and model entries dropped to keep the
	// provider's state within Config.MaxProfiles and MaxModels (a metric
	// says so).
	Evicted int
}

// ModelFault reports the model-scope classes that switching the model can
// fix (schema errors, unsupported parameters, unknown model): the
// classes a model-fault episode is made of, and the ones the retry chain
// answers with switch_model.
func ModelFault(class string) bool {
	return class == events.ClassUnsupportedParam || class == events.ClassModelNotFound
}

// displayName renders an empty profile or model name readably.
func displayName(s string) string {
	if s == "" {
		return "(unnamed)"
	}
	return s
}
