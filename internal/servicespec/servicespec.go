// Package servicespec is the registry of failbus's services: the one Spec of
// each (its flags with their defaults, their checks, and its constructor),
// shared by its binary (cmd/<service> runs it with daemon.Run) and by
// the in-process bus of `failbus dev`, `demo` and `bench` (internal/devbus
// builds every spec of All with its defaults). A service is therefore built
// the same way wherever it runs; a new service adds its function here and
// its line to All.
//
// A Spec's flags are bound to variables that already hold their defaults
// when the Spec is made, so Build works without parsing any flags.
package servicespec

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/policy/limits"
	recoverypolicy "github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/service/classifier"
	"github.com/failbus/failbus/internal/service/notifier"
	"github.com/failbus/failbus/internal/service/recoverer"
	"github.com/failbus/failbus/internal/service/refusals"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/pkg/consumer"
)

// All is every service, in start order.
func All() []daemon.Spec {
	return []daemon.Spec{Classifier(), Scheduler(), Notifier(), Recovery()}
}

// Classifier is the classifier service: outcomes in, one classification
// each out.
func Classifier() daemon.Spec {
	concurrency := classifier.DefaultConcurrency
	return daemon.Spec{
		Name:           classifier.Name,
		DefaultOpsAddr: classifier.DefaultOpsAddr,
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(&concurrency, "concurrency", concurrency, "outcomes handled at once")
		},
		Check: func() error {
			if concurrency < 1 {
				return fmt.Errorf("--concurrency %d: must be at least 1", concurrency)
			}
			return nil
		},
		Build: func(_ context.Context, env daemon.Env) (daemon.Service, error) {
			return classifier.New(env.JS, classifier.Config{
				Policy: env.Policy,
				Runner: consumer.Config{Concurrency: concurrency, Logger: env.Log, Registerer: env.Registry, StoreCheckEvery: consumer.DefaultStoreCheckEvery},
			})
		},
	}
}

// Scheduler is the scheduler service, with the refusal tiers beside it
// unless --refusals=false.
func Scheduler() daemon.Spec {
	var (
		concurrency = scheduler.DefaultConcurrency
		policyKV    = true
		tier        = true
		policyPoll  = scheduler.DefaultPolicyPollInterval
		maxProvs    = scheduler.DefaultMaxProviders
		linger      = scheduler.DefaultScopeLinger
	)
	return daemon.Spec{
		Name:           scheduler.Name,
		DefaultOpsAddr: scheduler.DefaultOpsAddr,
		Flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&policyKV, "policy-kv", policyKV, "let FAILBUS_POLICY/"+scheduler.PolicyKVKey+" in KV override --policy, reloaded on change")
			fs.DurationVar(&policyPoll, "policy-poll", policyPoll, "how often the --policy file is checked for changes")
			fs.IntVar(&concurrency, "concurrency", concurrency, "classifications handled at once")
			fs.BoolVar(&tier, "refusals", tier, "also run the refusal tiers (consumers refusals and refusals-boundaries, micro service failbus-refusals)")
			fs.IntVar(&maxProvs, "max-providers", maxProvs, "providers whose fault scope is kept and whose series are on /metrics; past it the least recently seen is forgotten")
			fs.DurationVar(&linger, "scope-linger", linger, "how long a provider's classifications, each decided at once, wait for more before one fault-scope write stores them all (0: none; a change of the provider's health writes at once)")
		},
		Check: func() error {
			if concurrency < 1 {
				return fmt.Errorf("--concurrency %d: must be at least 1", concurrency)
			}
			if maxProvs < 1 {
				return fmt.Errorf("--max-providers %d: must be at least 1", maxProvs)
			}
			if linger < 0 {
				return fmt.Errorf("--scope-linger %v: must not be negative", linger)
			}
			if linger >= scheduler.MaxScopeLinger {
				return fmt.Errorf("--scope-linger %v: must be under %v: a classification waits for the write that stores its fold, and the runner hands back an input still waiting after %v", linger, scheduler.MaxScopeLinger, consumer.SettleTimeout)
			}
			if policyPoll <= 0 {
				return fmt.Errorf("--policy-poll %v: must be positive", policyPoll)
			}
			return nil
		},
		Build: func(_ context.Context, env daemon.Env) (daemon.Service, error) {
			s, err := scheduler.New(env.JS, scheduler.Config{
				Policy:             env.Policy,
				PolicyFile:         env.PolicyFile,
				PolicyPollInterval: policyPoll,
				WatchPolicy:        policyKV,
				MaxProviders:       maxProvs,
				ScopeLinger:        noLingerIsNegative(linger),
				Runner:             consumer.Config{Concurrency: concurrency, Logger: env.Log, Registerer: env.Registry, StoreCheckEvery: consumer.DefaultStoreCheckEvery},
			})
			if err != nil {
				return nil, err
			}
			if !tier {
				return s, nil
			}
			// Refusal tiers live beside the scheduler (they may run in
			// the scheduler or on their own consumers): same policy file, read
			// once at start (they do not follow reloads), own consumers
			// and the route micro service.
			r, err := refusals.New(env.JS, refusals.Config{
				Policy: env.Policy.Refusal,
				Runner: consumer.Config{Logger: env.Log, Registerer: env.Registry, StoreCheckEvery: consumer.DefaultStoreCheckEvery},
			})
			if err != nil {
				return nil, err
			}
			return daemon.Group{s, r}, nil
		},
	}
}

