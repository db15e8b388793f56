package policy

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/pkg/events"
)

// contractPolicy is the policy file of CONTRACT.md, verbatim.
const contractPolicy = `
retry:
  mode: normal              # normal | always
  max_retries: 10
  initial_delay: 1s
  max_delay: 60s
  jitter_ratio: 0.2         # symmetric: delay × (1 − r + 2r·u), mean 1
  retryable_add: []         # classes added to the default retryable set
  retryable_remove: []      # classes removed from it
  providers:                # per-provider overrides of any retry key above
    my-gateway:
      retryable_add: [context_overflow]
refusal:
  reprobe_delays: [15m, 1h, 6h]
notify:
  daily_budget: 20          # non-critical notifications per UTC day; critical always sent
  sinks:
    - name: ops
      type: webhook         # webhook | slack | ntfy | smtp | pagerduty | log
      url: http://127.0.0.1:9000/hook
      secret_env: FAILBUS_WEBHOOK_SECRET   # optional: HMAC-SHA256 of the body, hex, in X-Failbus-Signature
      severities: [normal, critical]       # optional filter; absent = all
`

func TestParseEmptyIsDefault(t *testing.T) {
	t.Parallel()
	for _, doc := range []string{"", "\n", "# nothing\n", "---\n"} {
		p, err := Parse([]byte(doc))
		if err != nil {
			t.Fatalf("Parse(%q): %v", doc, err)
		}
		if !reflect.DeepEqual(p, Default()) {
			t.Errorf("Parse(%q) = %+v, want Default()", doc, p)
		}
	}
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate(): %v", err)
	}
}

func TestParseContractExample(t *testing.T) {
	t.Parallel()
	p, err := Parse([]byte(contractPolicy))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	g := p.RetryFor("openai")
	gw := p.RetryFor("my-gateway")
	if g.IsRetryable(events.ClassContextOverflow) {
		t.Error("context_overflow retryable for openai; only my-gateway adds it")
	}
	if !gw.IsRetryable(events.ClassContextOverflow) {
		t.Error("my-gateway: context_overflow not retryable")
	}
	for _, c := range []string{events.ClassTransport, events.ClassTimeout, events.ClassRateLimit, events.ClassOverloaded, events.ClassServerError, events.ClassEmptyResponse} {
		if !gw.IsRetryable(c) {
			t.Errorf("my-gateway: default %s dropped by adding a class", c)
		}
	}
	if gw.MaxRetries != 10 || gw.InitialDelay != time.Second || gw.MaxDelay != time.Minute || gw.JitterRatio != 0.2 || gw.Mode != retry.ModeNormal {
		t.Errorf("my-gateway resolved to %+v, want the global values", gw)
	}
	if got := p.Refusal.ReprobeDelays; !reflect.DeepEqual(got, []time.Duration{15 * time.Minute, time.Hour, 6 * time.Hour}) {
		t.Errorf("reprobe_delays = %v", got)
	}
	want := notification.SinkConfig{Name: "ops", Type: notification.SinkWebhook, URL: "http://127.0.0.1:9000/hook", SecretEnv: "FAILBUS_WEBHOOK_SECRET", Severities: []string{"normal", "critical"}}
	if len(p.Notify.Sinks) != 1 || !reflect.DeepEqual(p.Notify.Sinks[0], want) {
		t.Errorf("sinks = %+v", p.Notify.Sinks)
	}
	if p.Notify.Sinks[0].Accepts(events.SeverityInfo) || !p.Notify.Sinks[0].Accepts(events.SeverityCritical) {
		t.Error("severity filter not applied")
	}
	if !reflect.DeepEqual(p.Scope, scope.DefaultConfig()) {
		t.Errorf("scope = %+v, want defaults", p.Scope)
	}
}

