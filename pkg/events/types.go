// Package events holds failbus's wire types, their msgpack codec, the schema
// header and the subject names. It is the public interface agents in any
// language speak (see CONTRACT.md); it has no NATS connection code and no
// policy. JSON (offline commands) and msgpack (the bus) use the same
// snake_case keys.
package events

// Origin says what kind of work made an LLM call, so recovery can find the
// crons, subagents and tasks an outage interrupted.
type Origin struct {
	Kind   string `msgpack:"kind,omitempty" json:"kind,omitempty"` // chat | cron | subagent | task
	Name   string `msgpack:"name,omitempty" json:"name,omitempty"`
	Parent string `msgpack:"parent,omitempty" json:"parent,omitempty"`
}

// Outcome is the raw result of one LLM call, success or failure, exactly as the
// agent saw it. Everything downstream is derived from it, so it keeps the raw
// evidence (status, body, headers, transport error) rather than an
// interpretation. Unknown keys are ignored on decode; the original bytes stay
// in the outcome stream.
type Outcome struct {
	ID             string            `msgpack:"id" json:"id"`
	At             Time              `msgpack:"at" json:"at"`
	Agent          string            `msgpack:"agent" json:"agent"`
	Session        string            `msgpack:"session,omitempty" json:"session,omitempty"`
	Segment        int               `msgpack:"segment,omitempty" json:"segment,omitempty"`
	Turn           int               `msgpack:"turn,omitempty" json:"turn,omitempty"`
	Step           int               `msgpack:"step,omitempty" json:"step,omitempty"`
	Provider       string            `msgpack:"provider" json:"provider"`
	Model          string            `msgpack:"model,omitempty" json:"model,omitempty"`
	Profile        string            `msgpack:"profile,omitempty" json:"profile,omitempty"`
	OK             bool              `msgpack:"ok" json:"ok"`
	Status         int               `msgpack:"status,omitempty" json:"status,omitempty"`
	Body           string            `msgpack:"body,omitempty" json:"body,omitempty"`
	Headers        map[string]string `msgpack:"headers,omitempty" json:"headers,omitempty"`
	TransportError string            `msgpack:"transport_error,omitempty" json:"transport_error,omitempty"`
	UpstreamCode   string            `msgpack:"upstream_code,omitempty" json:"upstream_code,omitempty"`
	StopReason     string            `msgpack:"stop_reason,omitempty" json:"stop_reason,omitempty"`
	RefusalScope   string            `msgpack:"refusal_scope,omitempty" json:"refusal_scope,omitempty"`
	RequestTokens  int               `msgpack:"request_tokens,omitempty" json:"request_tokens,omitempty"`
	ContextWindow  int               `msgpack:"context_window,omitempty" json:"context_window,omitempty"`
	// MaxOutputTokens is the output budget the request asked for
	// (max_tokens); 0 = unknown. Providers that count it against the window
	// (vLLM, DeepSeek, TGI, Anthropic) reject input + output > window, so
	// the classifier needs it to confirm such an overflow: the input alone
	// may be far below the window.
	MaxOutputTokens int     `msgpack:"max_output_tokens,omitempty" json:"max_output_tokens,omitempty"`
	Origin          *Origin `msgpack:"origin,omitempty" json:"origin,omitempty"`
}

// SegmentKey is the context-segment key `<session>#<segment>` that refusal
// state is kept under: inside one segment history only grows.
func (o *Outcome) SegmentKey() string { return SegmentKey(o.Session, o.Segment) }

// Classification is what the classifier concluded about one outcome, with the
// rule that decided and the evidence it saw, so a wrong decision can be traced
// back to the rule instead of guessed at.
type Classification struct {
	OutcomeID string `msgpack:"outcome_id" json:"outcome_id"`
	At        Time   `msgpack:"at,omitempty" json:"at,omitzero"`
	Agent     string `msgpack:"agent,omitempty" json:"agent,omitempty"`
	Provider  string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	Model     string `msgpack:"model,omitempty" json:"model,omitempty"`
	Profile   string `msgpack:"profile,omitempty" json:"profile,omitempty"`
	Class     string `msgpack:"class" json:"class"`
	Retryable bool   `msgpack:"retryable" json:"retryable"`
	Scope     string `msgpack:"scope,omitempty" json:"scope,omitempty"`
	Rule      string `msgpack:"rule" json:"rule"`
	// Evidence is a list of short, redacted strings: what the rule saw.
	Evidence []string `msgpack:"evidence,omitempty" json:"evidence,omitempty"`
	// Overruled is the class a heuristic or upstream_code claimed and harder
	// evidence rejected; empty otherwise.
	Overruled string `msgpack:"overruled,omitempty" json:"overruled,omitempty"`
	// Hints carry what the provider said about when to retry.
	Hints *RetryHints `msgpack:"hints,omitempty" json:"hints,omitempty"`
	// Outcome context the scheduler and refusal tiers need without a second
	// lookup.
	Session      string `msgpack:"session,omitempty" json:"session,omitempty"`
	Segment      int    `msgpack:"segment,omitempty" json:"segment,omitempty"`
	Turn         int    `msgpack:"turn,omitempty" json:"turn,omitempty"`
	Step         int    `msgpack:"step,omitempty" json:"step,omitempty"`
	RefusalScope string `msgpack:"refusal_scope,omitempty" json:"refusal_scope,omitempty"`
}

// RetryHints are the provider's own statements about retrying, found in
// headers or the body. The scheduler takes them exactly when within policy.
type RetryHints struct {
	// ShouldRetry is the x-should-retry header: nil when absent.
	ShouldRetry *bool `msgpack:"should_retry,omitempty" json:"should_retry,omitempty"`
	// AfterMS is the delay the provider asked for, in milliseconds; 0 = none.
	AfterMS int64 `msgpack:"after_ms,omitempty" json:"after_ms,omitempty"`
	// Source names where AfterMS came from (retry-after-ms, retry-after, body).
	Source string `msgpack:"source,omitempty" json:"source,omitempty"`
}

