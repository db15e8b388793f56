package notification

// The `notify:` policy section (docs/CONTRACT.md "Policy file"): how many non-critical notifications a human gets per UTC
// day, and where they go. Critical notifications always go out. The notifier
// service extends SinkConfig with the fields its sink types need; this file
// only fixes the contract's keys and their validation.

import (
	"errors"
	"fmt"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// DefaultDailyBudget is how many non-critical notifications are sent
// per UTC day when the policy does not say.
const DefaultDailyBudget = 20

// Sink types of CONTRACT.md.
const (
	SinkWebhook   = "webhook"
	SinkSlack     = "slack"
	SinkNtfy      = "ntfy"
	SinkSMTP      = "smtp"
	SinkPagerDuty = "pagerduty"
	SinkLog       = "log"
)

// Config is the `notify:` section.
type Config struct {
	// DailyBudget caps non-critical (info and normal) notifications per UTC
	// day; critical ones are always sent. 0 sends no non-critical
	// notification at all. Must be >= 0. Defaults to
	// DefaultDailyBudget (20).
	DailyBudget int `yaml:"daily_budget" json:"daily_budget"`
	// Sinks are where notifications are delivered. None by default (the
	// notifier then only logs).
	Sinks []SinkConfig `yaml:"sinks" json:"sinks,omitempty"`
}

// SinkConfig is one delivery target. Name must be unique; Type selects the
// sink implementation.
type SinkConfig struct {
	// Name identifies the sink in logs, metrics and delivery records.
	Name string `yaml:"name" json:"name"`
	// Type is webhook, slack, ntfy, smtp, pagerduty or log.
	Type string `yaml:"type" json:"type"`
	// URL is the endpoint; required for webhook, slack and ntfy.
	URL string `yaml:"url" json:"url,omitempty"`
	// SecretEnv names the environment variable holding the HMAC-SHA256 key
	// for X-Failbus-Signature (webhook). The secret itself never appears in
	// the policy.
	SecretEnv string `yaml:"secret_env" json:"secret_env,omitempty"`
	// Severities filters what this sink receives; empty means all.
	Severities []string `yaml:"severities" json:"severities,omitempty"`

	// The fields below configure the notifier's sink types.

	// URLEnv names an environment variable holding the URL instead of URL
	// (a Slack incoming-webhook URL is itself a credential). When both are
	// set, URLEnv wins.
	URLEnv string `yaml:"url_env" json:"url_env,omitempty"`
	// Labels routes by label: the sink receives only notifications whose
	// labels hold every pair given here; the value "*" only requires the
	// label to be present. Empty means all.
	Labels map[string]string `yaml:"labels" json:"labels,omitempty"`
	// Idempotent declares that a webhook receiver drops a request whose
	// Idempotency-Key it has already seen, so the notifier may re-send an
	// unconfirmed delivery without risking a duplicate. Defaults to false.
	Idempotent bool `yaml:"idempotent" json:"idempotent,omitempty"`
	// Topic is the ntfy topic; defaults to the last path segment of URL.
	Topic string `yaml:"topic" json:"topic,omitempty"`
	// From and To are the sender and recipients of an smtp sink, whose URL
	// is smtp://host:port; Username (with the password in SecretEnv)
	// authenticates; StartTLS is auto (default), require or never.
	From     string   `yaml:"from" json:"from,omitempty"`
	To       []string `yaml:"to" json:"to,omitempty"`
	Username string   `yaml:"username" json:"username,omitempty"`
	StartTLS string   `yaml:"starttls" json:"starttls,omitempty"`
	// RoutingKeyEnv names the environment variable holding a pagerduty
	// sink's routing key (SecretEnv is used when it is empty). URL then
	// overrides the Events API endpoint.
	RoutingKeyEnv string `yaml:"routing_key_env" json:"routing_key_env,omitempty"`
	// MaxAttempts is the sink's retry budget: after this many failed
	// attempts a notification goes to the dead-letter subject with the
	// sink's last answer. 0 selects the notifier's default (8).
	MaxAttempts int `yaml:"max_attempts" json:"max_attempts,omitempty"`
	// RetryInitial and RetryMax shape the backoff between attempts
	// (doubling from RetryInitial, capped at RetryMax). 0 selects the
	// notifier's defaults (2s, 60s).
	RetryInitial time.Duration `yaml:"retry_initial" json:"retry_initial,omitempty"`
	RetryMax     time.Duration `yaml:"retry_max" json:"retry_max,omitempty"`
	// Timeout bounds one send. 0 selects the notifier's default (10s).
	Timeout time.Duration `yaml:"timeout" json:"timeout,omitempty"`
}

// DefaultConfig returns the section's defaults: the daily budget and no
// sinks.
func DefaultConfig() Config {
	return Config{DailyBudget: DefaultDailyBudget}
}

// Validate reports every problem of the section, each naming its key.
func (c Config) Validate() error {
	var errs []error
	if c.DailyBudget < 0 {
		errs = append(errs, fmt.Errorf("notify.daily_budget: must be >= 0, got %d", c.DailyBudget))
	}
	names := map[string]bool{}
	for i, s := range c.Sinks {
		path := fmt.Sprintf("notify.sinks[%d]", i)
		if s.Name == "" {
			errs = append(errs, fmt.Errorf("%s.name: required", path))
		} else if names[s.Name] {
			errs = append(errs, fmt.Errorf("%s.name: %q is used by another sink", path, s.Name))
		}
		names[s.Name] = true
		switch s.Type {
		case SinkWebhook, SinkSlack, SinkNtfy:
			if s.URL == "" && s.URLEnv == "" {
				errs = append(errs, fmt.Errorf("%s.url: required for type %s", path, s.Type))
			}
		case SinkSMTP:
			if s.URL == "" && s.URLEnv == "" {
				errs = append(errs, fmt.Errorf("%s.url: required for type smtp (smtp://host:port)", path))
			}
			if s.From == "" {
				errs = append(errs, fmt.Errorf("%s.from: required for type smtp", path))
			}
			if len(s.To) == 0 {
				errs = append(errs, fmt.Errorf("%s.to: at least one recipient required for type smtp", path))
			}
			switch s.StartTLS {
			case "", "auto", "require", "never":
			default:
				errs = append(errs, fmt.Errorf("%s.starttls: %q is not auto, require or never", path, s.StartTLS))
			}
		case SinkPagerDuty:
			if s.RoutingKeyEnv == "" && s.SecretEnv == "" {
				errs = append(errs, fmt.Errorf("%s.routing_key_env: required for type pagerduty", path))
			}
		case SinkLog:
		case "":
			errs = append(errs, fmt.Errorf("%s.type: required (webhook, slack, ntfy, smtp, pagerduty or log)", path))
		default:
			errs = append(errs, fmt.Errorf("%s.type: %q is not webhook, slack, ntfy, smtp, pagerduty or log", path, s.Type))
		}
		if s.MaxAttempts < 0 {
			errs = append(errs, fmt.Errorf("%s.max_attempts: must be >= 0, got %d", path, s.MaxAttempts))
		}
		if s.RetryInitial < 0 || s.RetryMax < 0 || s.Timeout < 0 {
			errs = append(errs, fmt.Errorf("%s: retry_initial, retry_max and timeout must not be negative", path))
		}
		if s.RetryInitial > 0 && s.RetryMax > 0 && s.RetryMax < s.RetryInitial {
			errs = append(errs, fmt.Errorf("%s.retry_max: %s is below retry_initial %s", path, s.RetryMax, s.RetryInitial))
		}
		for j, sev := range s.Severities {
			switch sev {
			case events.SeverityInfo, events.SeverityNormal, events.SeverityCritical:
			default:
				errs = append(errs, fmt.Errorf("%s.severities[%d]: %q is not info, normal or critical", path, j, sev))
			}
		}
	}
	return errors.Join(errs...)
}

// Accepts reports whether the sink takes notifications of severity.
func (s SinkConfig) Accepts(severity string) bool {
	if len(s.Severities) == 0 {
		return true
	}
	for _, v := range s.Severities {
		if v == severity {
			return true
		}
	}
	return false
}
