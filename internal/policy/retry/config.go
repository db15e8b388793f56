package retry

// The `retry:` section of the policy file (CONTRACT.md "Policy file").
//
// Retryable classes are a set that configuration only adds to or removes
// from (replacing the list is how one configuration dropped RATE_LIMIT
// and SERVER by accident). The effective set of a provider is built in layers:
//
//	contract defaults  → + retry.retryable_add  − retry.retryable_remove
//	                   → + retry.providers.<p>.retryable_add − retry.providers.<p>.retryable_remove
//
// Every other retry key of a provider override replaces the global value for
// that provider only; Config.For(provider) resolves the layers into one
// Policy, which is what the decision chain and the policy key use.

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Retry modes: normal (retryable classes within the budget), always
// (specific recoveries first, then retry any class) and off.
const (
	// ModeNormal retries only retryable classes, and a retryable class
	// with budget left is retried before any more specific recovery is asked:
	// recovering rate limits and timeouts is the retry policy's job.
	ModeNormal = "normal"
	// ModeAlways lets a more specific recovery (compact, switch_profile,
	// switch_model) win first and retries every class only as the fallback,
	// still within the budget.
	ModeAlways = "always"
	// ModeOff is the "no policy" case: failbus schedules no
	// retries for the provider and passes every failure on to the specific
	// recovery, or give_up. An extension of CONTRACT.md's normal | always.
	ModeOff = "off"
)

// Defaults of the `retry:` section (CONTRACT.md), exported so documentation
// and tests name them instead of repeating numbers.
const (
	DefaultMode         = ModeNormal
	DefaultMaxRetries   = 10
	DefaultInitialDelay = time.Second
	DefaultMaxDelay     = 60 * time.Second
	DefaultJitterRatio  = 0.2
)

// Policy is the whole policy file. The zero value is not useful: start from
// Config is the `retry:` section: the global retry policy and its
// per-provider overrides.
type Config struct {
	// Mode is normal, always or off. Defaults to normal.
	Mode string `yaml:"mode" json:"mode"`
	// MaxRetries is the budget per (turn, step, provider, policy key). Must
	// be >= 0. Defaults to 10.
	MaxRetries int `yaml:"max_retries" json:"max_retries"`
	// InitialDelay is the first backoff step. Must be > 0. Defaults to 1s.
	InitialDelay time.Duration `yaml:"initial_delay" json:"initial_delay"`
	// MaxDelay caps every delay, and a server hint above it is not taken
	// (normal mode gives up, always mode backs off locally). Must be >=
	// InitialDelay. Defaults to 60s.
	MaxDelay time.Duration `yaml:"max_delay" json:"max_delay"`
	// JitterRatio r spreads a backoff symmetrically: delay × (1 − r + 2r·u),
	// mean 1. Must be within [0, 1]. Defaults to 0.2.
	JitterRatio float64 `yaml:"jitter_ratio" json:"jitter_ratio"`
	// EpisodeIdle ends the retry episode of an outcome without turn and
	// step: a failure this long after the episode's latest retry came due
	// begins a new one (episode.go). Must be >= MaxDelay. Defaults to
	// 10m. Not part of the policy key: it says when a budget starts over,
	// not how retries are counted within one.
	EpisodeIdle time.Duration `yaml:"episode_idle" json:"episode_idle"`
	// RetryableAdd are classes added to the contract's default retryable
	// set.
	RetryableAdd []string `yaml:"retryable_add" json:"retryable_add,omitempty"`
	// RetryableRemove are classes removed from it.
	RetryableRemove []string `yaml:"retryable_remove" json:"retryable_remove,omitempty"`
	// Providers override any key above for one provider (by the outcome's
	// provider name). Retryable lists layer on top of the global result.
	Providers map[string]Override `yaml:"providers" json:"providers,omitempty"`
}

