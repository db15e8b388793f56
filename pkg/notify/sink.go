package notify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/redact"
)

// Sink delivers notifications to one receiver (a webhook, Slack, ntfy, an
// SMTP server, PagerDuty, the log). The notifier decides whether and when to
// call it; a Sink only sends.
//
// Contract:
//   - Send delivers d once and returns nil only when the receiver accepted it.
//   - Any other result is an error; a *SinkError says whether the answer is
//     permanent (retrying the same bytes cannot help) and carries the
//     receiver's answer, which ends up in audit records and dead letters.
//   - Send honours ctx: when it ends, Send returns promptly with an error.
//     Whether the receiver saw the request is then unknown: the notifier
//     retries with the same Delivery.IdempotencyKey, which an Idempotent
//     receiver absorbs and any other may show twice.
//   - Send is safe for concurrent use by several goroutines.
//   - Send does not redact: the notifier hands it an already redacted
//     notification.
type Sink interface {
	// Name is the configured sink name. Ledger entries, audit records and
	// metrics are keyed by it, so it must be stable across restarts.
	Name() string
	// Send delivers one notification to the receiver.
	Send(ctx context.Context, d Delivery) error
}

// Idempotent is implemented by sinks whose receiver deduplicates on
// Delivery.IdempotencyKey (or on a key derived from it or from the dedupe
// key, like PagerDuty's dedup_key). The notifier re-sends an unconfirmed
// delivery to such a sink without risking a second notification; for other
// sinks a crash between sending and recording the send can duplicate one
// notification (see the package documentation).
type Idempotent interface {
	// Idempotent reports whether a repeated Send with the same
	// IdempotencyKey reaches the human at most once.
	Idempotent() bool
}

// Delivery is one notification on its way to one sink.
type Delivery struct {
	// Notification is the request, already redacted. At is set (the
	// request's time, or when the notifier first handled it).
	Notification events.Notification
	// IdempotencyKey is the same for every attempt to deliver this
	// notification (one dedupe key within one lifetime), and different for
	// the next lifetime of the same dedupe key. Receivers that deduplicate
	// on it see each notification once.
	IdempotencyKey string
	// Attempt counts attempts to deliver this notification to this sink,
	// starting at 1.
	Attempt int
}

// maxAnswer bounds how much of a receiver's answer a SinkError keeps: enough
// to say what went wrong, small enough for an audit record.
const maxAnswer = 512

// SinkError is a failed Send: what the receiver answered, and whether
// retrying can help. The notifier's audit records and dead letters carry Answer.
type SinkError struct {
	// Sink is the sink's name.
	Sink string
	// Status is the receiver's status code (HTTP status, SMTP reply code);
	// 0 when no answer arrived (connection refused, timeout).
	Status int
	// Answer is the receiver's answer: the response body or SMTP reply
	// text, or the transport error; redacted and at most maxAnswer bytes.
	Answer string
	// Permanent is true when the receiver rejected the request itself (bad
	// URL, invalid payload, unknown recipient, revoked key): the cause
	// changes with a configuration change, not with time, so the request
	// is dead-lettered at once instead of retried (a cause that changes
	// with an event is not waited out on the clock).
	Permanent bool
	// RetryAfter is the receiver's own hint (Retry-After); 0 when none.
	RetryAfter time.Duration
}

// Error implements error.
func (e *SinkError) Error() string {
	kind := "temporary"
	if e.Permanent {
		kind = "permanent"
	}
	if e.Status != 0 {
		return fmt.Sprintf("sink %s: %s failure, status %d: %s", e.Sink, kind, e.Status, e.Answer)
	}
	return fmt.Sprintf("sink %s: %s failure: %s", e.Sink, kind, e.Answer)
}

// AsSinkError returns err as a *SinkError, wrapping an error that is not one
// as a temporary failure of sink with the error text as the answer.
func AsSinkError(sink string, err error) *SinkError {
	if err == nil {
		return nil
	}
	var se *SinkError
	if errors.As(err, &se) {
		return se
	}
	return &SinkError{Sink: sink, Answer: clip(redact.String(err.Error()))}
}

// clip bounds s to maxAnswer bytes without splitting a UTF-8 sequence.
func clip(s string) string {
	if len(s) <= maxAnswer {
		return s
	}
	return truncateUTF8(s, maxAnswer) + "…"
}
