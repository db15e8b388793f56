package consumer

import (
	"context"
	"time"
)

// Timeout gives each handler call a context that ends after d, so a handler
// stuck on a slow dependency gives the message back (as an error, retried
// with backoff) instead of holding it forever. The handler must honour its
// context for this to work. d <= 0 disables it.
func Timeout(d time.Duration) Middleware {
	return func(next Handler) Handler {
		if d <= 0 {
			return next
		}
		return func(ctx context.Context, m *Msg, out *Outputs) error {
			ctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			return next(ctx, m, out)
		}
	}
}
