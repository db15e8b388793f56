package delivery_test

import (
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/delivery"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/notify"
	"github.com/failbus/failbus/pkg/policy"
)

func TestRoutesFromPolicy(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"FAILBUS_WEBHOOK_SECRET":        "whsec",
		"FAILBUS_SLACK_WEBHOOK_URL":     "https://hooks.slack.example/services/T/B/X",
		"FAILBUS_NTFY_TOKEN":            "tk_x",
		"FAILBUS_SMTP_PASSWORD":         "pw",
		"FAILBUS_PAGERDUTY_ROUTING_KEY": "R0UTE",
	}
	getenv := func(k string) string { return env[k] }
	tests := []struct {
		name    string
		yaml    string
		getenv  func(string) string
		want    []string // sink names, in order
		idem    []bool
		wantErr string
	}{
		{name: "no sinks means the log sink", yaml: "notify: {daily_budget: 5}", want: []string{delivery.DefaultLogSinkName}, idem: []bool{false}},
		{name: "the documented example policy builds every sink", yaml: "@../../docs/policy.example.yaml", getenv: getenv,
			want: []string{"ops-webhook", "gateway-team", "phones", "mail", "pager", "audit"}, idem: []bool{true, false, false, false, true, false}},
		{name: "an unset secret variable is an error naming it", yaml: `
notify:
  sinks:
    - {name: ops, type: webhook, url: "http://127.0.0.1:1/h", secret_env: NOT_SET_ANYWHERE}
`, wantErr: "NOT_SET_ANYWHERE"},
		{name: "a pagerduty sink needs its routing key", yaml: `
notify:
  sinks:
    - {name: pager, type: pagerduty, routing_key_env: PD_KEY}
`, wantErr: "PD_KEY"},
		{name: "smtp needs an smtp:// url", yaml: `
notify:
  sinks:
    - {name: mail, type: smtp, url: "http://mail.example:25", from: a@b.example, to: [c@d.example]}
`, wantErr: "smtp://host:port"},
		{name: "retry and timeout keys reach the route", yaml: `
notify:
  sinks:
    - {name: ops, type: webhook, url: "http://127.0.0.1:1/h", max_attempts: 3, retry_initial: 1s, retry_max: 5s, timeout: 2s, labels: {team: infra}}
`, want: []string{"ops"}, idem: []bool{false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var (
				p   *policy.Policy
				err error
			)
			if path, ok := strings.CutPrefix(tc.yaml, "@"); ok {
				p, err = policy.Load(path)
			} else {
				p, err = policy.Parse([]byte(tc.yaml))
			}
			if err != nil {
				t.Fatalf("policy: %v", err)
			}
			ge := tc.getenv
			if ge == nil {
				ge = func(string) string { return "" }
			}
			routes, err := delivery.Routes(p.Notify, delivery.BuildOptions{Getenv: ge})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Routes error = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Routes: %v", err)
			}
			if len(routes) != len(tc.want) {
				t.Fatalf("%d routes, want %d", len(routes), len(tc.want))
			}
			for i, r := range routes {
				if r.Sink.Name() != tc.want[i] || idempotent(r.Sink) != tc.idem[i] {
					t.Errorf("route %d: %s idempotent=%v, want %s idempotent=%v", i, r.Sink.Name(), idempotent(r.Sink), tc.want[i], tc.idem[i])
				}
			}
			if tc.name == "retry and timeout keys reach the route" {
				r := routes[0]
				if r.Retry.MaxAttempts != 3 || r.Retry.Initial != time.Second || r.Retry.Max != 5*time.Second || r.Timeout != 2*time.Second || r.Labels["team"] != "infra" {
					t.Errorf("route %+v", r)
				}
			}
		})
	}
}

func TestRetryDelayDoublesWithinBounds(t *testing.T) {
	t.Parallel()
	p := delivery.RetryPolicy{Initial: time.Second, Max: 10 * time.Second}
	tests := []struct {
		attempt  int
		min, max time.Duration
	}{
		{1, 800 * time.Millisecond, 1200 * time.Millisecond},
		{2, 1600 * time.Millisecond, 2400 * time.Millisecond},
		{3, 3200 * time.Millisecond, 4800 * time.Millisecond},
		{4, 6400 * time.Millisecond, 9600 * time.Millisecond},
		{5, 8 * time.Second, 10 * time.Second},
		{60, 8 * time.Second, 10 * time.Second},
	}
	for _, tc := range tests {
		for range 50 {
			if d := p.Delay(tc.attempt); d < tc.min || d > tc.max {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", tc.attempt, d, tc.min, tc.max)
			}
		}
	}
}

// The case of a sink down for a minute, with the defaults: even
// with every delay at the low end of its jitter, the attempts a route is
// allowed span more than a minute, and the production consumer delivers a
// request at least that many times, so the request is still being retried
// when the receiver comes back.
func TestDefaultRetryBudgetOutlastsAOneMinuteOutage(t *testing.T) {
	t.Parallel()
	var p delivery.RetryPolicy // the defaults
	for range 200 {
		var span time.Duration
		for attempt := 1; attempt < delivery.DefaultMaxAttempts; attempt++ {
			span += p.Delay(attempt)
		}
		if span <= time.Minute {
			t.Fatalf("%d attempts span %v: want more than a minute", delivery.DefaultMaxAttempts, span)
		}
	}
	_, c, ok := topology.Consumer(topology.ConsumerNotifier)
	if !ok {
		t.Fatal("no notifier consumer in the topology")
	}
	if c.MaxDeliver < delivery.DefaultMaxAttempts {
		t.Errorf("consumer MaxDeliver %d < DefaultMaxAttempts %d: the server would give up before the sink's retry budget", c.MaxDeliver, delivery.DefaultMaxAttempts)
	}
}

// idempotent reports whether s declares that its receiver deduplicates
// (notify.Idempotent).
func idempotent(s notify.Sink) bool {
	i, ok := s.(notify.Idempotent)
	return ok && i.Idempotent()
}
