package consumer

import "context"

// Handler handles one message. It returns nil to have its outputs published
// and the message acknowledged, Retry(after, reason) to see it again later,
// DeadLetter(reason) to dead-letter it, or any other error to have it
// retried with the runner's backoff (and dead-lettered on the last allowed
// delivery). The runner may call a Handler from several goroutines at once
// when Concurrency is above 1.
//
// ctx is not cancelled when Run's context is: in-flight handlers finish
// during a drain, until Config.DrainTimeout.
type Handler func(ctx context.Context, m *Msg, out *Outputs) error

// Middleware wraps a Handler to add behaviour around every message
// (Watermill style): recovery, heartbeats, timeouts, tracing.
type Middleware func(Handler) Handler

// chain wraps h so that mws[0] is outermost.
func chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}
