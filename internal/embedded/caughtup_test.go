package embedded_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
)

func TestCaughtUpFollowsTheAckFloorOnTheFilter(t *testing.T) {
	srv := embedded.StartTest(t)
	js, err := jetstream.New(embedded.ConnectTest(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"a.>", "b.>"}}); err != nil {
		t.Fatal(err)
	}
	c, err := js.CreateConsumer(ctx, "S", jetstream.ConsumerConfig{Durable: "d", FilterSubject: "a.>", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	check := func(want bool) {
		t.Helper()
		got, err := embedded.CaughtUp(ctx, js, "S", "d")
		if err != nil || got != want {
			t.Fatalf("CaughtUp = %v, %v; want %v", got, err, want)
		}
	}
	check(true) // empty stream
	for _, subj := range []string{"a.1", "b.1", "a.2"} {
		if _, err := js.Publish(ctx, subj, nil); err != nil {
			t.Fatal(err)
		}
	}
	check(false) // a.1 and a.2 not delivered
	msgs, err := c.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range msgs.Messages() {
		got = append(got, m)
	}
	if len(got) != 2 {
		t.Fatalf("fetched %d, want 2", len(got))
	}
	if err := got[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	check(false) // a.2 delivered, not acked
	if err := got[1].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	check(true) // b.1 is outside the filter
	if _, err := js.Publish(ctx, "b.2", nil); err != nil {
		t.Fatal(err)
	}
	check(true)
}
