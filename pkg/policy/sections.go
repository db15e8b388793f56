package policy

import (
	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/policy/limits"
	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/policy/scope"
)

// The sections of the policy file, named here so that a tool which builds,
// edits or prints a Policy can name them. Each is the section's own type
// (the rules that read it live in internal/policy/<section>), so a value
// read from a Policy field is the value the services decide with. Every
// field's comment states its YAML key and its default; Default() holds
// them all.
type (
	// RetryConfig is the retry section: the decision chain's mode, budget,
	// delays and retryable classes, with per-provider overrides.
	RetryConfig = retry.Config
	// RetryOverride is one provider's entry under retry.providers: a nil
	// field keeps the section's value.
	RetryOverride = retry.Override
	// RetryPolicy is the retry section resolved for one provider (see
	// Policy.RetryFor): what the decision chain runs and what the policy
	// key on every decision is computed over.
	RetryPolicy = retry.Policy
	// ClassifyConfig is the classify section: user rules and the limits
	// the built-in rules read.
	ClassifyConfig = classify.Config
	// ClassifyRule is one user classification rule of classify.rules; user
	// rules run before the built-in ones.
	ClassifyRule = classify.Rule
	// RefusalConfig is the refusal section: the refusal tiers' re-probe
	// schedule, re-render bound and state lifetime.
	RefusalConfig = refusal.Config
	// NotifyConfig is the notify section: the daily notification budget
	// and the sinks.
	NotifyConfig = notification.Config
	// SinkConfig is one sink of notify.sinks (pkg/notify builds them).
	SinkConfig = notification.SinkConfig
	// ScopeConfig is the scope section: when a provider is in an outage,
	// when it has recovered, and the failover order.
	ScopeConfig = scope.Config
	// RecoveryConfig is the recovery section: the post-outage checklist,
	// the held task queue's drain rate and the outage probes.
	RecoveryConfig = recovery.Config
	// ProbeConfig is one provider's HTTP probe of recovery.probes, sent
	// while that provider is in an outage.
	ProbeConfig = recovery.HTTPProbe
	// LimitsConfig is the limits section: how much shared state one agent,
	// and all agents together, may hold.
	LimitsConfig = limits.Config
)