// Override is one provider's override: a nil field keeps the global
// value.
type Override struct {
	Mode            *string        `yaml:"mode" json:"mode,omitempty"`
	MaxRetries      *int           `yaml:"max_retries" json:"max_retries,omitempty"`
	InitialDelay    *time.Duration `yaml:"initial_delay" json:"initial_delay,omitempty"`
	MaxDelay        *time.Duration `yaml:"max_delay" json:"max_delay,omitempty"`
	JitterRatio     *float64       `yaml:"jitter_ratio" json:"jitter_ratio,omitempty"`
	EpisodeIdle     *time.Duration `yaml:"episode_idle" json:"episode_idle,omitempty"`
	RetryableAdd    []string       `yaml:"retryable_add" json:"retryable_add,omitempty"`
	RetryableRemove []string       `yaml:"retryable_remove" json:"retryable_remove,omitempty"`
}

// Policy is the resolved retry policy of one provider: what the
// decision chain runs and what the policy key is computed over. Build it with
// Config.For.
type Policy struct {
	// Provider is the provider it was resolved for ("" for the global one).
	// It is not a behavioural field and not part of the key.
	Provider     string
	Mode         string
	MaxRetries   int
	InitialDelay time.Duration
	MaxDelay     time.Duration
	JitterRatio  float64
	// EpisodeIdle: see Config.EpisodeIdle.
	EpisodeIdle time.Duration
	// Retryable is the effective retryable set, sorted.
	Retryable []string
}

// Default returns the policy every absent key falls back to: CONTRACT.md's
// Default returns the section's defaults (CONTRACT.md): normal mode, 10
// retries, 1s initial delay, 60s max delay, jitter 0.2, the contract's
// retryable set, no provider overrides.
func Default() Config {
	return Config{
		Mode:         DefaultMode,
		MaxRetries:   DefaultMaxRetries,
		InitialDelay: DefaultInitialDelay,
		MaxDelay:     DefaultMaxDelay,
		JitterRatio:  DefaultJitterRatio,
		EpisodeIdle:  DefaultEpisodeIdle,
	}
}

// For resolves the retry policy of one provider: the global section with
// that provider's override on top. It returns nil when the resolved mode is
// off ("no policy": pass on).
func (g Config) For(provider string) *Policy {
	r := g.Resolve(provider)
	if r.Mode == ModeOff {
		return nil
	}
	return r
}

// Resolve is For without the "off means no policy" rule: the resolved
// fields whatever the mode, which is what validation checks.
func (g Config) Resolve(provider string) *Policy {
	r := &Policy{
		Provider:     provider,
		Mode:         g.Mode,
		MaxRetries:   g.MaxRetries,
		InitialDelay: g.InitialDelay,
		MaxDelay:     g.MaxDelay,
		JitterRatio:  g.JitterRatio,
		EpisodeIdle:  g.EpisodeIdle,
	}
	// The set as a slice (every decision resolves a policy; a map was
	// most of the cost).
	set := make([]string, 0, len(events.Classes)+len(g.RetryableAdd))
	for _, c := range events.Classes {
		if c.Retryable && !slices.Contains(set, c.Name) {
			set = append(set, c.Name)
		}
	}
	set = applySet(set, g.RetryableAdd, g.RetryableRemove)
	if o, ok := g.Providers[provider]; ok {
		if o.Mode != nil {
			r.Mode = *o.Mode
		}
		if o.MaxRetries != nil {
			r.MaxRetries = *o.MaxRetries
		}
		if o.InitialDelay != nil {
			r.InitialDelay = *o.InitialDelay
		}
		if o.MaxDelay != nil {
			r.MaxDelay = *o.MaxDelay
		}
		if o.JitterRatio != nil {
			r.JitterRatio = *o.JitterRatio
		}
		if o.EpisodeIdle != nil {
			r.EpisodeIdle = *o.EpisodeIdle
		}
		set = applySet(set, o.RetryableAdd, o.RetryableRemove)
	}
	sort.Strings(set)
	r.Retryable = slices.Clip(set)
	return r
}

