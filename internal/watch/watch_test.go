package watch_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
)

func publish(t *testing.T, b *bustest.Bus, subject string, n int, from int) {
	t.Helper()
	for i := range n {
		if _, err := b.JS.Publish(b.Ctx, subject, fmt.Appendf(nil, "m%d", from+i)); err != nil {
			t.Fatal(err)
		}
	}
}

// ephemerals counts the non-durable consumers left on a stream.
func ephemerals(t *testing.T, b *bustest.Bus, stream string) int {
	t.Helper()
	s, err := b.JS.Stream(b.Ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for c := range s.ListConsumers(b.Ctx).Info() {
		if c.Config.Durable == "" {
			n++
		}
	}
	return n
}

func TestRead(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	publish(t, b, "failbus.dlq.a", 3, 0)
	publish(t, b, "failbus.dlq.b", 2, 3)
	publish(t, b, "failbus.dlq.a", 1, 5)
	tests := []struct {
		name string
		cfg  watch.Config
		want []string
	}{
		{"read everything stored, in order", watch.Config{}, []string{"m0", "m1", "m2", "m3", "m4", "m5"}},
		{"read one filter", watch.Config{Filters: []string{"failbus.dlq.b"}}, []string{"m3", "m4"}},
		{"read from a sequence", watch.Config{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, StartSeq: 5}, []string{"m4", "m5"}},
		{"read the latest of each subject", watch.Config{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy}, []string{"m4", "m5"}},
		{"read nothing new without following", watch.Config{DeliverPolicy: jetstream.DeliverNewPolicy}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.Stream = topology.StreamDLQ
			var got []string
			err := watch.Read(b.Ctx, b.JS, cfg, func(m jetstream.Msg) error {
				got = append(got, string(m.Data()))
				return nil
			})
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func TestReadStopsAndCleansUp(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	publish(t, b, "failbus.dlq.x", 5, 0)
	n := 0
	err := watch.Read(b.Ctx, b.JS, watch.Config{Stream: topology.StreamDLQ}, func(jetstream.Msg) error {
		n++
		if n == 2 {
			return watch.ErrStop
		}
		return nil
	})
	if err != nil || n != 2 {
		t.Errorf("read %d messages, %v; want 2 and no error", n, err)
	}
	boom := errors.New("boom")
	err = watch.Read(b.Ctx, b.JS, watch.Config{Stream: topology.StreamDLQ}, func(jetstream.Msg) error { return boom })
	if !errors.Is(err, boom) {
		t.Errorf("callback error %v, want boom", err)
	}
	if n := ephemerals(t, b, topology.StreamDLQ); n != 0 {
		t.Errorf("%d consumers left behind", n)
	}
}

func TestStartFollowsAndLogWaits(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	publish(t, b, "failbus.dlq.x", 2, 0)
	l, err := watch.StartLog(b.Ctx, b.JS, watch.Config{Stream: topology.StreamDLQ, DeliverPolicy: jetstream.DeliverNewPolicy},
		func(m jetstream.Msg) (string, error) {
			if string(m.Data()) == "junk" {
				return "", errors.New("not ours")
			}
			return string(m.Data()), nil
		})
	if err != nil {
		t.Fatal(err)
	}
	// Published after StartLog returned: never missed, even with
	// DeliverNew.
	publish(t, b, "failbus.dlq.x", 1, 2)
	if _, err := b.JS.Publish(b.Ctx, "failbus.dlq.x", []byte("junk")); err != nil {
		t.Fatal(err)
	}
	publish(t, b, "failbus.dlq.x", 1, 3)
	ctx, cancel := context.WithTimeout(b.Ctx, 30*time.Second)
	defer cancel()
	v, i, err := l.Wait(ctx, 0, func(s string) bool { return s == "m3" })
	if err != nil || v != "m3" || i != 1 {
		t.Fatalf("Wait = %q at %d, %v; want m3 at 1 (m2 first, junk skipped)", v, i, err)
	}
	short, cancelShort := context.WithTimeout(b.Ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, _, err := l.Wait(short, i+1, func(string) bool { return true }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait past the last item = %v, want the deadline", err)
	}
	if err := l.Stop(); err != nil {
		t.Fatal(err)
	}
	if n := ephemerals(t, b, topology.StreamDLQ); n != 0 {
		t.Errorf("%d consumers left behind", n)
	}
}

// A read that must not be partial fails when the messages it selected stop
// coming (here: purged after it opened) instead of waiting for ever. (The
// dead letters deny purge; the control stream does not.)
func TestReadStalls(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	publish(t, b, "failbus.control.x", 3, 0)
	r, err := watch.Open(b.Ctx, b.JS, watch.Config{Stream: topology.StreamControl, Stall: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(b.Ctx)
	if r.Pending() != 3 {
		t.Fatalf("pending %d, want 3", r.Pending())
	}
	s, err := b.JS.Stream(b.Ctx, topology.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(b.Ctx); err != nil {
		t.Fatal(err)
	}
	err = r.Run(b.Ctx, func(jetstream.Msg) error { return nil })
	if !errors.Is(err, watch.ErrStalled) {
		t.Errorf("Run = %v, want ErrStalled", err)
	}
}
