package notify_test

import (
	"context"
	"fmt"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/notify"
)

// pagerSink is a sink of your own: a Name, and a Send that delivers once
// and answers with a *notify.SinkError when the receiver refuses. Declare
// Idempotent only if the receiver drops repeats of IdempotencyKey. Run the
// conformance suite against it with sinktest.Run and a Harness.
type pagerSink struct{ name string }

func (s pagerSink) Name() string { return s.name }

func (s pagerSink) Send(ctx context.Context, d notify.Delivery) error {
	if err := ctx.Err(); err != nil {
		return &notify.SinkError{Sink: s.name, Answer: err.Error()}
	}
	n := d.Notification
	if n.Severity != events.SeverityCritical {
		return &notify.SinkError{Sink: s.name, Status: 400, Answer: "pager takes critical only", Permanent: true}
	}
	fmt.Printf("PAGE %s: %s (key %s, attempt %d)\n", n.DedupeKey, n.Title, d.IdempotencyKey, d.Attempt)
	return nil
}

// Adding a sink: implement notify.Sink; the notifier hands it one
// Delivery per attempt, with the same IdempotencyKey on every attempt of
// one notification.
func Example_addingASink() {
	var sink notify.Sink = pagerSink{name: "pager"}
	n := events.Notification{DedupeKey: "provider-refusal:s#3:3:openai", Severity: events.SeverityCritical,
		Title: "openai frozen for segment s#3"}
	_ = sink.Send(context.Background(), notify.Delivery{Notification: n, IdempotencyKey: "gen-1", Attempt: 1})
	// Output: PAGE provider-refusal:s#3:3:openai: openai frozen for segment s#3 (key gen-1, attempt 1)
}
