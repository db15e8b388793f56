package retry_test

import (
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// coreT0 is the virtual clock's origin in the pure-core tests.
var coreT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func coreMustPolicy(t *testing.T, doc string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse(%q): %v", doc, err)
	}
	return p
}

// failure is a classification of class on openai/gpt/p1, turn 1 step 1.
func coreFailure(id, class string) events.Classification {
	info, _ := events.LookupClass(class)
	return events.Classification{
		OutcomeID: id, Agent: "a1", Session: "s1", Turn: 1, Step: 1,
		Provider: "openai", Model: "gpt", Profile: "p1",
		Class: class, Scope: info.Scope, Rule: "test",
	}
}

func coreWithHint(c events.Classification, ms int64, source string) events.Classification {
	c.Hints = &events.RetryHints{AfterMS: ms, Source: source}
	return c
}

func coreWithShouldRetry(c events.Classification, v bool) events.Classification {
	if c.Hints == nil {
		c.Hints = &events.RetryHints{}
	}
	c.Hints.ShouldRetry = &v
	return c
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	const s = time.Second
	tests := []struct {
		name    string
		n       int
		initial time.Duration
		max     time.Duration
		ratio   float64
		u       float64
		want    time.Duration
	}{
		{"first retry at mean jitter is the initial delay", 1, s, 60 * s, 0.2, 0.5, s},
		{"second doubles", 2, s, 60 * s, 0.2, 0.5, 2 * s},
		{"sixth is 32s", 6, s, 60 * s, 0.2, 0.5, 32 * s},
		{"seventh is capped by max", 7, s, 60 * s, 0.2, 0.5, 60 * s},
		{"u=0 is the low edge 1-r", 3, s, 60 * s, 0.2, 0, 3200 * time.Millisecond},
		{"u=1 is the high edge 1+r", 3, s, 60 * s, 0.2, 1, 4800 * time.Millisecond},
		{"jitter above the cap is capped again", 7, s, 60 * s, 0.2, 1, 60 * s},
		{"jitter below the cap stays below", 7, s, 60 * s, 0.2, 0, 48 * s},
		{"ratio 0 is exact", 4, 500 * time.Millisecond, 60 * s, 0, 0.99, 4 * s},
		{"exponent is bounded: retry 5000 does not overflow", 5000, s, 60 * s, 0.2, 0.5, 60 * s},
		{"retry 0 is treated as the first", 0, s, 60 * s, 0, 0.5, s},
		{"u outside [0,1] is clamped", 1, s, 60 * s, 0.5, 7, 1500 * time.Millisecond},
		{"rounded to whole milliseconds", 1, s, 60 * s, 0.2, 0.123456789, 849 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := retry.Backoff(tt.n, tt.initial, tt.max, tt.ratio, tt.u); got != tt.want {
				t.Errorf("Backoff(%d, %s, %s, %v, %v) = %s, want %s", tt.n, tt.initial, tt.max, tt.ratio, tt.u, got, tt.want)
			}
		})
	}
}

func TestBackoffMeanIsOne(t *testing.T) {
	t.Parallel()
	// Symmetric jitter: over a uniform grid of u the mean delay is the
	// exponential delay itself, so many concurrent retries do not drift.
	var sum time.Duration
	const n = 1000
	for i := 0; i < n; i++ {
		sum += retry.Backoff(3, time.Second, time.Minute, 0.2, (float64(i)+0.5)/n)
	}
	if mean := sum / n; mean < 3999*time.Millisecond || mean > 4001*time.Millisecond {
		t.Errorf("mean backoff %s, want 4s", mean)
	}
}

