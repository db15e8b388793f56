package scope

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// Defaults of the `scope:` policy section.
const (
	// DefaultWindow is how far back results count for correlation.
	DefaultWindow = 5 * time.Minute
	// DefaultOutageMinFailures is how many network failures since the
	// provider's latest success (within the window) an outage needs, so one
	// connection reset is never an outage.
	DefaultOutageMinFailures = 3
	// DefaultRecoveryMinSuccesses is how many successes recover a
	// provider.
	DefaultRecoveryMinSuccesses = 3
	// DefaultRecoveryMinTime is the least time those successes must
	// span.
	DefaultRecoveryMinTime = 2 * time.Minute
	// DefaultForgetAfter is how long a profile or model without any
	// result is still remembered (and may be a switch target).
	DefaultForgetAfter = 24 * time.Hour
	// DefaultMaxProfiles and DefaultMaxModels bound the profiles and
	// models one provider's state remembers: names come from agents.
	DefaultMaxProfiles = 256
	DefaultMaxModels   = 256
	// DefaultErrorRatio is the share of the provider's latest calls that
	// failed on the provider's side at which it is degraded.
	DefaultErrorRatio = 0.5
	// DefaultErrorSample is how many of the provider's latest calls that
	// share is taken over.
	DefaultErrorSample = 40
	// DefaultMaxAgentsPerProfile bounds the agents a profile remembers
	// as having reported it (its possible switch_profile recipients).
	DefaultMaxAgentsPerProfile = 32
)

// Config is the `scope:` policy section: the fault-scope thresholds.
type Config struct {
	// Window is how far back results count when deciding that every profile
	// fails, or that every profile is rate-limited. Must be > 0. Defaults
	// to 5m.
	Window time.Duration `yaml:"window" json:"window"`
	// OutageMinFailures is the least number of network failures since the
	// provider's latest success, within Window, for an outage; when at
	// least half of ErrorSample of its latest calls lie within Window,
	// ErrorRatio of them must have failed too (a busy provider meets a few
	// failures in a row by chance). Must be >= 1. Defaults to 3.
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
	// MaxProfiles and MaxModels bound how many profiles and models of one
	// provider are remembered; a new one past the bound drops the least
	// recently seen (counted). Must be >= 1. Default to 256 each.
	MaxProfiles int `yaml:"max_profiles" json:"max_profiles"`
	MaxModels   int `yaml:"max_models" json:"max_models"`
	// ErrorRatio is the share of the provider's latest calls (ErrorSample
	// of them, within Window) that failed on the provider's side —
	// overloaded, server_error, or at the network layer — at which the
	// provider is degraded, when the failures reached every profile seen
	// within Window. It is degraded until the share falls below half of
	// it. Must be within (0, 1]. Defaults to 0.5.
	ErrorRatio float64 `yaml:"error_ratio" json:"error_ratio"`
	// ErrorSample is how many of the provider's latest calls the share is
	// taken over; it counts once at least half of them lie within Window
	// (40: a provider failing 57 % of its calls does not drift below half
	// the ratio by chance, so its degraded state does not flap). When
	// half of them came within Window since the latest success, all
	// failing on the provider's side, and every profile's latest result is
	// such a failure, nothing succeeds: an outage. Must be >= 2. Defaults
	// to 40.
	ErrorSample int `yaml:"error_sample" json:"error_sample"`
	// MaxAgentsPerProfile bounds the agents a profile remembers as having
	// reported it: switch_profile names a profile only to an agent that
	// reported it (or declared it), and an agent it forgot gets a retry
	// instead. Must be >= 1. Defaults to 32.
	MaxAgentsPerProfile int `yaml:"max_agents_per_profile" json:"max_agents_per_profile"`
	// Failover lists, per provider, the providers to switch to during its
	// outage, in order; the first one not in an outage is chosen. Empty:
	// agents wait (wait_provider).
	Failover map[string][]string `yaml:"failover" json:"failover,omitempty"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		Window:               DefaultWindow,
		OutageMinFailures:    DefaultOutageMinFailures,
		RecoveryMinSuccesses: DefaultRecoveryMinSuccesses,
		RecoveryMinTime:      DefaultRecoveryMinTime,
		ForgetAfter:          DefaultForgetAfter,
		MaxProfiles:          DefaultMaxProfiles,
		MaxModels:            DefaultMaxModels,
		ErrorRatio:           DefaultErrorRatio,
		ErrorSample:          DefaultErrorSample,
		MaxAgentsPerProfile:  DefaultMaxAgentsPerProfile,
	}
}

// Validate reports every problem of the section, each naming its key.
func (c Config) Validate() error {
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
	if c.MaxProfiles < 1 {
		errs = append(errs, fmt.Errorf("scope.max_profiles: must be >= 1, got %d", c.MaxProfiles))
	}
	if c.MaxModels < 1 {
		errs = append(errs, fmt.Errorf("scope.max_models: must be >= 1, got %d", c.MaxModels))
	}
	if !(c.ErrorRatio > 0 && c.ErrorRatio <= 1) {
		errs = append(errs, fmt.Errorf("scope.error_ratio: must be within (0, 1], got %v", c.ErrorRatio))
	}
	if c.ErrorSample < 2 {
		errs = append(errs, fmt.Errorf("scope.error_sample: must be >= 2, got %d", c.ErrorSample))
	}
	if c.MaxAgentsPerProfile < 1 {
		errs = append(errs, fmt.Errorf("scope.max_agents_per_profile: must be >= 1, got %d", c.MaxAgentsPerProfile))
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
func (c Config) FailoverFor(provider string, down func(provider string) bool) string {
	for _, alt := range c.Failover[provider] {
		if down == nil || !down(alt) {
			return alt
		}
	}
	return ""
}