// Decision is what an agent is told to do about one outcome.
type Decision struct {
	OutcomeID string `msgpack:"outcome_id" json:"outcome_id"`
	At        Time   `msgpack:"at,omitempty" json:"at,omitzero"`
	Agent     string `msgpack:"agent" json:"agent"`
	Action    string `msgpack:"action" json:"action"`
	Reason    string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	Class     string `msgpack:"class,omitempty" json:"class,omitempty"`
	// Rule is the classification rule that decided Class: what an agent
	// hands its caller with a decision it cannot carry out itself.
	Rule     string `msgpack:"rule,omitempty" json:"rule,omitempty"`
	DelayMS  int64  `msgpack:"delay_ms,omitempty" json:"delay_ms,omitempty"`
	DueAt    Time   `msgpack:"due_at,omitempty" json:"due_at,omitzero"`
	Retry    int    `msgpack:"retry,omitempty" json:"retry,omitempty"`
	RetryID  string `msgpack:"retry_id,omitempty" json:"retry_id,omitempty"`
	Provider string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	Model    string `msgpack:"model,omitempty" json:"model,omitempty"`
	Profile  string `msgpack:"profile,omitempty" json:"profile,omitempty"`
}

// Actions of a Decision (CONTRACT.md). Public interface: never rename.
const (
	ActionRetry          = "retry"
	ActionSwitchProfile  = "switch_profile"
	ActionSwitchModel    = "switch_model"
	ActionSwitchProvider = "switch_provider"
	ActionRerender       = "rerender"
	ActionSkipProvider   = "skip_provider"
	ActionWaitProvider   = "wait_provider"
	ActionCompact        = "compact"
	ActionGiveUp         = "give_up"
)

// RetryDue is the durable delayed message that tells an agent a scheduled
// retry has come due. JetStream's scheduler writes it, so it survives crashes
// of every failbus process.
type RetryDue struct {
	RetryID   string `msgpack:"retry_id" json:"retry_id"`
	OutcomeID string `msgpack:"outcome_id" json:"outcome_id"`
	Agent     string `msgpack:"agent" json:"agent"`
	Retry     int    `msgpack:"retry" json:"retry"`
	DueAt     Time   `msgpack:"due_at" json:"due_at"`
}

// Provider health states.
const (
	HealthHealthy   = "healthy"
	HealthDegraded  = "degraded"
	HealthOutage    = "outage"
	HealthRecovered = "recovered"
)

// Health is a provider state change.
type Health struct {
	At       Time   `msgpack:"at" json:"at"`
	Provider string `msgpack:"provider" json:"provider"`
	State    string `msgpack:"state" json:"state"`
	Reason   string `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// Notification severities.
const (
	SeverityInfo     = "info"
	SeverityNormal   = "normal"
	SeverityCritical = "critical"
)

// Notification is a request to tell a human something. The dedupe key names
// the state being reported, so one state is reported once however many
// services or replicas ask.
type Notification struct {
	DedupeKey string            `msgpack:"dedupe_key" json:"dedupe_key"`
	Severity  string            `msgpack:"severity" json:"severity"`
	Title     string            `msgpack:"title,omitempty" json:"title,omitempty"`
	Text      string            `msgpack:"text,omitempty" json:"text,omitempty"`
	Labels    map[string]string `msgpack:"labels,omitempty" json:"labels,omitempty"`
	At        Time              `msgpack:"at,omitempty" json:"at,omitzero"`
}

// Boundary marks a new context segment (compaction, fresh start, model, mode,
// tool-surface or prompt change): the only events that can take refused bytes
// out of a request.
type Boundary struct {
	At      Time   `msgpack:"at" json:"at"`
	Agent   string `msgpack:"agent" json:"agent"`
	Session string `msgpack:"session" json:"session"`
	Segment int    `msgpack:"segment" json:"segment"`
	Reason  string `msgpack:"reason,omitempty" json:"reason,omitempty"`
}

// DeadLetter is input a service could not use, kept whole (subject, headers,
// bytes) with the reason, so nothing is lost and an operator can replay it.
// When the whole input would not fit in one message (the dead letter adds
// its envelope to input that may already be at the server's max_payload),
// Data is a bounded prefix and Truncated is set: the input itself still
// lies in Stream at Seq (for that stream's max age), and DataLen and
// DataSHA256 identify it.
type DeadLetter struct {
	At      Time                `msgpack:"at" json:"at"`
	Service string              `msgpack:"service" json:"service"`
	Reason  string              `msgpack:"reason" json:"reason"`
	Subject string              `msgpack:"subject" json:"subject"`
	Stream  string              `msgpack:"stream,omitempty" json:"stream,omitempty"`
	Seq     uint64              `msgpack:"seq,omitempty" json:"seq,omitempty"`
	Headers map[string][]string `msgpack:"headers,omitempty" json:"headers,omitempty"`
	Data    []byte              `msgpack:"data" json:"data"`
	// DataLen is the length of the whole input in bytes.
	DataLen int `msgpack:"data_len,omitempty" json:"data_len,omitempty"`
	// DataSHA256 is the SHA-256 of the whole input, hex.
	DataSHA256 string `msgpack:"data_sha256,omitempty" json:"data_sha256,omitempty"`
	// Truncated is true when Data is only a prefix of the input, or Headers
	// only some of its headers.
	Truncated bool `msgpack:"truncated,omitempty" json:"truncated,omitempty"`
}
