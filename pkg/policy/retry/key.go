package retry

// Policy keys and budget keys (seed 003 "policyKey：策略代际").
//
// The seed compresses every behavioural field of a retry policy into a key —
// [mode, maxRetries, sorted codes, initialDelayMs, maxDelayMs, jitterRatio]
// as canonical JSON — and counts retries per (turn, step, provider,
// policyKey). Change the policy and the key changes, so the count starts
// from zero and a new retry-id chain begins; the old chain's budget is not
// inherited.
//
// Here the canonical form is a JSON array with a version tag:
//
//	["retry/1", mode, max_retries, [sorted retryable classes],
//	 initial_delay_ns, max_delay_ns, jitter_ratio]
//
// Durations are exact nanoseconds, so even a sub-millisecond change is a new
// generation. The key is "pk" + the first 16 hex digits of its SHA-256, safe
// as a NATS subject token. The provider name is not part of the key (two
// providers with equal policies share a key; the budget key has the
// provider anyway).
//
// A budget on the bus also needs the identity of the log the seed counted
// in: there, one session's log; here, the agent and session. So a budget is
// (agent, session, turn, step, provider, policy key).

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
)

// policyKeyVersion tags the canonical form; bump it only if the form must
// change, which starts every budget afresh.
const policyKeyVersion = "retry/1"

// Canonical is the canonical JSON of every behavioural field of the resolved
// policy: the material the policy key is hashed from, kept readable for
// audit records.
func (r *Policy) Canonical() string {
	if r == nil {
		return `["` + policyKeyVersion + `","off"]`
	}
	classes := r.Retryable
	if classes == nil {
		classes = []string{}
	}
	b, _ := json.Marshal([]any{
		policyKeyVersion,
		r.Mode,
		r.MaxRetries,
		classes,
		int64(r.InitialDelay),
		int64(r.MaxDelay),
		json.Number(strconv.FormatFloat(r.JitterRatio, 'g', -1, 64)),
	})
	return string(b)
}

// Key is the policy key: a short hash of Canonical. Retry counts are kept
// per policy key, so any behavioural change restarts them.
func (r *Policy) Key() string {
	sum := sha256.Sum256([]byte(r.Canonical()))
	return "pk" + hex.EncodeToString(sum[:8])
}

// BudgetKey identifies one retry budget: the retries of one step of one
// agent's turn on one provider under one policy generation.
type BudgetKey struct {
	Agent     string `msgpack:"agent" json:"agent"`
	Session   string `msgpack:"session,omitempty" json:"session,omitempty"`
	Turn      int    `msgpack:"turn" json:"turn"`
	Step      int    `msgpack:"step" json:"step"`
	Provider  string `msgpack:"provider" json:"provider"`
	PolicyKey string `msgpack:"policy_key" json:"policy_key"`
}

// Token is the budget's identity as one NATS subject token (for the ledger
// subject, events.RetryLedgerSubject): "b" + 24 hex digits of the SHA-256
// of the fields, so names with dots or spaces can never make two budgets
// collide.
func (k BudgetKey) Token() string {
	b, _ := json.Marshal([]any{k.Agent, k.Session, k.Turn, k.Step, k.Provider, k.PolicyKey})
	sum := sha256.Sum256(b)
	return "b" + hex.EncodeToString(sum[:12])
}

// RetryID is the id of the n-th retry (1-based) of this budget. It is
// derived, not random, so every publish about the retry (ledger record,
// schedule, decision) can carry a Nats-Msg-Id that a redelivery repeats
// exactly.
func (k BudgetKey) RetryID(n int) string {
	return k.Token() + "-" + strconv.Itoa(n)
}