func TestParseOverrides(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		doc      string
		provider string
		check    func(t *testing.T, r *retry.Policy)
	}{
		{
			name: "partial section keeps the other defaults",
			doc:  "retry: {max_retries: 3}",
			check: func(t *testing.T, r *retry.Policy) {
				if r.MaxRetries != 3 || r.InitialDelay != retry.DefaultInitialDelay || r.MaxDelay != retry.DefaultMaxDelay || r.JitterRatio != retry.DefaultJitterRatio {
					t.Errorf("got %+v", r)
				}
			},
		},
		{
			name: "remove a default class",
			doc:  "retry: {retryable_remove: [rate_limit]}",
			check: func(t *testing.T, r *retry.Policy) {
				if r.IsRetryable(events.ClassRateLimit) || !r.IsRetryable(events.ClassServerError) {
					t.Errorf("retryable = %v", r.Retryable)
				}
			},
		},
		{
			name:     "provider removes what the global section added",
			doc:      "retry:\n  retryable_add: [context_overflow]\n  providers:\n    strict: {retryable_remove: [context_overflow, timeout]}",
			provider: "strict",
			check: func(t *testing.T, r *retry.Policy) {
				if r.IsRetryable(events.ClassContextOverflow) || r.IsRetryable(events.ClassTimeout) || !r.IsRetryable(events.ClassTransport) {
					t.Errorf("retryable = %v", r.Retryable)
				}
			},
		},
		{
			name:     "provider overrides every scalar",
			doc:      "retry:\n  providers:\n    slow: {mode: always, max_retries: 2, initial_delay: 1500ms, max_delay: 5m, jitter_ratio: 0, episode_idle: 20m}",
			provider: "slow",
			check: func(t *testing.T, r *retry.Policy) {
				want := retry.Policy{Provider: "slow", Mode: retry.ModeAlways, MaxRetries: 2, InitialDelay: 1500 * time.Millisecond, MaxDelay: 5 * time.Minute, JitterRatio: 0, EpisodeIdle: 20 * time.Minute}
				got := *r
				got.Retryable = nil
				if !reflect.DeepEqual(got, want) {
					t.Errorf("got %+v, want %+v", got, want)
				}
			},
		},
		{
			name:     "another provider is not affected by an override",
			doc:      "retry:\n  providers:\n    slow: {max_retries: 2}",
			provider: "openai",
			check: func(t *testing.T, r *retry.Policy) {
				if r.MaxRetries != retry.DefaultMaxRetries {
					t.Errorf("max_retries = %d", r.MaxRetries)
				}
			},
		},
		{
			name: "every section at once",
			doc: `
classify:
  quota_after: 2h
  rules:
    - {id: gw.busy, class: server_error, status: ["400"], headers: {x-gw: busy}, body: [busy]}
refusal: {reprobe_delays: [1m, 2m], max_rerenders: 1}
notify: {daily_budget: 0, sinks: [{name: l, type: log}]}
scope: {window: 2m, outage_min_failures: 5, recovery_min_successes: 4, recovery_min_time: 10m, forget_after: 1h, failover: {openai: [anthropic]}}
`,
			provider: "openai",
			check: func(t *testing.T, r *retry.Policy) {
				if r.MaxRetries != retry.DefaultMaxRetries {
					t.Errorf("retry defaults lost: %+v", r)
				}
			},
		},
		{
			name:     "mode off is no policy",
			doc:      "retry:\n  providers:\n    raw: {mode: off}",
			provider: "raw",
			check: func(t *testing.T, r *retry.Policy) {
				if r != nil {
					t.Errorf("RetryFor = %+v, want nil", r)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := Parse([]byte(tt.doc))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			tt.check(t, p.RetryFor(tt.provider))
		})
	}
}

func TestParseErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		want string // substring of the error
	}{
		{"unknown section", "retries: {}", `unknown key "retries" (line 1)`},
		{"unknown retry key", "retry:\n  max_retry: 3", `unknown key "retry.max_retry" (line 2)`},
		{"unknown provider key", "retry:\n  providers:\n    gw:\n      jitter: 0.1", `unknown key "retry.providers.gw.jitter" (line 4)`},
		{"unknown scope key", "scope: {windw: 1m}", `unknown key "scope.windw"`},
		{"unknown sink key", "notify:\n  sinks:\n    - {name: a, type: log, colour: red}", `unknown key "notify.sinks[0].colour"`},
		{"unknown refusal key", "refusal: {reprobes: [1m]}", `unknown key "refusal.reprobes"`},
		{"unknown classify key", "classify: {ruls: []}", `unknown key "classify.ruls"`},
		{"unknown key in a rule", "classify:\n  rules:\n    - {id: gw.busy, class: server_error, bodies: [busy]}", `unknown key "classify.rules[0].bodies" (line 3)`},
		{"unknown class in a rule", "classify:\n  rules:\n    - {id: gw.busy, class: busy, body: [busy]}", `policy: classify.rules[0]`},
		{"unknown class added", "retry: {retryable_add: [foo]}", `policy: retry.retryable_add: "foo" is not a class`},
		{"unknown class removed per provider", "retry:\n  providers:\n    gw: {retryable_remove: [RATE_LIMIT]}", `policy: retry.providers.gw.retryable_remove: "RATE_LIMIT" is not a class`},
		{"ok is no failure", "retry: {retryable_add: [ok]}", `"ok" is not a failure class`},
		{"refusals are not retried", "retry: {retryable_add: [content_refusal]}", `"content_refusal" is governed by the refusal: section`},
		{"added and removed", "retry: {retryable_add: [tls], retryable_remove: [tls]}", `"tls" is both in retryable_add and retryable_remove`},
		{"bare number duration", "retry: {max_delay: 60}", `retry.max_delay: "60" is not a Go duration`},
		{"bad duration", "retry: {initial_delay: 1 second}", `retry.initial_delay: "1 second" is not a Go duration`},
		{"bad duration in list", "refusal: {reprobe_delays: [15m, soon]}", `refusal.reprobe_delays[1]: "soon" is not a Go duration`},
		{"bad mode", "retry: {mode: sometimes}", `policy: retry.mode: "sometimes" is not normal, always or off`},
		{"bad provider mode", "retry:\n  providers:\n    gw: {mode: never}", `policy: retry.providers.gw.mode: "never"`},
		{"negative budget", "retry: {max_retries: -1}", `retry.max_retries: must be >= 0`},
		{"zero initial delay", "retry: {initial_delay: 0s}", `retry.initial_delay: must be positive`},
		{"max below initial", "retry: {initial_delay: 10s, max_delay: 5s}", `retry.max_delay: 5s is below initial_delay 10s`},
		{"provider max below global initial", "retry:\n  providers:\n    gw: {max_delay: 500ms}", `retry.providers.gw.max_delay: 500ms is below initial_delay 1s`},
		{"jitter above 1", "retry: {jitter_ratio: 1.5}", `retry.jitter_ratio: must be within [0, 1]`},
		{"wrong type", "retry: {max_retries: many}", `retry.max_retries: want a whole number, got "many" (line 1)`},
		{"sink type", "notify:\n  sinks:\n    - {name: a, type: carrier-pigeon}", `policy: notify.sinks[0].type: "carrier-pigeon" is not webhook`},
		{"sink without url", "notify:\n  sinks:\n    - {name: a, type: slack}", `notify.sinks[0].url: required for type slack`},
		{"sink names unique", "notify:\n  sinks:\n    - {name: a, type: log}\n    - {name: a, type: log}", `notify.sinks[1].name: "a" is used by another sink`},
		{"sink severity", "notify:\n  sinks:\n    - {name: a, type: log, severities: [urgent]}", `notify.sinks[0].severities[0]: "urgent"`},
		{"negative daily budget", "notify: {daily_budget: -1}", `notify.daily_budget: must be >= 0`},
		{"recover on one call", "scope: {recovery_min_successes: 1}", `scope.recovery_min_successes: must be >= 2`},
		{"forget before window", "scope: {window: 1h, forget_after: 10m}", `scope.forget_after: 10m0s is below scope.window 1h0m0s`},
		{"failover to itself", "scope:\n  failover:\n    openai: [openai]", `scope.failover.openai[0]: a provider cannot fail over to itself`},
		{"refusal validation", "refusal: {reprobe_delays: [-1m]}", `policy: refusal.reprobe_delays[0]: must be positive`},
		{"not a mapping", "- retry", `the document must be a mapping`},
		{"section not a mapping", "retry: 3", `retry: want a mapping`},
		{"bad yaml", "retry: {", `policy: yaml`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.doc))
			if err == nil {
				t.Fatalf("Parse(%q) succeeded, want an error containing %q", tt.doc, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) error:\n%v\nwant it to contain %q", tt.doc, err, tt.want)
			}
			if !strings.HasPrefix(err.Error(), "policy: ") {
				t.Errorf("error %q does not start with \"policy: \"", err)
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte("retry: {retryable_add: [foo, bar], jitter_ratio: 2}"))
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`"foo" is not a class`, `"bar" is not a class`, `jitter_ratio`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte(contractPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("retry: {retryable_add: [foo]}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(good); err != nil {
		t.Errorf("Load(good): %v", err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), `"foo" is not a class`) {
		t.Errorf("Load(bad) = %v, want the path and the class named", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("Load(missing) succeeded")
	}
}

func TestParseScopeAndNotify(t *testing.T) {
	t.Parallel()
	p := coreMustPolicy(t, `
notify: {daily_budget: 0, sinks: [{name: l, type: log}]}
scope: {window: 2m, outage_min_failures: 5, recovery_min_successes: 4, recovery_min_time: 10m, forget_after: 1h, failover: {openai: [anthropic]}}
`)
	want := scope.Config{Window: 2 * time.Minute, OutageMinFailures: 5, RecoveryMinSuccesses: 4, RecoveryMinTime: 10 * time.Minute, ForgetAfter: time.Hour,
		MaxProfiles: scope.DefaultMaxProfiles, MaxModels: scope.DefaultMaxModels, ErrorRatio: scope.DefaultErrorRatio, ErrorSample: scope.DefaultErrorSample,
		MaxAgentsPerProfile: scope.DefaultMaxAgentsPerProfile, Failover: map[string][]string{"openai": {"anthropic"}}}
	if !reflect.DeepEqual(p.Scope, want) {
		t.Errorf("scope = %+v, want %+v", p.Scope, want)
	}
	if p.Notify.DailyBudget != 0 || len(p.Notify.Sinks) != 1 {
		t.Errorf("notify = %+v", p.Notify)
	}
	partial := coreMustPolicy(t, "scope: {window: 1m}")
	if partial.Scope.RecoveryMinSuccesses != scope.DefaultRecoveryMinSuccesses || partial.Scope.Window != time.Minute {
		t.Errorf("partial scope = %+v", partial.Scope)
	}
}

func coreMustPolicy(t *testing.T, doc string) *Policy {
	t.Helper()
	p, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse(%q): %v", doc, err)
	}
	return p
}

func TestRecoverySectionParses(t *testing.T) {
	p, err := Parse([]byte("recovery:\n  drain_rate: 2.5\n  probe_interval: 5s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Recovery.DrainRate != 2.5 || p.Recovery.ProbeInterval != 5*time.Second || p.Recovery.CatchupWindow != 6*time.Hour {
		t.Fatalf("recovery section %+v", p.Recovery)
	}
	for doc, want := range map[string]string{
		"recovery:\n  drainrate: 3\n":       `unknown key "recovery.drainrate"`,
		"recovery:\n  probe_interval: 30\n": "recovery.probe_interval",
		"recovery:\n  drain_rate: -1\n":     "recovery.drain_rate",
		"recovery:\n  probes:\n    x: {}\n": "recovery.probes.x.url",
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error naming %s", doc, err, want)
		}
	}
}