func TestDecideRetryChain(t *testing.T) {
	t.Parallel()
	normal := coreMustPolicy(t, "")
	always := coreMustPolicy(t, "retry: {mode: always}")
	overflowRetryable := coreMustPolicy(t, "retry: {retryable_add: [context_overflow]}")
	off := coreMustPolicy(t, "retry: {mode: off}")

	// prior builds the budget's latest record after n retries under p.
	prior := func(p *policy.Policy, c events.Classification, n int, outcome string) *retry.Record {
		rp := p.RetryFor(c.Provider)
		b := retry.BudgetFor(c, rp)
		return &retry.Record{RetryID: b.RetryID(n), OutcomeID: outcome, Agent: b.Agent, Session: b.Session, Turn: b.Turn, Step: b.Step,
			Provider: b.Provider, PolicyKey: b.PolicyKey, Retry: n, DelayMS: 4000, At: events.At(coreT0.Add(-4 * time.Second)), DueAt: events.At(coreT0), Class: c.Class, Reason: "earlier"}
	}
	outage := scope.Verdict{Outage: true, OutageSince: coreT0.Add(-time.Minute), Reason: "every profile fails at the network layer"}

	tests := []struct {
		name   string
		pol    *policy.Policy
		c      events.Classification
		scope  scope.Verdict
		prior  *retry.Record
		u      float64
		action string
		// For retries:
		retry   int
		delay   time.Duration
		replay  bool
		reason  string // substring of the decision's reason
		profile string // expected decision profile (when set)
		model   string // expected decision model (when set)
		target  string // expected decision provider (when set)
	}{
		// 1. Outage.
		{name: "outage: wait_provider, no budget", pol: normal, c: coreFailure("o", events.ClassTransport), scope: outage, action: events.ActionWaitProvider, reason: "hold until"},
		{name: "outage beats a model switch", pol: always, c: coreFailure("o", events.ClassUnsupportedParam), scope: scope.Verdict{Outage: true, SwitchModel: "gpt-mini"}, action: events.ActionWaitProvider},
		{name: "outage with a failover", pol: normal, c: coreFailure("o", events.ClassTimeout), scope: scope.Verdict{Outage: true, FailoverProvider: "anthropic"}, action: events.ActionSwitchProvider, target: "anthropic"},
		{name: "outage even without a policy", pol: off, c: coreFailure("o", events.ClassTransport), scope: outage, action: events.ActionWaitProvider},
		// 2. 429 on one profile, another works.
		{name: "429 while another profile works: switch_profile in normal mode", pol: normal, c: coreWithHint(coreFailure("o", events.ClassRateLimit), 2000, classify.HintRetryAfter), scope: scope.Verdict{SwitchProfile: "p2"}, action: events.ActionSwitchProfile, profile: "p2"},
		{name: "429 on every profile: retry after the hint, never switch", pol: normal, c: coreWithHint(coreFailure("o", events.ClassRateLimit), 2000, classify.HintRetryAfter), scope: scope.Verdict{ProviderRateLimited: true}, action: events.ActionRetry, retry: 1, delay: 2 * time.Second, reason: "no profile switch"},
		{name: "429 on every profile without a hint: wait for the cooldown another profile got", pol: normal, c: coreFailure("o", events.ClassRateLimit), scope: scope.Verdict{ProviderRateLimited: true, CooldownUntil: coreT0.Add(7 * time.Second)}, action: events.ActionRetry, retry: 1, delay: 7 * time.Second, reason: "cooldown"},
		{name: "429 on every profile, cooldown over: backoff", pol: normal, c: coreFailure("o", events.ClassRateLimit), scope: scope.Verdict{ProviderRateLimited: true, CooldownUntil: coreT0.Add(-time.Second)}, u: 0.5, action: events.ActionRetry, retry: 1, delay: time.Second},
		// 3. No policy: pass on.
		{name: "no policy: give_up", pol: off, c: coreFailure("o", events.ClassServerError), action: events.ActionGiveUp, reason: "no retry policy"},
		{name: "no policy: the specific recovery still applies", pol: off, c: coreFailure("o", events.ClassContextOverflow), action: events.ActionCompact, reason: "no retry policy"},
		// 4. Redelivery.
		{name: "redelivered outcome replays its record", pol: normal, c: coreFailure("o", events.ClassServerError), prior: prior(normal, coreFailure("o", events.ClassServerError), 3, "o"), action: events.ActionRetry, retry: 3, delay: 4 * time.Second, replay: true},
		// 5. x-should-retry: false.
		{name: "x-should-retry false: give_up even with budget", pol: normal, c: coreWithShouldRetry(coreFailure("o", events.ClassServerError), false), action: events.ActionGiveUp, reason: "x-should-retry: false"},
		{name: "x-should-retry false in always mode: give_up", pol: always, c: coreWithShouldRetry(coreFailure("o", events.ClassServerError), false), action: events.ActionGiveUp},
		{name: "x-should-retry true changes nothing", pol: normal, c: coreWithShouldRetry(coreFailure("o", events.ClassServerError), true), u: 0.5, action: events.ActionRetry, retry: 1, delay: time.Second},
		// 6. Always mode: specific first.
		{name: "always: overflow compacts", pol: always, c: coreFailure("o", events.ClassContextOverflow), action: events.ActionCompact},
		{name: "always: auth switches profile when another works", pol: always, c: coreFailure("o", events.ClassAuth), scope: scope.Verdict{SwitchProfile: "p2"}, action: events.ActionSwitchProfile, profile: "p2"},
		{name: "always: model fault switches model", pol: always, c: coreFailure("o", events.ClassModelNotFound), scope: scope.Verdict{SwitchModel: "gpt-mini"}, action: events.ActionSwitchModel, model: "gpt-mini"},
		{name: "always: auth without another profile retries as the fallback", pol: always, c: coreFailure("o", events.ClassAuth), u: 0.5, action: events.ActionRetry, retry: 1, delay: time.Second},
		{name: "always: bad_request retries as the fallback", pol: always, c: coreFailure("o", events.ClassBadRequest), u: 0.5, action: events.ActionRetry, retry: 1, delay: time.Second},
		// 7. Normal mode, not retryable.
		{name: "normal: overflow is terminal, compact", pol: normal, c: coreFailure("o", events.ClassContextOverflow), action: events.ActionCompact, reason: "not retryable"},
		{name: "normal: auth with another profile: switch_profile", pol: normal, c: coreFailure("o", events.ClassAuth), scope: scope.Verdict{SwitchProfile: "p2"}, action: events.ActionSwitchProfile, profile: "p2"},
		{name: "normal: quota with another profile: switch_profile", pol: normal, c: coreFailure("o", events.ClassQuotaExhausted), scope: scope.Verdict{SwitchProfile: "p2"}, action: events.ActionSwitchProfile, profile: "p2"},
		{name: "normal: auth alone: give_up", pol: normal, c: coreFailure("o", events.ClassAuth), action: events.ActionGiveUp, reason: "auth is not retryable"},
		{name: "normal: unsupported_param with another model: switch_model", pol: normal, c: coreFailure("o", events.ClassUnsupportedParam), scope: scope.Verdict{SwitchModel: "gpt-mini"}, action: events.ActionSwitchModel, model: "gpt-mini"},
		{name: "normal: tls is terminal", pol: normal, c: coreFailure("o", events.ClassTLS), action: events.ActionGiveUp},
		{name: "normal, overflow made retryable: retry short-circuits compact", pol: overflowRetryable, c: coreFailure("o", events.ClassContextOverflow), u: 0.5, action: events.ActionRetry, retry: 1, delay: time.Second},
		// 8. Budget.
		{name: "budget left: retry n+1", pol: normal, c: coreFailure("o2", events.ClassServerError), prior: prior(normal, coreFailure("o", events.ClassServerError), 3, "o"), u: 0.5, action: events.ActionRetry, retry: 4, delay: 8 * time.Second},
		{name: "budget exhausted: give_up", pol: normal, c: coreFailure("o11", events.ClassServerError), prior: prior(normal, coreFailure("o", events.ClassServerError), 10, "o10"), action: events.ActionGiveUp, reason: "retry budget exhausted: 10 of 10"},
		{name: "budget exhausted, overflow made retryable: compact", pol: overflowRetryable, c: coreFailure("o11", events.ClassContextOverflow), prior: prior(overflowRetryable, coreFailure("o", events.ClassContextOverflow), 10, "o10"), action: events.ActionCompact, reason: "budget exhausted"},
		{name: "always mode is bounded too", pol: always, c: coreFailure("o11", events.ClassServerError), prior: prior(always, coreFailure("o", events.ClassServerError), 10, "o10"), action: events.ActionGiveUp, reason: "budget exhausted"},
		{name: "a record of the old policy does not count: a new key starts a new count", pol: coreMustPolicy(t, "retry: {max_retries: 5}"), c: coreFailure("o11", events.ClassServerError), prior: prior(normal, coreFailure("o", events.ClassServerError), 10, "o10"), u: 0.5, action: events.ActionRetry, retry: 1, delay: time.Second},
		{name: "a record of another step does not count", pol: normal, c: func() events.Classification { c := coreFailure("o", events.ClassServerError); c.Step = 2; return c }(), prior: prior(normal, coreFailure("o0", events.ClassServerError), 10, "o0"), u: 0.5, action: events.ActionRetry, retry: 1, delay: time.Second},
		{name: "max_retries 0: first failure gives up", pol: coreMustPolicy(t, "retry: {max_retries: 0}"), c: coreFailure("o", events.ClassServerError), action: events.ActionGiveUp, reason: "0 of 0"},
		// 9. Delay.
		{name: "retry-after within max_delay: taken exactly, no jitter", pol: normal, c: coreWithHint(coreFailure("o", events.ClassRateLimit), 2000, classify.HintRetryAfter), u: 0.99, action: events.ActionRetry, retry: 1, delay: 2 * time.Second, reason: "retry-after"},
		{name: "retry-after-ms taken to the millisecond", pol: normal, c: coreWithHint(coreFailure("o", events.ClassServerError), 1234, classify.HintRetryAfterMS), u: 0, action: events.ActionRetry, retry: 1, delay: 1234 * time.Millisecond},
		{name: "hint equal to max_delay is taken", pol: normal, c: coreWithHint(coreFailure("o", events.ClassOverloaded), 60000, classify.HintBody), action: events.ActionRetry, retry: 1, delay: time.Minute},
		{name: "hint above max_delay, normal: give_up with the reason", pol: normal, c: coreWithHint(coreFailure("o", events.ClassRateLimit), 120000, classify.HintRetryAfter), action: events.ActionGiveUp, reason: "provider asked to wait 2m0s (retry-after), above max_delay 1m0s"},
		{name: "hint above max_delay, always: local backoff", pol: always, c: coreWithHint(coreFailure("o", events.ClassRateLimit), 120000, classify.HintRetryAfter), u: 0.5, action: events.ActionRetry, retry: 1, delay: time.Second, reason: "above max_delay"},
		{name: "no hint: backoff with jitter", pol: normal, c: coreFailure("o", events.ClassTimeout), u: 0, action: events.ActionRetry, retry: 1, delay: 800 * time.Millisecond, reason: "backoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := retry.Decide(retry.Input{
				Classification: tt.c,
				Policy:         tt.pol.RetryFor(tt.c.Provider),
				Scope:          tt.scope,
				Prior:          tt.prior,
				Now:            coreT0,
				U:              tt.u,
			})
			d := v.Decision
			if d.Action != tt.action {
				t.Fatalf("action = %s (%s), want %s", d.Action, d.Reason, tt.action)
			}
			if err := d.Validate(); err != nil {
				t.Errorf("decision invalid: %v", err)
			}
			if d.OutcomeID != tt.c.OutcomeID || d.Agent != tt.c.Agent || d.Class != tt.c.Class {
				t.Errorf("decision identity = %q %q %q", d.OutcomeID, d.Agent, d.Class)
			}
			if tt.reason != "" && !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("reason %q lacks %q", d.Reason, tt.reason)
			}
			if tt.profile != "" && d.Profile != tt.profile {
				t.Errorf("profile = %q, want %q", d.Profile, tt.profile)
			}
			if tt.model != "" && d.Model != tt.model {
				t.Errorf("model = %q, want %q", d.Model, tt.model)
			}
			if tt.target != "" && d.Provider != tt.target {
				t.Errorf("provider = %q, want %q", d.Provider, tt.target)
			}
			if tt.action != events.ActionRetry {
				if v.Record != nil || d.RetryID != "" || d.Retry != 0 || d.DelayMS != 0 {
					t.Errorf("%s spent budget: record %+v, decision %+v", tt.action, v.Record, d)
				}
				return
			}
			if v.Record == nil {
				t.Fatal("retry without a ledger record")
			}
			if v.Replayed != tt.replay {
				t.Errorf("replayed = %v, want %v", v.Replayed, tt.replay)
			}
			if d.Retry != tt.retry || v.Record.Retry != tt.retry {
				t.Errorf("retry = %d (record %d), want %d", d.Retry, v.Record.Retry, tt.retry)
			}
			if got := time.Duration(d.DelayMS) * time.Millisecond; got != tt.delay {
				t.Errorf("delay = %s, want %s (%s)", got, tt.delay, d.Reason)
			}
			if tt.replay {
				if *v.Record != *tt.prior {
					t.Errorf("replayed record %+v, want the prior %+v", v.Record, tt.prior)
				}
				return
			}
			if !d.DueAt.Equal(coreT0.Add(tt.delay)) {
				t.Errorf("due_at = %s, want now + %s", d.DueAt, tt.delay)
			}
			rp := tt.pol.RetryFor(tt.c.Provider)
			b := retry.BudgetFor(tt.c, rp)
			if d.RetryID != b.RetryID(tt.retry) || v.Record.RetryID != d.RetryID {
				t.Errorf("retry id = %q, want %q", d.RetryID, b.RetryID(tt.retry))
			}
			if v.Record.Budget() != b || v.Record.PolicyKey != rp.Key() {
				t.Errorf("record budget %+v, want %+v", v.Record.Budget(), b)
			}
			due := v.Record.Due()
			if due.RetryID != d.RetryID || !due.DueAt.Equal(d.DueAt.Time) || due.Retry != tt.retry || due.OutcomeID != tt.c.OutcomeID {
				t.Errorf("due message %+v does not match the decision", due)
			}
		})
	}
}

