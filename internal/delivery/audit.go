package delivery

import (
	"github.com/failbus/failbus/pkg/events"
)

// Audit kinds: the last token of the audit subject
// failbus.audit.<service>.<kind>. Every decision the notifier takes about a
// request is one of them, so a missing or doubled notification can be
// explained after the fact from the FAILBUS_AUDIT stream.
const (
	// AuditSent: a sink accepted the notification.
	AuditSent = "sent"
	// AuditDeduped: the dedupe key was already sent within its lifetime,
	// or another request with the same key is being delivered.
	AuditDeduped = "deduped"
	// AuditHeld: the daily budget of non-critical notifications is used
	// up; the request stays on the stream and is not sent.
	AuditHeld = "held_by_budget"
	// AuditFailed: a sink refused or did not answer. Final is true when
	// the request went to the dead-letter subject.
	AuditFailed = "failed"
	// AuditUnrouted: no configured sink takes this severity and these
	// labels, so there was nothing to deliver.
	AuditUnrouted = "unrouted"
)

// SchemaAudit is the Failbus-Schema name of an Audit.
const SchemaAudit = "notify_audit"

// Audit is one notifier decision about one request. It carries identities,
// the redacted title and the sink's answer, never the text.
type Audit struct {
	At   events.Time `msgpack:"at" json:"at"`
	Kind string      `msgpack:"kind" json:"kind"`
	// DedupeKey, Severity and Title identify the notification.
	DedupeKey string `msgpack:"dedupe_key" json:"dedupe_key"`
	Severity  string `msgpack:"severity,omitempty" json:"severity,omitempty"`
	Title     string `msgpack:"title,omitempty" json:"title,omitempty"`
	// Sink is set for sent and failed.
	Sink string `msgpack:"sink,omitempty" json:"sink,omitempty"`
	// Attempt is the sink's attempt number for sent and failed.
	Attempt int `msgpack:"attempt,omitempty" json:"attempt,omitempty"`
	// Answer is the sink's answer for failed (redacted, bounded).
	Answer string `msgpack:"answer,omitempty" json:"answer,omitempty"`
	// Reason says why, in words.
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// Final marks a failure that dead-lettered the request.
	Final bool `msgpack:"final,omitempty" json:"final,omitempty"`
	// Request is the identity of the request message (its Nats-Msg-Id, or
	// stream:sequence).
	Request string `msgpack:"request" json:"request"`
	// Replica is the notifier replica that decided.
	Replica string `msgpack:"replica,omitempty" json:"replica,omitempty"`
	// Generation is the idempotency key of this lifetime of the dedupe
	// key.
	Generation string `msgpack:"generation,omitempty" json:"generation,omitempty"`
	// Budget is the day's budget for held_by_budget and budgeted sends.
	Budget *AuditBudget `msgpack:"budget,omitempty" json:"budget,omitempty"`
}

// AuditBudget is the state of one UTC day's budget.
type AuditBudget struct {
	Day   string `msgpack:"day" json:"day"`
	Limit int    `msgpack:"limit" json:"limit"`
	Sent  int    `msgpack:"sent" json:"sent"`
	Held  int    `msgpack:"held" json:"held"`
}

// SchemaName implements events.Message.
func (*Audit) SchemaName() string { return SchemaAudit }

// Validate implements events.Message: an audit record names its kind, its
// dedupe key and its request.
func (a *Audit) Validate() error {
	for _, f := range []struct{ name, v string }{{"kind", a.Kind}, {"dedupe_key", a.DedupeKey}, {"request", a.Request}} {
		if f.v == "" {
			return &events.FieldError{Field: f.name, Problem: "required"}
		}
	}
	return nil
}
