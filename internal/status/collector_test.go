package status_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/status"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// The collector reads everything the page shows as the operator without
// any consumer right, and counts the dead letters of the window by reason
// reading only what is new at each refresh.
func TestCollectorReadsAsTheOperator(t *testing.T) {
	t.Parallel()
	bus, _, op := operatorBus(t, policy.Default())
	js, err := jetstream.New(op.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := status.NewCollector(js, nil)
	s, err := c.Collect(ctx)
	if err != nil || len(s.Problems) != 0 || s.DeadLetters.Total != 0 || len(s.Consumers) == 0 {
		t.Fatalf("first snapshot: %v, problems %v, %d dead letters, %d consumers", err, s.Problems, s.DeadLetters.Total, len(s.Consumers))
	}
	// Two outcomes that do not decode, one without its required fields.
	for _, data := range [][]byte{[]byte("not msgpack"), []byte("still not"), {0x80}} {
		if _, err := bus.JS.Publish(ctx, events.OutcomeSubject("acme", "a1"), data); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if s, err = c.Collect(ctx); err != nil {
			t.Fatal(err)
		}
		if s.DeadLetters.Total == 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s.DeadLetters.Total != 3 || len(s.Problems) != 0 {
		t.Fatalf("dead letters %+v, problems %v; want 3", s.DeadLetters, s.Problems)
	}
	sum := 0
	for _, r := range s.DeadLetters.ByReason {
		if r.Service != "classifier" || r.Reason == "" {
			t.Errorf("dead letter reason %+v, want the classifier's with a reason", r)
		}
		sum += r.Count
	}
	if sum != 3 || len(s.DeadLetters.ByReason) < 2 {
		t.Errorf("by reason %+v: want 3 over at least 2 reasons (decode, missing fields)", s.DeadLetters.ByReason)
	}
	// Read again: nothing new, the same count (not counted twice).
	if s, err = c.Collect(ctx); err != nil || s.DeadLetters.Total != 3 {
		t.Errorf("again: %d dead letters, %v; want 3", s.DeadLetters.Total, err)
	}
	if d := op.Denials(); len(d) != 0 {
		t.Errorf("the collector was refused: %v", d)
	}
	// The user really has no consumer rights: an ordered consumer, what
	// a reader would otherwise use, is refused.
	octx, ocancel := context.WithTimeout(ctx, time.Second)
	defer ocancel()
	oc, err := js.OrderedConsumer(octx, "FAILBUS_DLQ", jetstream.OrderedConsumerConfig{})
	if err == nil {
		_, err = oc.Fetch(1, jetstream.FetchMaxWait(time.Second))
	}
	if err == nil {
		t.Error("the page's user could open an ordered consumer: the test does not check what it says")
	}
}
