package delivery

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/notify"
)

// Defaults of a Route's retry policy and send timeout. A sink that keeps
// failing is attempted defaultMaxAttempts times over about three minutes
// (2s, 4s, 8s, 16s, 32s, 60s, 60s between attempts), which rides out a
// one-minute outage of the receiver, and is then dead-lettered with its
// last answer.
const (
	defaultMaxAttempts  = 8
	defaultRetryInitial = 2 * time.Second
	defaultRetryMax     = 60 * time.Second
	defaultSendTimeout  = 10 * time.Second
)

// retryJitter spreads retries of many notifications that failed together
// (±20%), so a recovering receiver is not hit by all of them at once.
const retryJitter = 0.2

// defaultLogSinkName is the name of the log sink the notifier uses when the
// policy configures no sink, as in `failbus dev` and `failbus demo`.
const defaultLogSinkName = "log"

// RetryPolicy says how often and how fast a failing sink is retried. The
// retries are JetStream redeliveries of the request, so they survive a
// notifier crash.
type RetryPolicy struct {
	// MaxAttempts is the number of attempts before the request is
	// dead-lettered with the sink's last answer. Defaults to
	// defaultMaxAttempts. The consumer's MaxDeliver bounds it too: on the
	// last allowed delivery a failure is dead-lettered whatever the count.
	MaxAttempts int
	// Initial is the delay after the first failure; it doubles after each
	// further one. Defaults to defaultRetryInitial.
	Initial time.Duration
	// Max caps the delay. Defaults to defaultRetryMax; it must not exceed
	// the topology's MaxRedeliveryDelay (5m).
	Max time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = defaultMaxAttempts
	}
	if p.Initial <= 0 {
		p.Initial = defaultRetryInitial
	}
	if p.Max <= 0 {
		p.Max = max(defaultRetryMax, p.Initial)
	}
	return p
}

// Delay is the wait after the attempt-th failed attempt (1-based):
// Initial·2^(attempt-1), capped at Max, with ±20% jitter (never above Max).
func (p RetryPolicy) Delay(attempt int) time.Duration {
	p = p.withDefaults()
	d := p.Initial
	for i := 1; i < attempt && d < p.Max; i++ {
		d *= 2
	}
	d = min(d, p.Max)
	d = time.Duration(float64(d) * (1 - retryJitter + 2*retryJitter*rand.Float64()))
	return min(d, p.Max)
}

// Route is one sink and what it receives.
type Route struct {
	// Sink delivers.
	Sink notify.Sink
	// Severities the sink receives; empty means all.
	Severities []string
	// Labels the notification must carry (value "*": any value); empty
	// means all.
	Labels map[string]string
	// Retry is how failures of this sink are retried.
	Retry RetryPolicy
	// Timeout bounds one Send. Defaults to defaultSendTimeout.
	Timeout time.Duration
}

// Matches reports whether the route takes n: its severity is listed (or no
// severity is) and it carries every required label.
func (r Route) Matches(n *events.Notification) bool {
	if len(r.Severities) > 0 && !slices.Contains(r.Severities, n.Severity) {
		return false
	}
	for k, want := range r.Labels {
		have, ok := n.Labels[k]
		if !ok || (want != "*" && have != want) {
			return false
		}
	}
	return true
}

func (r Route) timeout() time.Duration {
	if r.Timeout > 0 {
		return r.Timeout
	}
	return defaultSendTimeout
}

// BuildOptions are what Routes needs besides the policy.
type BuildOptions struct {
	// Getenv reads the environment variables the policy names. Defaults to
	// os.Getenv.
	Getenv func(string) string
	// HTTPClient is used by the HTTP sinks. Defaults to a shared client.
	HTTPClient *http.Client
	// Log is where log sinks write. The zero value writes nothing.
	Log zerolog.Logger
}

// Routes builds the sinks of the policy's notify section. Secrets come
// from the environment variables it names; a named variable that is empty
// is an error, so a signature or credential cannot silently go missing.
// With no sink configured it returns one log sink (DefaultLogSinkName)
// taking everything: `failbus dev` and `failbus demo` print notifications.
func Routes(cfg notification.Config, opts BuildOptions) ([]Route, error) {
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if len(cfg.Sinks) == 0 {
		s, err := notify.NewLog(defaultLogSinkName, opts.Log)
		if err != nil {
			return nil, err
		}
		return []Route{{Sink: s}}, nil
	}
	var (
		routes []Route
		errs   []error
	)
	for _, sc := range cfg.Sinks {
		s, err := buildSink(sc, opts)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		routes = append(routes, Route{
			Sink:       s,
			Severities: slices.Clone(sc.Severities),
			Labels:     sc.Labels,
			Retry:      RetryPolicy{MaxAttempts: sc.MaxAttempts, Initial: sc.RetryInitial, Max: sc.RetryMax},
			Timeout:    sc.Timeout,
		})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return routes, nil
}

func buildSink(sc notification.SinkConfig, opts BuildOptions) (notify.Sink, error) {
	env := func(field, name string, required bool) (string, error) {
		if name == "" {
			if required {
				return "", fmt.Errorf("sink %q: %s is required", sc.Name, field)
			}
			return "", nil
		}
		v := opts.Getenv(name)
		if v == "" {
			return "", fmt.Errorf("sink %q: %s names $%s, which is not set", sc.Name, field, name)
		}
		return v, nil
	}
	rawURL := sc.URL
	if sc.URLEnv != "" {
		v, err := env("url_env", sc.URLEnv, true)
		if err != nil {
			return nil, err
		}
		rawURL = v
	}
	switch sc.Type {
	case notification.SinkWebhook:
		secret, err := env("secret_env", sc.SecretEnv, false)
		if err != nil {
			return nil, err
		}
		return notify.NewWebhook(notify.WebhookConfig{Name: sc.Name, URL: rawURL, Secret: []byte(secret), Idempotent: sc.Idempotent, Client: opts.HTTPClient})
	case notification.SinkSlack:
		return notify.NewSlack(notify.SlackConfig{Name: sc.Name, URL: rawURL, Client: opts.HTTPClient})
	case notification.SinkNtfy:
		token, err := env("secret_env", sc.SecretEnv, false)
		if err != nil {
			return nil, err
		}
		return notify.NewNtfy(notify.NtfyConfig{Name: sc.Name, URL: rawURL, Topic: sc.Topic, Token: token, Client: opts.HTTPClient})
	case notification.SinkSMTP:
		u, err := url.Parse(rawURL)
		if err != nil || u.Scheme != "smtp" || u.Host == "" {
			return nil, fmt.Errorf("sink %q: url must be smtp://host:port", sc.Name)
		}
		password, err := env("secret_env", sc.SecretEnv, false)
		if err != nil {
			return nil, err
		}
		return notify.NewSMTP(notify.SMTPConfig{Name: sc.Name, Addr: u.Host, From: sc.From, To: slices.Clone(sc.To),
			Username: sc.Username, Password: password, StartTLS: sc.StartTLS})
	case notification.SinkPagerDuty:
		name := sc.RoutingKeyEnv
		if name == "" {
			name = sc.SecretEnv
		}
		key, err := env("routing_key_env", name, true)
		if err != nil {
			return nil, err
		}
		return notify.NewPagerDuty(notify.PagerDutyConfig{Name: sc.Name, URL: rawURL, RoutingKey: key, Client: opts.HTTPClient})
	case notification.SinkLog:
		return notify.NewLog(sc.Name, opts.Log)
	}
	return nil, fmt.Errorf("sink %q: unknown type %q", sc.Name, sc.Type)
}
