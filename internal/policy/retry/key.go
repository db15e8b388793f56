package retry

// Policy keys and budget keys (a policy key is a generation of the
// policy: change the policy and budgets count again).
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
// A budget on the bus also needs the identity of the log a single agent
// would count in: there, one session's log; here, the agent and session. So a budget is
// (agent, session, turn, step, provider, policy key).

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"strconv"
	"sync"
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
// per policy key, so any behavioural change restarts them. Every decision
// asks for it (on a Policy just resolved), so keys are remembered per
// behavioural value (memoKey): the canonical JSON and its hash are
// computed once per policy generation, not once per outcome.
func (r *Policy) Key() string {
	if r == nil {
		return policyKey(r)
	}
	var buf [256]byte
	m := r.appendMemoKey(buf[:0])
	policyKeysMu.RLock()
	k, ok := policyKeys[string(m)] // no allocation for the look-up
	policyKeysMu.RUnlock()
	if ok {
		return k
	}
	k = policyKey(r)
	policyKeysMu.Lock()
	if len(policyKeys) < maxPolicyKeys {
		policyKeys[string(m)] = k
	}
	policyKeysMu.Unlock()
	return k
}

func policyKey(r *Policy) string {
	sum := sha256.Sum256([]byte(r.Canonical()))
	return "pk" + hex.EncodeToString(sum[:8])
}

// appendMemoKey appends every field Canonical reads, each number in 8
// bytes and each string prefixed with its length (unambiguous whatever the
// names hold): the key of the policy-key memo. Nil and empty classes are
// the same, as in Canonical.
func (r *Policy) appendMemoKey(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(r.Mode)))
	b = append(b, r.Mode...)
	b = binary.LittleEndian.AppendUint64(b, uint64(r.MaxRetries))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.InitialDelay))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.MaxDelay))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(r.JitterRatio))
	for _, c := range r.Retryable {
		b = binary.AppendUvarint(b, uint64(len(c)))
		b = append(b, c...)
	}
	return b
}

// policyKeys maps appendMemoKey → Key. A process sees a handful of policy
// generations; maxPolicyKeys bounds the memo anyway (beyond it keys are
// computed each time).
var (
	policyKeysMu sync.RWMutex
	policyKeys   = map[string]string{}
)

const maxPolicyKeys = 4096

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
//
// The hashed bytes are exactly json.Marshal([]any{Agent, Session, Turn,
// Step, Provider, PolicyKey}) (tokens are persisted: they must never
// change); they are written by hand here because every decision computes
// one (TestBudgetTokenIsPinned, TestBudgetTokenBytesAreJSON).
func (k BudgetKey) Token() string {
	var buf [256]byte
	sum := sha256.Sum256(k.appendCanonical(buf[:0]))
	var out [1 + 24]byte
	out[0] = 'b'
	hex.Encode(out[1:], sum[:12])
	return string(out[:])
}

// appendCanonical appends the JSON array Token hashes.
func (k BudgetKey) appendCanonical(b []byte) []byte {
	b = append(b, '[')
	b = appendJSONString(b, k.Agent)
	b = append(b, ',')
	b = appendJSONString(b, k.Session)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(k.Turn), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(k.Step), 10)
	b = append(b, ',')
	b = appendJSONString(b, k.Provider)
	b = append(b, ',')
	b = appendJSONString(b, k.PolicyKey)
	return append(b, ']')
}

// appendJSONString appends s as json.Marshal writes it: verbatim in quotes
// when it is printable ASCII that json.Marshal does not escape (the usual
// case), otherwise what json.Marshal returns.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// RetryID is the id of the n-th retry (1-based) of this budget. It is
// derived, not random, so every publish about the retry (ledger record,
// schedule, decision) can carry a Nats-Msg-Id that a redelivery repeats
// exactly.
func (k BudgetKey) RetryID(n int) string {
	return k.Token() + "-" + strconv.Itoa(n)
}
