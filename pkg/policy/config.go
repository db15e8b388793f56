// Package policy is failbus's pure decision core: classification, retry
// decisions, fault scope, refusal tiers and notification rules. It takes
// `now` and randomness as inputs and does no I/O (beyond Load reading the
// policy file), starts no goroutines and reads no clock, so the services and
// `failbus simulate` run exactly the same rules.
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
// Retryable classes are a set that configuration only adds to or removes
// from (seed 001: replacing the list dropped RATE_LIMIT and SERVER by
// accident). The effective set of a provider is built in layers:
//
//	contract defaults  → + retry.retryable_add  − retry.retryable_remove
//	                   → + retry.providers.<p>.retryable_add − retry.providers.<p>.retryable_remove
//
// Every other retry key of a provider override replaces the global value for
// that provider only; RetryFor(provider) resolves the layers into one
// RetryPolicy, which is what the decision chain and the policy key use.

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/failbus/failbus/pkg/events"
)

// Retry modes (seed 003).
const (
	// RetryModeNormal retries only retryable classes, and a retryable class
	// with budget left is retried before any more specific recovery is asked:
	// recovering rate limits and timeouts is the retry policy's job.
	RetryModeNormal = "normal"
	// RetryModeAlways lets a more specific recovery (compact, switch_profile,
	// switch_model) win first and retries every class only as the fallback,
	// still within the budget.
	RetryModeAlways = "always"
	// RetryModeOff is the seed's "no policy" case: failbus schedules no
	// retries for the provider and passes every failure on to the specific
	// recovery, or give_up. An extension of CONTRACT.md's normal | always.
	RetryModeOff = "off"
)

// Defaults of the `retry:` section (CONTRACT.md), exported so documentation
// and tests name them instead of repeating numbers.
const (
	DefaultRetryMode         = RetryModeNormal
	DefaultRetryMaxRetries   = 10
	DefaultRetryInitialDelay = time.Second
	DefaultRetryMaxDelay     = 60 * time.Second
	DefaultRetryJitterRatio  = 0.2
)

// Policy is the whole policy file. The zero value is not useful: start from
// Default() or Parse. A Policy is read-only once built; services swap the
// whole value on reload.
type Policy struct {
	// Retry is the retry decision chain's configuration (seed 003).
	Retry RetryConfig `yaml:"retry" json:"retry"`
	// Classify configures the classifier (rules, provider limits).
	Classify ClassifyConfig `yaml:"classify" json:"classify"`
	// Refusal configures the refusal tiers (seed 000).
	Refusal RefusalConfig `yaml:"refusal" json:"refusal"`
	// Notify configures the notification budget and sinks.
	Notify NotifyConfig `yaml:"notify" json:"notify"`
	// Scope holds the fault-scope thresholds: outage detection, recovery,
	// profile and model correlation (seed 002).
	Scope ScopeConfig `yaml:"scope" json:"scope"`
}

// RetryConfig is the `retry:` section: the global retry policy and its
// per-provider overrides.
type RetryConfig struct {
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
	// RetryableAdd are classes added to the contract's default retryable
	// set.
	RetryableAdd []string `yaml:"retryable_add" json:"retryable_add,omitempty"`
	// RetryableRemove are classes removed from it.
	RetryableRemove []string `yaml:"retryable_remove" json:"retryable_remove,omitempty"`
	// Providers override any key above for one provider (by the outcome's
	// provider name). Retryable lists layer on top of the global result.
	Providers map[string]RetryOverride `yaml:"providers" json:"providers,omitempty"`
}

// RetryOverride is one provider's override: a nil field keeps the global
// value.
type RetryOverride struct {
	Mode            *string        `yaml:"mode" json:"mode,omitempty"`
	MaxRetries      *int           `yaml:"max_retries" json:"max_retries,omitempty"`
	InitialDelay    *time.Duration `yaml:"initial_delay" json:"initial_delay,omitempty"`
	MaxDelay        *time.Duration `yaml:"max_delay" json:"max_delay,omitempty"`
	JitterRatio     *float64       `yaml:"jitter_ratio" json:"jitter_ratio,omitempty"`
	RetryableAdd    []string       `yaml:"retryable_add" json:"retryable_add,omitempty"`
	RetryableRemove []string       `yaml:"retryable_remove" json:"retryable_remove,omitempty"`
}

// RetryPolicy is the resolved retry policy of one provider: what the
// decision chain runs and what the policy key is computed over. Build it with
// (*Policy).RetryFor.
type RetryPolicy struct {
	// Provider is the provider it was resolved for ("" for the global one).
	// It is not a behavioural field and not part of the key.
	Provider     string
	Mode         string
	MaxRetries   int
	InitialDelay time.Duration
	MaxDelay     time.Duration
	JitterRatio  float64
	// Retryable is the effective retryable set, sorted.
	Retryable []string
}

