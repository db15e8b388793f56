package recovery

import (
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery/checklist"
)

// Defaults of the `recovery:` policy section (CONTRACT.md § "Recovery").
const (
	// DefaultStaleAfter of 0 means a subagent is stale when its latest
	// heartbeat is older than StaleIntervals × its own interval_ms.
	DefaultStaleAfter time.Duration = 0
	// StaleIntervals is how many missed heartbeat intervals make a
	// subagent stale when StaleAfter is 0.
	StaleIntervals = checklist.StaleIntervals
	// DefaultCatchupWindow is how far before recovery a missed cron time
	// is still re-run.
	DefaultCatchupWindow = 6 * time.Hour
	// DefaultMaxCatchupRuns caps the re-runs of one cron in `all` mode.
	DefaultMaxCatchupRuns = 100
	// DefaultDrainRate is how many held tasks are released per second
	// after recovery, so a recovered provider is not hit by the whole
	// backlog at once (and rate-limited again).
	DefaultDrainRate = 20.0
	// DefaultProbeInterval is how often an agent is asked to probe a
	// provider in an outage.
	DefaultProbeInterval = 30 * time.Second
	// DefaultProbeMethod, DefaultProbeStatus and DefaultProbeTimeout are
	// the defaults of an HTTP probe.
	DefaultProbeMethod  = "GET"
	DefaultProbeStatus  = 200
	DefaultProbeTimeout = 10 * time.Second
	// DefaultProbeAgent is the agent name the built-in HTTP probe reports
	// its outcomes under.
	DefaultProbeAgent = "failbus-probe"
)

// Config is the `recovery:` policy section.
type Config struct {
	// StaleAfter is how old a running subagent's latest heartbeat may be
	// before the checklist kills it. 0 (the default) means StaleIntervals
	// (3) × the heartbeat's own interval_ms, so a subagent that said it
	// beats every 10 minutes is not killed after 30 seconds. Must not be
	// negative.
	StaleAfter time.Duration `yaml:"stale_after" json:"stale_after"`
	// CatchupWindow is how long before recovered_at a cron time missed in
	// the outage is still re-run; older ones are listed as missed. A cron
	// spec's own catchup_window overrides it. Must be positive. Defaults to
	// 6h.
	CatchupWindow time.Duration `yaml:"catchup_window" json:"catchup_window"`
	// MaxCatchupRuns caps how many missed times of one cron are re-run in
	// `all` mode (oldest first); the rest are listed as missed. Must be at
	// least 1. Defaults to 100.
	MaxCatchupRuns int `yaml:"max_catchup_runs" json:"max_catchup_runs"`
	// DrainRate is how many held tasks per second are released after
	// recovery (per provider). Must be positive. Defaults to 20.
	DrainRate float64 `yaml:"drain_rate" json:"drain_rate"`
	// ProbeInterval is how often, during an outage, one agent that used the
	// provider is asked for a probe (and the built-in HTTP probe, when
	// configured, runs). Must be at least 100ms. Defaults to 30s.
	ProbeInterval time.Duration `yaml:"probe_interval" json:"probe_interval"`
	// Probes configures a built-in HTTP probe per provider (an extension
	// of CONTRACT.md): its results are published as outcomes (origin
	// probe) and feed the provider's health like any outcome. Empty: no
	// built-in probes; only agents probe.
	Probes map[string]HTTPProbe `yaml:"probes" json:"probes,omitempty"`
}

