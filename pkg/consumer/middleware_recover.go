package consumer

import (
	"context"
	"fmt"
	"runtime/debug"
)

// Recover turns a panic in the handler into a dead letter whose reason is
// the panic value, so one poisonous message cannot crash-loop a service: the
// next message is handled as usual. The runner always applies it outermost;
// it is exported for handlers run outside a Runner (tests, failbus
// simulate).
func Recover() Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, m *Msg, out *Outputs) (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = &deadLetterError{Reason: fmt.Sprintf("panic: %v", p), Stack: string(debug.Stack())}
				}
			}()
			return next(ctx, m, out)
		}
	}
}
