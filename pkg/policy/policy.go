// Package policy is the policy file and the public face of failbus's pure
// decision core: one Policy of sections (retry, classify, refusal, notify,
// scope, recovery, limits) read, checked and defaulted in one place, and
// the pure functions a tool or another service calls without a bus
// (Classify, Policy.Classifier, Policy.RetryFor). The rules that read each
// section live behind it in internal/policy/<section>; none of them does
// I/O, starts goroutines or reads a clock, so the services and `failbus
// simulate` run exactly the same rules. Load is the one function here that
// touches the file system.
package policy

// The policy file (CONTRACT.md "Policy file").
//
// Every key is optional: Parse starts from Default() and a key present in the
// document replaces that one value. Durations are Go duration strings
// ("1500ms", "15m", "6h"); a number where a duration belongs is an error, so
// "60" can never silently mean 60 nanoseconds. An unknown key anywhere is an
// error that names its full path and line, and an unknown class name in a
// retryable list is an error that names the list and the class.
//
// Retryable classes layer (RetryConfig); RetryFor(provider) resolves the
// layers into one RetryPolicy, which is what the decision chain and the
// policy key use.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/failbus/failbus/internal/policy/limits"
	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/policy/scope"
)

// Policy is the whole policy file. The zero value is not useful: start from
// Default() or Parse. A Policy is read-only once built; services swap the
// whole value on reload.
type Policy struct {
	// Retry is the retry decision chain's configuration.
	Retry RetryConfig `yaml:"retry" json:"retry"`
	// Classify configures the classifier (rules, provider limits).
	Classify ClassifyConfig `yaml:"classify" json:"classify"`
	// Refusal configures the refusal tiers.
	Refusal RefusalConfig `yaml:"refusal" json:"refusal"`
	// Notify configures the notification budget and sinks.
	Notify NotifyConfig `yaml:"notify" json:"notify"`
	// Scope holds the fault-scope thresholds: outage detection, recovery,
	// profile and model correlation.
	Scope ScopeConfig `yaml:"scope" json:"scope"`
	// Recovery configures the post-outage checklist, the held task queue
	// and the outage probes.
	Recovery RecoveryConfig `yaml:"recovery" json:"recovery"`
	// Limits bounds the shared state one agent, and all agents together,
	// may hold: providers, subagents, crons, tasks and their bytes.
	Limits LimitsConfig `yaml:"limits" json:"limits"`
}

// Default returns the policy every absent key falls back to: CONTRACT.md's
// retry defaults, the refusal tiers' re-probe schedule (15m, 1h, 6h), a
// notification budget of 20 per UTC day with no sinks, and the documented
// fault-scope thresholds.
func Default() *Policy {
	return &Policy{
		Retry:    retry.Default(),
		Refusal:  refusal.DefaultConfig(),
		Notify:   notification.DefaultConfig(),
		Scope:    scope.DefaultConfig(),
		Recovery: recovery.DefaultConfig(),
		Limits:   limits.DefaultConfig(),
	}
}

// Load reads and parses the policy file at path. It is the one function of
// the package that touches the file system, so services and the CLI read a
// policy the same way.
func Load(path string) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	p, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// Parse reads a policy document: absent keys keep Default()'s values, an
// unknown key or class is an error naming it, and the result is validated.
// An empty document is the default policy. Every problem is reported at
// once, one per line, each starting with "policy: " and its key path:
// unknown keys, values of the wrong type and bad durations (their entries
// are left out so the rest still decodes), then what validation finds. A
// file is one YAML document: a second one is an error, not ignored.
func Parse(data []byte) (*Policy, error) {
	p := Default()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("policy: %w", err)
	}
	var errs []error
	// A second document is reported last, after the first's problems.
	var second error
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		second = fmt.Errorf("policy: after the first document: %w", err)
	default:
		if n := cfgDeref(&next); n != nil && n.Tag != "!!null" {
			second = fmt.Errorf("policy: line %d: a second YAML document: a policy file is one document, and the second would be ignored (merge it into the first and remove the ---)", n.Line)
		}
	}
	root := cfgDeref(&doc)
	if root == nil || root.Tag == "!!null" {
		if err := p.Validate(); err != nil {
			errs = append(errs, err)
		}
		return cfgResult(p, append(errs, second))
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("policy: line %d: the document must be a mapping of sections (retry, classify, refusal, notify, scope, recovery, limits)", root.Line)
	}
	for _, err := range cfgCheckKeys(root, reflect.TypeFor[Policy](), "") {
		errs = append(errs, fmt.Errorf("policy: %w", err))
	}
	if err := root.Decode(p); err != nil {
		// What the walk could not foresee (an overflowing number, a
		// section's own decoder): nothing decoded is trustworthy.
		return nil, errors.Join(append(errs, fmt.Errorf("policy: %w", err), second)...)
	}
	if err := p.Validate(); err != nil {
		errs = append(errs, err)
	}
	return cfgResult(p, append(errs, second))
}

// cfgResult is p, or every error (nil ones left out).
func cfgResult(p *Policy, errs []error) (*Policy, error) {
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// Validate checks every section and reports every problem found, each
// prefixed with "policy: " and the key path.
func (p *Policy) Validate() error {
	var errs []error
	if err := p.Retry.Validate(); err != nil {
		errs = append(errs, cfgPrefix("retry", err))
	}
	if err := p.Classify.Validate(); err != nil {
		errs = append(errs, cfgPrefix("classify", err))
	}
	if err := p.Refusal.Validate(); err != nil {
		errs = append(errs, cfgPrefix("refusal", err))
	}
	if err := p.Notify.Validate(); err != nil {
		errs = append(errs, cfgPrefix("notify", err))
	}
	if err := p.Scope.Validate(); err != nil {
		errs = append(errs, cfgPrefix("scope", err))
	}
	if err := p.Recovery.Validate(); err != nil {
		errs = append(errs, cfgPrefix("recovery", err))
	}
	if err := p.Limits.Validate(); err != nil {
		errs = append(errs, cfgPrefix("limits", err))
	}
	return errors.Join(errs...)
}

// cfgPrefix makes every line of a section's error start with "policy: " and
// name the section when the section's own message does not.
func cfgPrefix(section string, err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, section) {
			l = section + ": " + l
		}
		lines[i] = "policy: " + l
	}
	return errors.New(strings.Join(lines, "\n"))
}

// RetryFor resolves the retry policy of one provider: the global section

// RetryFor resolves the retry policy of one provider: the global section
// with that provider's override on top. It returns nil when the resolved mode
// is off ("no policy": pass on).
func (p *Policy) RetryFor(provider string) *RetryPolicy { return p.Retry.For(provider) }