// HTTPProbe is one provider's built-in probe: one HTTP request every
// probe interval while the provider is in an outage.
type HTTPProbe struct {
	// URL is requested; required (http or https).
	URL string `yaml:"url" json:"url"`
	// Method defaults to GET.
	Method string `yaml:"method" json:"method,omitempty"`
	// Headers are sent as given; use HeadersEnv for anything secret.
	Headers map[string]string `yaml:"headers" json:"headers,omitempty"`
	// HeadersEnv maps a header name to the environment variable holding its
	// value (e.g. Authorization: OPENAI_PROBE_AUTH), read when the probe
	// runs, so no secret is written into the policy file.
	HeadersEnv map[string]string `yaml:"headers_env" json:"headers_env,omitempty"`
	// ExpectStatus is the status that counts as a success. Defaults to 200.
	ExpectStatus int `yaml:"expect_status" json:"expect_status,omitempty"`
	// Timeout bounds one request. Defaults to 10s.
	Timeout time.Duration `yaml:"timeout" json:"timeout,omitempty"`
	// Agent, Profile and Model go into the probe's outcomes. Agent defaults
	// to DefaultProbeAgent; Profile and Model may stay empty.
	Agent   string `yaml:"agent" json:"agent,omitempty"`
	Profile string `yaml:"profile" json:"profile,omitempty"`
	Model   string `yaml:"model" json:"model,omitempty"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		StaleAfter:     DefaultStaleAfter,
		CatchupWindow:  DefaultCatchupWindow,
		MaxCatchupRuns: DefaultMaxCatchupRuns,
		DrainRate:      DefaultDrainRate,
		ProbeInterval:  DefaultProbeInterval,
	}
}

// WithDefaults fills every zero field with its default (a Config built by
// hand); a Config parsed from a policy file is complete already.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.CatchupWindow == 0 {
		c.CatchupWindow = d.CatchupWindow
	}
	if c.MaxCatchupRuns == 0 {
		c.MaxCatchupRuns = d.MaxCatchupRuns
	}
	if c.DrainRate == 0 {
		c.DrainRate = d.DrainRate
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = d.ProbeInterval
	}
	if c.Probes != nil {
		probes := make(map[string]HTTPProbe, len(c.Probes))
		for name, p := range c.Probes {
			probes[name] = p.withDefaults()
		}
		c.Probes = probes
	}
	return c
}

func (p HTTPProbe) withDefaults() HTTPProbe {
	if p.Method == "" {
		p.Method = DefaultProbeMethod
	}
	if p.ExpectStatus == 0 {
		p.ExpectStatus = DefaultProbeStatus
	}
	if p.Timeout == 0 {
		p.Timeout = DefaultProbeTimeout
	}
	if p.Agent == "" {
		p.Agent = DefaultProbeAgent
	}
	return p
}

// Validate reports every problem of the section, each naming its key.
func (c Config) Validate() error {
	var errs []error
	if c.StaleAfter < 0 {
		errs = append(errs, fmt.Errorf("recovery.stale_after: must not be negative, got %s", c.StaleAfter))
	}
	if c.CatchupWindow <= 0 {
		errs = append(errs, fmt.Errorf("recovery.catchup_window: must be positive, got %s", c.CatchupWindow))
	}
	if c.MaxCatchupRuns < 1 {
		errs = append(errs, fmt.Errorf("recovery.max_catchup_runs: must be at least 1, got %d", c.MaxCatchupRuns))
	}
	if !(c.DrainRate > 0) || c.DrainRate > 1e6 {
		errs = append(errs, fmt.Errorf("recovery.drain_rate: must be between 0 (exclusive) and 1e6 per second, got %v", c.DrainRate))
	}
	if c.ProbeInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("recovery.probe_interval: must be at least 100ms, got %s", c.ProbeInterval))
	}
	names := make([]string, 0, len(c.Probes))
	for name := range c.Probes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := c.Probes[name]
		key := "recovery.probes." + name
		if name == "" {
			errs = append(errs, errors.New("recovery.probes: empty provider name"))
		}
		u, err := url.Parse(p.URL)
		switch {
		case p.URL == "":
			errs = append(errs, fmt.Errorf("%s.url: required", key))
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			errs = append(errs, fmt.Errorf("%s.url: %q is not an http(s) URL", key, p.URL))
		}
		if p.Method != "" && strings.ToUpper(p.Method) != p.Method {
			errs = append(errs, fmt.Errorf("%s.method: %q must be upper case (GET, HEAD, POST)", key, p.Method))
		}
		if p.ExpectStatus != 0 && (p.ExpectStatus < 100 || p.ExpectStatus > 599) {
			errs = append(errs, fmt.Errorf("%s.expect_status: %d is not an HTTP status", key, p.ExpectStatus))
		}
		if p.Timeout < 0 {
			errs = append(errs, fmt.Errorf("%s.timeout: must not be negative", key))
		}
		for h, env := range p.HeadersEnv {
			if env == "" {
				errs = append(errs, fmt.Errorf("%s.headers_env.%s: empty environment variable name", key, h))
			}
		}
	}
	return errors.Join(errs...)
}

// Limits are the section's numbers the checklist's selections use.
func (c Config) Limits() checklist.Limits {
	return checklist.Limits{StaleAfter: c.StaleAfter, CatchupWindow: c.CatchupWindow, MaxCatchupRuns: c.MaxCatchupRuns}
}
