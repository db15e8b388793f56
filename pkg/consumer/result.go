package consumer

import (
	"fmt"
	"time"
)

// retryError is what Retry returns: the handler asks for the message again
// after a delay. Middleware can recognise it with errors.As.
type retryError struct {
	// After is the redelivery delay; 0 redelivers at once.
	After time.Duration
	// Reason says why, for logs and, if the delivery limit is reached, for
	// the dead letter.
	Reason string
}

// Error implements error.
func (e *retryError) Error() string { return fmt.Sprintf("retry after %v: %s", e.After, e.Reason) }

// Retry tells the runner to redeliver the message after the given delay
// (negative counts as 0), like River's JobSnooze: for a cause that clears
// with time (a dependency not ready yet). It is not logged or counted as a
// failure, but each redelivery still counts toward MaxDeliver: on the last
// allowed delivery the message is dead-lettered with reason instead.
// Outputs published by the handler before returning Retry are dropped.
func Retry(after time.Duration, reason string) error {
	return &retryError{After: max(after, 0), Reason: reason}
}

// deadLetterError is what DeadLetter returns: the message cannot be used,
// and no retry will change that.
type deadLetterError struct {
	// Reason goes into the dead letter; it should say what to fix.
	Reason string
	// Stack is the goroutine stack when the dead letter comes from a panic
	// (see Recover); it is logged, not stored in the dead letter.
	Stack string
}

// Error implements error.
func (e *deadLetterError) Error() string { return "dead letter: " + e.Reason }

// DeadLetter tells the runner to send the message to failbus.dlq.<service>
// now, with reason, and acknowledge it. Use it for input no retry can fix:
// it does not decode, a required field is missing. Outputs published by the
// handler before returning DeadLetter are dropped.
func DeadLetter(reason string) error { return &deadLetterError{Reason: reason} }

// DeadLetterf is DeadLetter with a formatted reason.
func DeadLetterf(format string, args ...any) error {
	return &deadLetterError{Reason: fmt.Sprintf(format, args...)}
}
