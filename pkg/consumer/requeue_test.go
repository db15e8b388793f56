package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/requeue"
	"github.com/failbus/failbus/pkg/consumer"
)

// TestRunnerHandlesARequeuedDeadLetterOnlyInItsService: a dead letter
// requeued onto a subject two services read reaches the handler of the
// service that dead-lettered it, once; the other service, which processed
// the original, acknowledges the copy without handling it.
func TestRunnerHandlesARequeuedDeadLetterOnlyInItsService(t *testing.T) {
	t.Parallel()
	b := setup(t)
	handled := map[string]*atomic.Int32{service: {}, "other": {}}
	for name, n := range handled {
		cfg := config() // Consumer defaults to Service: one durable each
		cfg.Service = name
		b.start(cfg, func(_ context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
			n.Add(1)
			return nil
		})
	}
	b.publishIn("test.in.x", "plain", []byte("payload")) // both handle it
	m := &nats.Msg{Subject: "test.in.x", Data: []byte("payload"), Header: nats.Header{}}
	m.Header.Set(nats.MsgIdHdr, requeue.MsgID("FAILBUS_DLQ", 7))
	m.Header.Set(requeue.HeaderFrom, requeue.From("FAILBUS_DLQ", 7))
	m.Header.Set(requeue.HeaderFor, service)
	if _, err := b.js.PublishMsg(b.ctx, m); err != nil {
		t.Fatal(err)
	}
	b.waitFor("both consumers settled", func() bool { return b.settled(service) && b.settled("other") })
	if got := handled[service].Load(); got != 2 {
		t.Errorf("%s handled %d messages, want 2 (the plain one and the copy requeued for it)", service, got)
	}
	if got := handled["other"].Load(); got != 1 {
		t.Errorf("other handled %d messages, want 1 (the copy was requeued for %s)", got, service)
	}
	if got := b.count(dlqStream); got != 0 {
		t.Errorf("%d dead letters, want none", got)
	}
}