// Default returns the policy every absent key falls back to: CONTRACT.md's
// retry defaults, the seed's refusal schedule, a notification budget of 20
// per UTC day with no sinks, and the documented fault-scope thresholds.
func Default() *Policy {
	return &Policy{
		Retry: RetryConfig{
			Mode:         DefaultRetryMode,
			MaxRetries:   DefaultRetryMaxRetries,
			InitialDelay: DefaultRetryInitialDelay,
			MaxDelay:     DefaultRetryMaxDelay,
			JitterRatio:  DefaultRetryJitterRatio,
		},
		Refusal: DefaultRefusalConfig(),
		Notify:  DefaultNotifyConfig(),
		Scope:   DefaultScopeConfig(),
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
// An empty document is the default policy.
func Parse(data []byte) (*Policy, error) {
	p := Default()
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	root := cfgDeref(&doc)
	if root == nil || root.Tag == "!!null" {
		return p, p.Validate()
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("policy: line %d: the document must be a mapping of sections (retry, classify, refusal, notify, scope)", root.Line)
	}
	if err := cfgCheckKeys(root, reflect.TypeFor[Policy](), ""); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if err := root.Decode(p); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// Validate checks every section and reports every problem found, each
// prefixed with "policy: " and the key path.
func (p *Policy) Validate() error {
	var errs []error
	errs = append(errs, p.Retry.validate()...)
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
// with that provider's override on top. It returns nil when the resolved mode
// is off (the seed's "no policy": pass on).
func (p *Policy) RetryFor(provider string) *RetryPolicy {
	r := p.resolveRetry(provider)
	if r.Mode == RetryModeOff {
		return nil
	}
	return r
}

func (p *Policy) resolveRetry(provider string) *RetryPolicy {
	g := p.Retry
	r := &RetryPolicy{
		Provider:     provider,
		Mode:         g.Mode,
		MaxRetries:   g.MaxRetries,
		InitialDelay: g.InitialDelay,
		MaxDelay:     g.MaxDelay,
		JitterRatio:  g.JitterRatio,
	}
	set := map[string]bool{}
	for _, c := range events.Classes {
		if c.Retryable {
			set[c.Name] = true
		}
	}
	cfgApplySet(set, g.RetryableAdd, g.RetryableRemove)
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
		cfgApplySet(set, o.RetryableAdd, o.RetryableRemove)
	}
	r.Retryable = make([]string, 0, len(set))
	for c := range set {
		r.Retryable = append(r.Retryable, c)
	}
	sort.Strings(r.Retryable)
	return r
}

func cfgApplySet(set map[string]bool, add, remove []string) {
	for _, c := range add {
		set[c] = true
	}
	for _, c := range remove {
		delete(set, c)
	}
}

// IsRetryable reports whether class is in the effective retryable set. This
// is the `retryable` a classification carries "after policy".
func (r *RetryPolicy) IsRetryable(class string) bool {
	if r == nil {
		return false
	}
	_, found := slices.BinarySearch(r.Retryable, class)
	return found
}

func (c RetryConfig) validate() []error {
	var errs []error
	errs = append(errs, cfgValidateClasses("retry", c.RetryableAdd, c.RetryableRemove)...)
	providers := make([]string, 0, len(c.Providers))
	for name := range c.Providers {
		providers = append(providers, name)
	}
	sort.Strings(providers)
	p := &Policy{Retry: c}
	errs = append(errs, p.resolveRetry("").validate("retry")...)
	for _, name := range providers {
		path := "retry.providers." + name
		if name == "" {
			errs = append(errs, fmt.Errorf("policy: retry.providers: empty provider name"))
			continue
		}
		o := c.Providers[name]
		errs = append(errs, cfgValidateClasses(path, o.RetryableAdd, o.RetryableRemove)...)
		errs = append(errs, p.resolveRetry(name).validate(path)...)
	}
	return errs
}

// validate checks a resolved policy; path names where it came from.
func (r *RetryPolicy) validate(path string) []error {
	var errs []error
	switch r.Mode {
	case RetryModeNormal, RetryModeAlways, RetryModeOff:
	default:
		errs = append(errs, fmt.Errorf("policy: %s.mode: %q is not normal, always or off", path, r.Mode))
	}
	if r.MaxRetries < 0 {
		errs = append(errs, fmt.Errorf("policy: %s.max_retries: must be >= 0, got %d", path, r.MaxRetries))
	}
	if r.InitialDelay <= 0 {
		errs = append(errs, fmt.Errorf("policy: %s.initial_delay: must be positive, got %s", path, r.InitialDelay))
	}
	if r.MaxDelay < r.InitialDelay {
		errs = append(errs, fmt.Errorf("policy: %s.max_delay: %s is below initial_delay %s", path, r.MaxDelay, r.InitialDelay))
	}
	if !(r.JitterRatio >= 0 && r.JitterRatio <= 1) {
		errs = append(errs, fmt.Errorf("policy: %s.jitter_ratio: must be within [0, 1], got %v", path, r.JitterRatio))
	}
	return errs
}

// cfgValidateClasses checks the class names of one level's add/remove lists.
func cfgValidateClasses(path string, add, remove []string) []error {
	var errs []error
	check := func(key string, list []string) {
		for _, name := range list {
			info, ok := events.LookupClass(name)
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("policy: %s.%s: %q is not a class", path, key, name))
			case info.Name == events.ClassOK:
				errs = append(errs, fmt.Errorf("policy: %s.%s: %q is not a failure class", path, key, name))
			case info.Name == events.ClassContentRefusal:
				errs = append(errs, fmt.Errorf("policy: %s.%s: %q is governed by the refusal: section, never retried on the clock", path, key, name))
			}
		}
	}
	check("retryable_add", add)
	check("retryable_remove", remove)
	for _, name := range add {
		if slices.Contains(remove, name) {
			errs = append(errs, fmt.Errorf("policy: %s: %q is both in retryable_add and retryable_remove", path, name))
		}
	}
	return errs
}

// cfgDeref follows document and alias nodes to the node that holds a value.
func cfgDeref(n *yaml.Node) *yaml.Node {
	for n != nil {
		switch n.Kind {
		case yaml.DocumentNode:
			if len(n.Content) == 0 {
				return nil
			}
			n = n.Content[0]
		case yaml.AliasNode:
			n = n.Alias
		case 0: // empty input
			return nil
		default:
			return n
		}
	}
	return nil
}

var cfgDurationType = reflect.TypeFor[time.Duration]()

// cfgCheckKeys walks the YAML tree against the Go types it decodes into and
// reports the first unknown key with its full path and line, and the first
// value that is not a Go duration where one belongs. It follows yaml struct
// tags, so a section defined elsewhere in the package is checked the same
// way as long as its struct fields carry the keys it accepts.
func cfgCheckKeys(n *yaml.Node, t reflect.Type, path string) error {
	n = cfgDeref(n)
	if n == nil || n.Tag == "!!null" {
		return nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == cfgDurationType {
		if n.Kind != yaml.ScalarNode {
			return fmt.Errorf("%s: want a Go duration (like 1500ms, 15m, 6h) (line %d)", path, n.Line)
		}
		if _, err := time.ParseDuration(n.Value); err != nil {
			return fmt.Errorf("%s: %q is not a Go duration (like 1500ms, 15m, 6h) (line %d)", path, n.Value, n.Line)
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s: want a mapping (line %d)", cfgPathOr(path), n.Line)
		}
		fields := map[string]reflect.Type{}
		cfgStructKeys(t, fields)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" { // merge key: its mapping holds keys of t
				if err := cfgCheckKeys(v, t, path); err != nil {
					return err
				}
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				ft, ok = fields[cfgAnyKey]
			}
			if !ok {
				return fmt.Errorf("unknown key %q (line %d)", cfgJoin(path, k.Value), k.Line)
			}
			if err := cfgCheckKeys(v, ft, cfgJoin(path, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s: want a mapping (line %d)", cfgPathOr(path), n.Line)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if err := cfgCheckKeys(v, t.Elem(), cfgJoin(path, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return nil // let the decoder report the type error
		}
		for i, e := range n.Content {
			if err := cfgCheckKeys(e, t.Elem(), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
	}
	return nil
}

// cfgStructKeys collects the YAML keys of a struct as yaml.v3 sees them:
// the tag name, or the lower-cased field name, with inline structs
// flattened.
func cfgStructKeys(t reflect.Type, into map[string]reflect.Type) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch ft.Kind() {
			case reflect.Struct:
				cfgStructKeys(ft, into)
			case reflect.Map:
				into[cfgAnyKey] = ft.Elem()
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		into[name] = f.Type
	}
}

// cfgAnyKey stands for "any other key" of a struct with an inline map.
const cfgAnyKey = "\x00any"

func cfgJoin(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func cfgPathOr(path string) string {
	if path == "" {
		return "policy"
	}
	return path
}

// ClassifyFunc compiles the policy's classify section and returns the
// classification "after policy" (CONTRACT.md): the class's retryability is
// the policy's retryable set for the outcome's provider, not the contract
// default. The classifier service, `failbus classify` and `failbus simulate`
// all classify through it, so they cannot disagree.
func (p *Policy) ClassifyFunc() (func(*events.Outcome) events.Classification, error) {
	cl, err := NewClassifier(p.Classify)
	if err != nil {
		return nil, err
	}
	return func(o *events.Outcome) events.Classification {
		c := cl.Classify(o)
		if c.Class != events.ClassOK {
			c.Retryable = p.RetryFor(o.Provider).IsRetryable(c.Class)
		}
		return c
	}, nil
}
