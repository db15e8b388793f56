package consumer

import (
	"context"
	"time"
)

// Heartbeat marks the message in progress every interval while the handler
// runs, so a handler that takes longer than the consumer's AckWait keeps its
// message instead of having the server redeliver it to another replica.
// Choose an interval well below AckWait (a third of it is usual). A failed
// heartbeat is ignored: at worst the message is redelivered, and its
// outputs are deduplicated. Without Heartbeat a handler must finish within
// AckWait.
func Heartbeat(interval time.Duration) Middleware {
	return func(next Handler) Handler {
		if interval <= 0 {
			return next
		}
		return func(ctx context.Context, m *Msg, out *Outputs) error {
			done := make(chan struct{})
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				t := time.NewTicker(interval)
				defer t.Stop()
				for {
					select {
					case <-done:
						return
					case <-t.C:
						_ = m.InProgress()
					}
				}
			}()
			defer func() {
				close(done)
				<-stopped
			}()
			return next(ctx, m, out)
		}
	}
}
