package retry

// The retry decision chain (docs/ARCHITECTURE.md § "Retries"), as one
// pure function: Decide. It maps a classified failure, the provider's
// resolved Policy, the fault-scope verdict and the budget's latest
// ledger record onto one CONTRACT.md Decision. First match wins:
//
//  1. Outage (fault scope): every known profile of the provider fails at the
//     network layer → wait_provider, or switch_provider when scope.failover
//     names a healthy alternative. No retry is scheduled, no budget spent,
//     no model switching: the network path is shared by every model.
//  2. 429 on this profile while another profile of the provider works
//     (fault scope) → switch_profile. This comes before the clock:
//     another credential helps now, waiting only burns time.
//  3. No policy (mode off) → pass on: the specific recovery (below), or
//     give_up.
//  4. The budget's latest record is this very outcome's (a redelivery) → the
//     same retry again, rebuilt from the record, nothing new spent.
//  5. x-should-retry: false → terminal: the specific recovery, or give_up.
//  6. Mode always and a specific recovery applies → that recovery.
//  7. Mode normal and the class is not in the retryable set → terminal.
//  8. Budget (agent, session, turn, step, provider, policy key) exhausted →
//     terminal. Without turn and step, the budget is the retry episode's
//     (episode.go).
//  9. Delay: the provider's hint (retry-after-ms, retry-after seconds or
//     date, body hints; for a provider-wide rate limit without its own hint,
//     the cooldown another profile was given) taken exactly, no jitter, when
//     it is within max_delay. Above max_delay: normal → terminal with the
//     reason; always → local backoff. No hint → local backoff:
//     min(initial·2^min(n−1,1024), max) × (1 − r + 2r·u), capped at max.
//  10. retry, with the ledger record to persist BEFORE the wait starts.
//
// "Terminal" passes the failure on: it is handed to the more specific
// recoveries registered after the retry policy, and give_up when none
// applies. The specific recoveries, in order:
//
//	context_overflow                               → compact
//	auth, quota_exhausted + another profile works  → switch_profile
//	unsupported_param, model_not_found
//	                   + another model works       → switch_model
//
// So normal mode lets a retryable class with budget short-circuit them (a
// user who adds context_overflow to the retryable set, as one harness did, gets
// retries first and compact only when the budget is gone), and always mode
// asks them first and retries any class only as the fallback.
//
// Deviation from the harness this chain comes from, on purpose: it checks
// the budget in normal mode only; failbus bounds always mode by max_retries
// too ("budget exhausted → terminal"), so "always" means "every class, specific
// recoveries first", never "forever".
//
// Content refusals never reach this chain: the refusal tiers decide them
// (rerender, skip_provider).

import (
	"fmt"
	"math"
	"time"

	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/pkg/events"
)

