package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/storecheck"
	"github.com/failbus/failbus/pkg/consumer"
)

// fillOutputs makes TEST_OUT refuse every write: n more messages stored,
// then no more, discarding new ones (what a full disk does to every
// stream, without one: the server still answers, with an error).
func (b *bench) fillOutputs(n int) {
	b.t.Helper()
	s, err := b.js.Stream(b.ctx, outStream)
	if err != nil {
		b.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs, cfg.Discard = int64(s.CachedInfo().State.Msgs)+int64(n), jetstream.DiscardNew
	if _, err := b.js.UpdateStream(b.ctx, cfg); err != nil {
		b.t.Fatal(err)
	}
	for i := range n {
		if _, err := b.js.Publish(b.ctx, "test.out.filler", fmt.Appendf(nil, "%d", i)); err != nil {
			b.t.Fatal(err)
		}
	}
}

// roomForOutputs lifts TEST_OUT's limit again.
func (b *bench) roomForOutputs() {
	b.t.Helper()
	s, err := b.js.Stream(b.ctx, outStream)
	if err != nil {
		b.t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = -1
	if _, err := b.js.UpdateStream(b.ctx, cfg); err != nil {
		b.t.Fatal(err)
	}
}

// TestHealthFailsWhileOutputsAreNotStoredAndRecovers: once the output
// stream refuses writes, /healthz fails (ErrCannotStore, naming the
// server's refusal), the input is redelivered rather than acknowledged,
// and once there is room again the same runner, not restarted, stores the
// outputs, acknowledges every input and is healthy again.
func TestHealthFailsWhileOutputsAreNotStoredAndRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := config()
	// Each refused delivery counts toward MaxDeliver, and the last one
	// dead-letters the input: 19 deliveries a second apart leave the test
	// many seconds, not config()'s few tenths of one, between the first
	// refusal and making room, however busy the machine.
	cfg.ConsumerConfig.MaxDeliver = 20
	cfg.Backoff = []time.Duration{100 * time.Millisecond, time.Second}
	r, _ := b.start(cfg, func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		out.Publish("test.out.x", note(m.ID()), "")
		return nil
	})
	b.publishIn("test.in.x", "in-0", []byte("x"))
	b.waitFor("the first output", func() bool { return b.count(outStream) == 1 })
	b.fillOutputs(2)
	for i := 1; i <= 3; i++ {
		b.publishIn("test.in.x", fmt.Sprintf("in-%d", i), []byte("x"))
	}
	b.waitFor("unhealthy", func() bool { return errors.Is(r.Healthy(), consumer.ErrCannotStore) })
	t.Logf("while the stream refuses: %v", r.Healthy())
	if b.settled(service) {
		t.Fatal("inputs acknowledged while their outputs were refused")
	}
	b.roomForOutputs()
	b.waitFor("healthy and settled", func() bool { return r.Healthy() == nil && b.settled(service) })
	if n := b.count(outStream); n != 2+4 {
		t.Errorf("%d messages in %s, want the 2 fillers and 4 outputs", n, outStream)
	}
	if n := b.count(dlqStream); n != 0 {
		t.Errorf("%d dead letters: inputs gave up while their outputs were refused", n)
	}
}

// TestHealthFailsWhileTheHandlersWritesAreNotStored: a handler that
// writes beside its outputs and returns the store's error wrapped makes
// the runner unhealthy too; a handler error that is not a store failure
// does not.
func TestHealthFailsWhileTheHandlersWritesAreNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := config()
	cfg.Backoff = []time.Duration{50 * time.Millisecond}
	r, _ := b.start(cfg, func(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
		if string(m.Data) == "bug" {
			return errors.New("a bug, not the store")
		}
		if _, err := b.js.Publish(ctx, "test.out.own", []byte(m.ID())); err != nil {
			return fmt.Errorf("store my record: %w", err)
		}
		return nil
	})
	b.publishIn("test.in.x", "bug-1", []byte("bug"))
	b.waitFor("the bug's redelivery", func() bool { return b.count(dlqStream) == 1 })
	if err := r.Healthy(); err != nil {
		t.Fatalf("a handler's bug made the runner unhealthy: %v", err)
	}
	b.fillOutputs(1)
	b.publishIn("test.in.x", "own-1", []byte("x"))
	b.waitFor("unhealthy", func() bool { return errors.Is(r.Healthy(), consumer.ErrCannotStore) })
	b.roomForOutputs()
	b.waitFor("healthy again", func() bool { return r.Healthy() == nil && b.settled(service) })
}

// TestDrainDoesNotWaitForWritesThatAreNotStored: once the outputs are
// refused, stopping does not wait for a handler stuck on a write nobody
// answers (as on a full disk): the run ends at once instead of after
// DrainTimeout (two minutes here), the inputs stay unacknowledged, and a
// later run stores their outputs once there is room.
func TestDrainDoesNotWaitForWritesThatAreNotStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A subject that takes requests and never answers them.
	if _, err := b.nc.Subscribe("test.blackhole", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	b.fillOutputs(1)
	cfg := config()
	cfg.DrainTimeout = 2 * time.Minute
	cfg.Concurrency = 2
	// Each refused delivery of in-1 counts toward MaxDeliver: 19 a second
	// apart, so it is not dead-lettered before the test makes room,
	// however busy the machine.
	cfg.ConsumerConfig.MaxDeliver = 20
	cfg.Backoff = []time.Duration{time.Second}
	stuck := make(chan struct{}, 1)
	h := func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		if m.ID() == "stuck" && m.Delivered == 1 {
			// A handler that tries its write again until it is stopped
			// (each try bounded by the client's API timeout).
			stuck <- struct{}{}
			for ctx.Err() == nil {
				_, _ = b.js.Publish(ctx, "test.blackhole", []byte(m.ID()))
			}
			return ctx.Err()
		}
		out.Publish("test.out.x", note(m.ID()), "")
		return nil
	}
	r, stop := b.start(cfg, h)
	b.publishIn("test.in.x", "in-1", []byte("x"))
	b.waitFor("unhealthy", func() bool { return errors.Is(r.Healthy(), consumer.ErrCannotStore) })
	b.publishIn("test.in.x", "stuck", []byte("x"))
	<-stuck
	done := make(chan error, 1)
	go func() { done <- stop() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the drain waited for a handler whose writes cannot be stored (DrainTimeout is two minutes)")
	}
	if b.settled(service) {
		t.Fatal("inputs acknowledged without their outputs")
	}
	b.roomForOutputs()
	b.start(cfg, h)
	b.waitFor("the outputs stored by a later run", func() bool { return b.settled(service) && b.count(outStream) == 3 })
}

