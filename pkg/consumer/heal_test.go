package consumer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
)

func TestPositionStartSeq(t *testing.T) {
	tests := []struct {
		name     string
		open     []uint64
		maxSeen  uint64
		ackFloor uint64
		want     uint64
	}{
		{"nothing seen, nothing acked: the start", nil, 0, 0, 1},
		{"all settled, snapshot current: after the newest", nil, 9, 9, 10},
		{"an open message holds the start back", []uint64{4, 7}, 9, 9, 4},
		{"a stale snapshot holds it back (other replicas)", nil, 9, 5, 6},
		{"nothing seen here, another replica acked up to 20", nil, 0, 20, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := position{maxSeen: tt.maxSeen, ackFloor: tt.ackFloor, open: map[uint64]struct{}{}}
			for _, s := range tt.open {
				p.open[s] = struct{}{}
			}
			if got := p.startSeq(); got != tt.want {
				t.Fatalf("startSeq = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestRunnerRecreatesADeletedDurable: an operator deletes the durable under
// a running service; the runner recreates it at the oldest unsettled
// message within seconds, handles what was published meanwhile, and does
// not hand the history to the handler again.
func TestRunnerRecreatesADeletedDurable(t *testing.T) {
	t.Parallel()
	srv := embedded.StartTest(t)
	nc := embedded.ConnectTest(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for name, subj := range map[string]string{"HEAL_IN": "heal.>", "HEAL_DLQ": "failbus.dlq.>"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	handled := map[uint64]int{}
	r, err := New(js, Config{
		Service: "healer", Stream: "HEAL_IN",
		ConsumerConfig: &jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: 4},
		FetchWait:      100 * time.Millisecond,
	}, func(_ context.Context, m *Msg, _ *Outputs) error {
		mu.Lock()
		handled[m.Seq]++
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { stop(); <-done }()

	publish := func(n int) {
		for range n {
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: "heal.x", Data: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond) // poll interval, bounded by the deadline
		}
	}
	count := func(lo, hi uint64) (n int) {
		mu.Lock()
		defer mu.Unlock()
		for s := lo; s <= hi; s++ {
			n += handled[s]
		}
		return n
	}
	publish(5)
	waitFor("5 handled", func() bool { return count(1, 5) == 5 })
	// The runner snapshots its ack floor while idle; wait for it to see
	// all five acknowledged before pulling the rug.
	waitFor("ack floor snapshot", func() bool {
		r.pos.mu.Lock()
		defer r.pos.mu.Unlock()
		return r.pos.ackFloor == 5
	})

	if err := js.DeleteConsumer(ctx, "HEAL_IN", "healer"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	publish(5)
	waitFor("5 more handled", func() bool { return count(6, 10) == 5 })
	t.Logf("durable back and the 5 new messages handled %v after the deletion", time.Since(deleted).Round(time.Millisecond))

	if got := count(1, 5); got != 5 {
		t.Fatalf("the first 5 messages were handled %d times in all, want 5 (not again)", got)
	}
	cons, err := js.Consumer(ctx, "HEAL_IN", "healer")
	if err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	if cfg.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || cfg.OptStartSeq != 6 || cfg.Metadata[metaRecreated] == "" {
		t.Fatalf("recreated consumer: deliver %v from %d, metadata %v; want from 6, marked", cfg.DeliverPolicy, cfg.OptStartSeq, cfg.Metadata)
	}
	if got := recreatedCount(t, r); got != 1 {
		t.Fatalf("failbus_consumer_recreated_total = %v, want 1", got)
	}
	waitFor("healthy", func() bool { return r.Healthy() == nil })
}

func recreatedCount(t *testing.T, r *Runner) float64 {
	t.Helper()
	mfs, err := r.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "failbus_consumer_recreated_total" {
			for _, m := range mf.GetMetric() {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