// Record is the ledger entry of one scheduled retry: the retry record
// of a durable retry state machine. It is written before the wait starts, and the budget's
// count is read back from the latest record, so a crash neither refunds nor
// overspends the budget.
type Record struct {
	RetryID   string `msgpack:"retry_id" json:"retry_id"`
	OutcomeID string `msgpack:"outcome_id" json:"outcome_id"`
	Agent     string `msgpack:"agent" json:"agent"`
	Session   string `msgpack:"session,omitempty" json:"session,omitempty"`
	Turn      int    `msgpack:"turn" json:"turn"`
	Step      int    `msgpack:"step" json:"step"`
	Provider  string `msgpack:"provider" json:"provider"`
	Model     string `msgpack:"model,omitempty" json:"model,omitempty"`
	Profile   string `msgpack:"profile,omitempty" json:"profile,omitempty"`
	PolicyKey string `msgpack:"policy_key" json:"policy_key"`
	// Retry is the 1-based number of this retry within its budget (its
	// retry episode, for an outcome without turn and step); it is the
	// budget's count after this record.
	Retry int `msgpack:"retry" json:"retry"`
	// Seq is the retry's number among every retry of its ledger, across
	// retry episodes (episode.go): the number in RetryID. 0 means Retry
	// (the first episode, and every budget of a turn and step).
	Seq int `msgpack:"seq,omitempty" json:"seq,omitempty"`
	// EndedAt and EndedBy are set on the mark that ends a retry episode
	// of an outcome without turn and step: when the success EndedBy (an
	// outcome id) was seen.
	EndedAt events.Time `msgpack:"ended_at,omitempty" json:"ended_at,omitzero"`
	EndedBy string      `msgpack:"ended_by,omitempty" json:"ended_by,omitempty"`
	// EpisodeFrom is the ledger revision the record's retry episode began
	// after (0: the ledger's start): a redelivered outcome's own record is
	// looked up from there, so the lookup stays as short as one episode
	// however many episodes the ledger holds. Set by the engine.
	EpisodeFrom uint64 `msgpack:"episode_from,omitempty" json:"episode_from,omitempty"`
	// Class is the failure that caused the retry.
	Class   string      `msgpack:"class" json:"class"`
	DelayMS int64       `msgpack:"delay_ms" json:"delay_ms"`
	At      events.Time `msgpack:"at" json:"at"`
	DueAt   events.Time `msgpack:"due_at" json:"due_at"`
	// DelaySource says where the delay came from: a hint source
	// (retry-after-ms, retry-after, retryDelay, body), "cooldown" or
	// "backoff".
	DelaySource string `msgpack:"delay_source" json:"delay_source"`
	Reason      string `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// Budget returns the key of the budget the record belongs to.
func (r *Record) Budget() BudgetKey {
	return BudgetKey{Agent: r.Agent, Session: r.Session, Turn: r.Turn, Step: r.Step, Provider: r.Provider, PolicyKey: r.PolicyKey}
}

// Due is the message that comes due when the retry's wait is over.
func (r *Record) Due() events.RetryDue {
	return events.RetryDue{RetryID: r.RetryID, OutcomeID: r.OutcomeID, Agent: r.Agent, Retry: r.Retry, DueAt: r.DueAt}
}

// Delay sources other than hint sources.
const (
	DelayBackoff  = "backoff"
	DelayCooldown = "cooldown"
)

// Input is everything Decide looks at; it reads nothing else.
type Input struct {
	// Classification is the failure (class ok is not a failure: no
	// decision). Its Retryable field is not consulted; the policy's set is.
	Classification events.Classification
	// Policy is the provider's resolved policy; nil means no policy.
	Policy *Policy
	// Scope is the fault-scope verdict for this classification.
	Scope scope.Verdict
	// Prior is the latest ledger record of this classification's budget
	// (BudgetFor), nil when the budget is untouched. A record of another
	// budget is ignored.
	Prior *Record
	// Now is the decision time; DueAt = Now + delay.
	Now time.Time
	// U is a uniform random number in [0, 1) for the jitter.
	U float64
}

// Verdict is Decide's answer.
type Verdict struct {
	// Decision is what the agent is told.
	Decision events.Decision
	// Record is set when Decision.Action is retry: the ledger entry to
	// persist before scheduling the due message.
	Record *Record
	// Replayed reports that Record is Prior itself (a redelivered
	// classification): it is already persisted and must not count again;
	// schedule and publish idempotently under its RetryID.
	Replayed bool
}

// BudgetFor is the budget a classification spends under policy r.
func BudgetFor(c events.Classification, r *Policy) BudgetKey {
	return BudgetKey{Agent: c.Agent, Session: c.Session, Turn: c.Turn, Step: c.Step, Provider: c.Provider, PolicyKey: r.Key()}
}

// Backoff is the local backoff for the n-th retry (1-based): the
// exponential min(initial·2^min(n−1,1024), max), times the symmetric jitter
// 1 − r + 2r·u (mean 1, so many concurrent retries neither drift early nor
// late), capped at max again and rounded to whole milliseconds. u is
// clamped to [0, 1].
func Backoff(n int, initial, max time.Duration, ratio, u float64) time.Duration {
	if n < 1 {
		n = 1
	}
	u = math.Min(math.Max(u, 0), 1)
	exp := math.Min(float64(initial)*math.Pow(2, float64(min(n-1, 1024))), float64(max))
	d := math.Min(exp*(1-ratio+2*ratio*u), float64(max))
	out := time.Duration(math.Round(d/float64(time.Millisecond))) * time.Millisecond
	return min(out, max)
}

// Decide runs the decision chain documented at the top of this file.
// A success (class ok) and a content refusal are not this chain's: for them
// it returns a zero verdict (empty Action), and the caller routes a refusal
// to the refusal tiers.
func Decide(in Input) Verdict {
	c := in.Classification
	if c.Class == events.ClassOK || c.Class == events.ClassContentRefusal {
		return Verdict{}
	}
	d := events.Decision{
		OutcomeID: c.OutcomeID,
		At:        events.At(in.Now),
		Agent:     c.Agent,
		Class:     c.Class,
		Rule:      c.Rule,
		Provider:  c.Provider,
		Model:     c.Model,
		Profile:   c.Profile,
	}
	sc := in.Scope

	// 1. Outage.
	if sc.Outage {
		if sc.FailoverProvider != "" {
			d.Action = events.ActionSwitchProvider
			d.Provider, d.Model, d.Profile = sc.FailoverProvider, "", ""
			d.Reason = fmt.Sprintf("provider %s is down (%s); failing over to %s", c.Provider, sc.Reason, sc.FailoverProvider)
		} else {
			d.Action = events.ActionWaitProvider
			d.Reason = fmt.Sprintf("provider %s is down (%s): hold until its health says recovered; no retry scheduled, no model switching", c.Provider, sc.Reason)
		}
		return Verdict{Decision: d}
	}
	// 2. One profile rate-limited while another works.
	if c.Class == events.ClassRateLimit && sc.SwitchProfile != "" {
		d.Action = events.ActionSwitchProfile
		d.Profile = sc.SwitchProfile
		d.Reason = fmt.Sprintf("profile %s is rate-limited while profile %s of %s works: switch profile", displayName(c.Profile), sc.SwitchProfile, c.Provider)
		return Verdict{Decision: d}
	}

	specific := retrySpecific(c, sc)
	terminal := func(why string) Verdict {
		if specific != nil {
			out := *specific
			out.OutcomeID, out.At, out.Agent, out.Class = d.OutcomeID, d.At, d.Agent, d.Class
			out.Reason = why + "; " + out.Reason
			return Verdict{Decision: out}
		}
		d.Action = events.ActionGiveUp
		d.Reason = why
		return Verdict{Decision: d}
	}

	// 3. No policy.
	p := in.Policy
	if p == nil {
		return terminal(fmt.Sprintf("no retry policy for provider %s", c.Provider))
	}
	budget := BudgetFor(c, p)
	prior := in.Prior
	if prior != nil && prior.Budget() != budget {
		prior = nil
	}
	// 4. Redelivery of the outcome that made the latest record.
	if prior != nil && prior.OutcomeID == c.OutcomeID {
		rec := *prior
		rec.EndedAt, rec.EndedBy = events.Time{}, ""
		d.Action = events.ActionRetry
		d.DelayMS, d.DueAt, d.Retry, d.RetryID = rec.DelayMS, rec.DueAt, rec.Retry, rec.RetryID
		d.At = rec.At
		d.Reason = rec.Reason
		return Verdict{Decision: d, Record: &rec, Replayed: true}
	}
	// 5. The provider said no.
	if h := c.Hints; h != nil && h.ShouldRetry != nil && !*h.ShouldRetry {
		return terminal("provider said x-should-retry: false")
	}
	// 6. Always mode: the specific recovery first.
	if p.Mode == ModeAlways && specific != nil {
		out := *specific
		out.OutcomeID, out.At, out.Agent, out.Class = d.OutcomeID, d.At, d.Agent, d.Class
		return Verdict{Decision: out}
	}
	// 7. Not retryable in normal mode.
	if p.Mode == ModeNormal && !p.IsRetryable(c.Class) {
		return terminal(fmt.Sprintf("%s is not retryable under the policy", c.Class))
	}
	// 8. Budget: the step's, or for an outcome without turn and step its
	// retry episode's (episode.go).
	done, seq := 0, 0
	episode := NewEpisode(c, prior, in.Now, p)
	if prior != nil {
		seq = prior.Number()
		if episode == "" {
			done = prior.Retry
		}
	}
	if done >= p.MaxRetries {
		return terminal(fmt.Sprintf("retry budget exhausted: %d of %d retries used", done, p.MaxRetries))
	}
	n := done + 1
	// 9. Delay.
	var (
		delay  time.Duration
		source string
		note   string
	)
	hint, hintSource := retryHint(c, sc, in.Now)
	switch {
	case hint > 0 && hint <= p.MaxDelay:
		delay, source = hint, hintSource
	case hint > 0 && p.Mode == ModeNormal:
		return terminal(fmt.Sprintf("provider asked to wait %s (%s), above max_delay %s", hint, hintSource, p.MaxDelay))
	case hint > 0:
		delay, source = Backoff(n, p.InitialDelay, p.MaxDelay, p.JitterRatio, in.U), DelayBackoff
		note = fmt.Sprintf("; provider asked %s (%s), above max_delay %s", hint, hintSource, p.MaxDelay)
	default:
		delay, source = Backoff(n, p.InitialDelay, p.MaxDelay, p.JitterRatio, in.U), DelayBackoff
	}
	// 10. Retry.
	due := in.Now.Add(delay)
	rec := &Record{
		RetryID:     budget.RetryID(seq + 1),
		OutcomeID:   c.OutcomeID,
		Agent:       c.Agent,
		Session:     c.Session,
		Turn:        c.Turn,
		Step:        c.Step,
		Provider:    c.Provider,
		Model:       c.Model,
		Profile:     c.Profile,
		PolicyKey:   budget.PolicyKey,
		Retry:       n,
		Class:       c.Class,
		DelayMS:     delay.Milliseconds(),
		At:          events.At(in.Now),
		DueAt:       events.At(due),
		DelaySource: source,
	}
	if seq+1 != n {
		rec.Seq = seq + 1
	}
	what := "backoff"
	if source != DelayBackoff {
		what = source
	}
	rec.Reason = fmt.Sprintf("%s: retry %d of %d after %s (%s%s)", c.Class, n, p.MaxRetries, delay, what, note)
	if episode != "" {
		rec.Reason += "; " + episode
	}
	if sc.ProviderRateLimited {
		rec.Reason += "; every profile of " + c.Provider + " is rate-limited: waiting for the cooldown, no profile switch"
	}
	d.Action = events.ActionRetry
	d.DelayMS, d.DueAt, d.Retry, d.RetryID, d.Reason = rec.DelayMS, rec.DueAt, n, rec.RetryID, rec.Reason
	return Verdict{Decision: d, Record: rec}
}

// retryHint is the provider's own delay for this failure: the outcome's
// hint, or, for a provider-wide rate limit, the cooldown still running from
// a hint another profile was given.
func retryHint(c events.Classification, sc scope.Verdict, now time.Time) (time.Duration, string) {
	if h := c.Hints; h != nil && h.AfterMS > 0 {
		src := h.Source
		if src == "" {
			src = "hint"
		}
		return time.Duration(h.AfterMS) * time.Millisecond, src
	}
	if sc.ProviderRateLimited && sc.CooldownUntil.After(now) {
		return sc.CooldownUntil.Sub(now), DelayCooldown
	}
	return 0, ""
}

// retrySpecific is the more specific recovery for a failure, nil when none
// applies. Only Action, Reason and the target fields are meaningful.
func retrySpecific(c events.Classification, sc scope.Verdict) *events.Decision {
	d := &events.Decision{Provider: c.Provider, Model: c.Model, Profile: c.Profile}
	switch {
	case c.Class == events.ClassContextOverflow:
		d.Action = events.ActionCompact
		d.Reason = "the request exceeds the context window: compact, then retry"
	case (c.Class == events.ClassAuth || c.Class == events.ClassQuotaExhausted) && sc.SwitchProfile != "":
		d.Action = events.ActionSwitchProfile
		d.Profile = sc.SwitchProfile
		d.Reason = fmt.Sprintf("profile %s fails with %s while profile %s works: switch profile", displayName(c.Profile), c.Class, sc.SwitchProfile)
	case scope.ModelFault(c.Class) && sc.SwitchModel != "":
		d.Action = events.ActionSwitchModel
		d.Model = sc.SwitchModel
		d.Reason = fmt.Sprintf("model %s fails with %s while model %s of %s works: switch model", displayName(c.Model), c.Class, sc.SwitchModel, c.Provider)
	default:
		return nil
	}
	return d
}

// displayName renders an empty profile or model name readably.
func displayName(s string) string {
	if s == "" {
		return "(unnamed)"
	}
	return s
}