// Notifier is the notifier service: notification requests in, each dedupe
// key delivered once to the policy's sinks.
func Notifier() daemon.Spec {
	var (
		concurrency    = notifier.DefaultConcurrency
		dedupeLifetime = daemon.EnvDuration("FAILBUS_NOTIFY_DEDUPE_LIFETIME", delivery.DefaultDedupeLifetime)
		replica        = daemon.EnvString("FAILBUS_NOTIFIER_REPLICA", "")
	)
	return daemon.Spec{
		Name:           notifier.Name,
		DefaultOpsAddr: notifier.DefaultOpsAddr,
		Flags: func(fs *flag.FlagSet) {
			fs.IntVar(&concurrency, "concurrency", concurrency, "requests handled at once")
			fs.DurationVar(&dedupeLifetime, "dedupe-lifetime", dedupeLifetime, "how long a sent dedupe key suppresses repeats")
			fs.StringVar(&replica, "replica", replica, "replica name (default host-pid-random)")
		},
		Check: func() error {
			if concurrency < 1 {
				return fmt.Errorf("--concurrency %d: must be at least 1", concurrency)
			}
			if dedupeLifetime <= 0 {
				return fmt.Errorf("--dedupe-lifetime %s: must be positive", dedupeLifetime)
			}
			return nil
		},
		Build: func(ctx context.Context, env daemon.Env) (daemon.Service, error) {
			return notifier.New(env.JS, notifier.Config{
				Notify:          env.Policy.Notify,
				DedupeLifetime:  dedupeLifetime,
				Replica:         replica,
				Concurrency:     concurrency,
				Logger:          env.Log,
				Registerer:      env.Registry,
				StoreCheckEvery: consumer.DefaultStoreCheckEvery,
			})
		},
	}
}

// Recovery is the recovery service: the post-outage checklist, the held
// task queue and the outage probes.
func Recovery() daemon.Spec {
	var (
		owner = daemon.EnvString("FAILBUS_RECOVERY_REPLICA", "")
		lease = daemon.EnvDuration("FAILBUS_RECOVERY_LEASE", recoverypolicy.DefaultLeaseTTL)
	)
	return daemon.Spec{
		Name:           recoverer.Name,
		DefaultOpsAddr: recoverer.DefaultOpsAddr,
		Flags: func(fs *flag.FlagSet) {
			fs.StringVar(&owner, "replica", owner, "replica name in the provider records' lease (env FAILBUS_RECOVERY_REPLICA; default a new unique id)")
			fs.DurationVar(&lease, "lease", lease, "how long a replica keeps driving a provider after its last step; another takes over after it (env FAILBUS_RECOVERY_LEASE)")
		},
		Check: func() error {
			if lease < 100*time.Millisecond {
				return fmt.Errorf("--lease %s: must be at least 100ms", lease)
			}
			return nil
		},
		Build: func(ctx context.Context, env daemon.Env) (daemon.Service, error) {
			return recoverer.New(ctx, env.JS, recoverer.Options{
				Policy:   recoveryPolicy(env),
				Limits:   limitsPolicy(env),
				Owner:    owner,
				LeaseTTL: lease,
				Runner:   consumer.Config{Logger: env.Log, Registerer: env.Registry, StoreCheckEvery: consumer.DefaultStoreCheckEvery},
			})
		},
	}
}

// limitsPolicy is the policy's `limits:` section.
func limitsPolicy(env daemon.Env) limits.Config {
	if env.Policy == nil {
		return limits.DefaultConfig()
	}
	return env.Policy.Limits
}

// recoveryPolicy is the policy's `recovery:` section.
func recoveryPolicy(env daemon.Env) recoverypolicy.Config {
	if env.Policy == nil {
		return recoverypolicy.DefaultConfig()
	}
	return env.Policy.Recovery
}

// noLingerIsNegative is --scope-linger as scheduler.Config reads it:
// there 0 selects the default and a negative value no linger.
func noLingerIsNegative(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}