func TestDecideRetryIgnoresWhatIsNotItsOwn(t *testing.T) {
	t.Parallel()
	for _, class := range []string{events.ClassOK, events.ClassContentRefusal} {
		for _, doc := range []string{"", "retry: {mode: always}"} {
			v := retry.Decide(retry.Input{Classification: coreFailure("o", class), Policy: coreMustPolicy(t, doc).RetryFor("openai"), Now: coreT0})
			if v.Decision.Action != "" || v.Record != nil {
				t.Errorf("%s under %q: %+v", class, doc, v)
			}
		}
	}
}

// TestBudgetRunsToExhaustion walks one budget from the first failure to
// give_up, feeding each record back as the prior, as the scheduler does with
// its ledger: exactly max_retries retries, delays doubling to the cap.
func TestBudgetRunsToExhaustion(t *testing.T) {
	t.Parallel()
	p := coreMustPolicy(t, "retry: {max_retries: 8, initial_delay: 1s, max_delay: 30s, jitter_ratio: 0}")
	rp := p.RetryFor("openai")
	var prior *retry.Record
	now := coreT0
	wantDelays := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
	for i := 0; ; i++ {
		c := coreFailure("o"+string(rune('a'+i)), events.ClassServerError)
		v := retry.Decide(retry.Input{Classification: c, Policy: rp, Prior: prior, Now: now, U: 0.5})
		if i == len(wantDelays) {
			if v.Decision.Action != events.ActionGiveUp {
				t.Fatalf("after %d retries: %s, want give_up", i, v.Decision.Action)
			}
			break
		}
		if v.Decision.Action != events.ActionRetry || v.Decision.Retry != i+1 {
			t.Fatalf("failure %d: %+v", i, v.Decision)
		}
		if got := time.Duration(v.Decision.DelayMS) * time.Millisecond; got != wantDelays[i]*time.Second {
			t.Errorf("retry %d delay %s, want %s", i+1, got, wantDelays[i]*time.Second)
		}
		prior = v.Record
		now = v.Record.DueAt.Add(500 * time.Millisecond)
	}
}