// Errors that mean nothing was stored, and some that do not.
func TestStoreFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("publish: %w", context.DeadlineExceeded), true},
		{jetstream.ErrNoStreamResponse, true},
		{nats.ErrNoResponders, true},
		{jetstream.ErrAsyncPublishTimeout, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10077, Description: "maximum messages exceeded"}, true},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence, Description: "wrong last sequence"}, false},
		{errors.New("a bug"), false},
		{context.Canceled, false},
		{nil, false},
	} {
		if got := consumer.StoreFailure(tc.err); got != tc.want {
			t.Errorf("StoreFailure(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestAnIdleRunnerChecksItCanStore: a runner with nothing to do writes a
// store check every StoreCheckEvery (the latest kept), is healthy while
// they are stored, unhealthy once its check is refused, and healthy again
// once it is stored, without a message to handle meanwhile.
func TestAnIdleRunnerChecksItCanStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	check, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "TEST_CHECK", Subjects: []string{storecheck.Prefix + ".>"}, MaxMsgsPerSubject: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := config()
	cfg.StoreCheckEvery = 100 * time.Millisecond
	r, _ := b.start(cfg, func(context.Context, *consumer.Msg, *consumer.Outputs) error { return nil })
	checks := func() uint64 {
		info, err := check.Info(b.ctx)
		if err != nil {
			b.t.Fatal(err)
		}
		return info.State.LastSeq
	}
	b.waitFor("two store checks", func() bool { return checks() >= 2 })
	if err := r.Healthy(); err != nil {
		t.Fatalf("healthy while its checks are stored: %v", err)
	}
	m, err := check.GetLastMsgForSubject(b.ctx, storecheck.Subject(service))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Data) < 4096 {
		t.Errorf("a store check of %d bytes: less than a page", len(m.Data))
	}
	// Refused for its size, then with nowhere to go at all.
	was := check.CachedInfo().Config
	small := was
	small.MaxMsgSize = 1024
	if _, err := b.js.UpdateStream(b.ctx, small); err != nil {
		t.Fatal(err)
	}
	b.waitFor("unhealthy", func() bool { return errors.Is(r.Healthy(), consumer.ErrCannotStore) })
	t.Logf("while its check is refused: %v", r.Healthy())
	if _, err := b.js.UpdateStream(b.ctx, was); err != nil {
		t.Fatal(err)
	}
	b.waitFor("healthy again", func() bool { return r.Healthy() == nil })
	if err := b.js.DeleteStream(b.ctx, "TEST_CHECK"); err != nil {
		t.Fatal(err)
	}
	b.waitFor("unhealthy without the stream", func() bool { return errors.Is(r.Healthy(), consumer.ErrCannotStore) })
	t.Logf("without the stream: %v", r.Healthy())
	if _, err := b.js.CreateStream(b.ctx, was); err != nil {
		t.Fatal(err)
	}
	b.waitFor("healthy again", func() bool { return r.Healthy() == nil })
}

// TestADrainChecksTheStoreBeforeWaiting: a runner with store checks,
// stopped while a handler is stuck on a write nobody answers and before
// any write has failed, checks the store as the drain begins; finding it
// cannot store, it stops at once instead of after DrainTimeout (two
// minutes here), the input left for redelivery.
func TestADrainChecksTheStoreBeforeWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.nc.Subscribe("test.blackhole", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	// The store checks' stream takes nothing a page long: the check fails.
	if _, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "TEST_CHECK", Subjects: []string{storecheck.Prefix + ".>"}, MaxMsgSize: 1024}); err != nil {
		t.Fatal(err)
	}
	cfg := config()
	cfg.DrainTimeout = 2 * time.Minute
	cfg.StoreCheckEvery = time.Hour // none while it runs: only the drain's
	stuck := make(chan struct{}, 1)
	r, stop := b.start(cfg, func(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
		stuck <- struct{}{}
		for ctx.Err() == nil {
			_, _ = b.js.Publish(ctx, "test.blackhole", []byte(m.ID()))
		}
		return ctx.Err()
	})
	b.publishIn("test.in.x", "stuck", []byte("x"))
	<-stuck
	if err := r.Healthy(); err != nil {
		t.Fatalf("unhealthy before the drain: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- stop() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the drain waited for a handler stuck on a write although the store check failed (DrainTimeout is two minutes)")
	}
	if !errors.Is(r.Healthy(), consumer.ErrStopped) {
		t.Errorf("after the drain: %v", r.Healthy())
	}
	if b.settled(service) {
		t.Fatal("the stuck input was acknowledged")
	}
}