// applySet adds the classes of add missing from set, then removes those
// of remove.
func applySet(set, add, remove []string) []string {
	for _, c := range add {
		if !slices.Contains(set, c) {
			set = append(set, c)
		}
	}
	for _, c := range remove {
		set = slices.DeleteFunc(set, func(s string) bool { return s == c })
	}
	return set
}

// IsRetryable reports whether class is in the effective retryable set. This
// is the `retryable` a classification carries "after policy".
func (r *Policy) IsRetryable(class string) bool {
	if r == nil {
		return false
	}
	_, found := slices.BinarySearch(r.Retryable, class)
	return found
}

// Validate reports every problem of the section and of each provider's
// resolved policy, each naming its key path (retry.…, retry.providers.<p>.…).
func (c Config) Validate() error {
	var errs []error
	errs = append(errs, validateClasses("retry", c.RetryableAdd, c.RetryableRemove)...)
	providers := make([]string, 0, len(c.Providers))
	for name := range c.Providers {
		providers = append(providers, name)
	}
	sort.Strings(providers)
	errs = append(errs, c.Resolve("").validate("retry")...)
	for _, name := range providers {
		path := "retry.providers." + name
		if name == "" {
			errs = append(errs, fmt.Errorf("retry.providers: empty provider name"))
			continue
		}
		o := c.Providers[name]
		errs = append(errs, validateClasses(path, o.RetryableAdd, o.RetryableRemove)...)
		errs = append(errs, c.Resolve(name).validate(path)...)
	}
	return errors.Join(errs...)
}

// validate checks a resolved policy; path names where it came from.
func (r *Policy) validate(path string) []error {
	var errs []error
	switch r.Mode {
	case ModeNormal, ModeAlways, ModeOff:
	default:
		errs = append(errs, fmt.Errorf("%s.mode: %q is not normal, always or off", path, r.Mode))
	}
	if r.MaxRetries < 0 {
		errs = append(errs, fmt.Errorf("%s.max_retries: must be >= 0, got %d", path, r.MaxRetries))
	}
	if r.InitialDelay <= 0 {
		errs = append(errs, fmt.Errorf("%s.initial_delay: must be positive, got %s", path, r.InitialDelay))
	}
	if r.MaxDelay < r.InitialDelay {
		errs = append(errs, fmt.Errorf("%s.max_delay: %s is below initial_delay %s", path, r.MaxDelay, r.InitialDelay))
	}
	if r.EpisodeIdle < r.MaxDelay {
		errs = append(errs, fmt.Errorf("%s.episode_idle: %s is below max_delay %s", path, r.EpisodeIdle, r.MaxDelay))
	}
	if !(r.JitterRatio >= 0 && r.JitterRatio <= 1) {
		errs = append(errs, fmt.Errorf("%s.jitter_ratio: must be within [0, 1], got %v", path, r.JitterRatio))
	}
	return errs
}

// validateClasses checks the class names of one level's add/remove lists.
func validateClasses(path string, add, remove []string) []error {
	var errs []error
	check := func(key string, list []string) {
		for _, name := range list {
			info, ok := events.LookupClass(name)
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%s.%s: %q is not a class", path, key, name))
			case info.Name == events.ClassOK:
				errs = append(errs, fmt.Errorf("%s.%s: %q is not a failure class", path, key, name))
			case info.Name == events.ClassContentRefusal:
				errs = append(errs, fmt.Errorf("%s.%s: %q is governed by the refusal: section, never retried on the clock", path, key, name))
			}
		}
	}
	check("retryable_add", add)
	check("retryable_remove", remove)
	for _, name := range add {
		if slices.Contains(remove, name) {
			errs = append(errs, fmt.Errorf("%s: %q is both in retryable_add and retryable_remove", path, name))
		}
	}
	return errs
}
