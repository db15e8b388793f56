package watch_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
)

// line is what a read handed on, comparable: subject, stream sequence,
// data, and a header the publisher set.
func line(m jetstream.Msg) string {
	md, err := m.Metadata()
	if err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("%s #%d %s h=%v", m.Subject(), md.Sequence.Stream, m.Data(), m.Headers()["X-Mine"])
}

// readAll reads cfg to its end (without Follow) or until n messages.
func readAll(t *testing.T, b *bustest.Bus, cfg watch.Config, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 20*time.Second)
	defer cancel()
	var got []string
	err := watch.Read(ctx, b.JS, cfg, func(m jetstream.Msg) error {
		got = append(got, line(m))
		if n > 0 && len(got) == n {
			return watch.ErrStop
		}
		return nil
	})
	if err != nil {
		t.Errorf("read %+v: %v", cfg, err)
	}
	return got
}

// TestDirectReadsAsAConsumerDoes: a Direct read hands on what an ordered
// consumer with the same configuration delivers, in the same order, with
// the publisher's headers and none the server added, for every way a read
// starts, over several filters (merged in stream order across pages), and
// while following messages stored after it began; it leaves no consumer
// behind.
func TestDirectReadsAsAConsumerDoes(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, 2*time.Minute)
	store := func(subject string, i int) {
		h := nats.Header{}
		h.Set("X-Mine", fmt.Sprint(i))
		if _, err := b.JS.PublishMsg(b.Ctx, &nats.Msg{Subject: subject, Header: h, Data: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// More than a page of each of three subjects, interleaved unevenly.
	subjects := []string{"failbus.dlq.a", "failbus.dlq.b", "failbus.dlq.a", "failbus.dlq.c", "failbus.dlq.a"}
	var mid time.Time
	storeAsync := func(from, to int) {
		for i := from; i < to; i++ {
			h := nats.Header{}
			h.Set("X-Mine", fmt.Sprint(i))
			if _, err := b.JS.PublishMsgAsync(&nats.Msg{Subject: subjects[i%len(subjects)], Header: h, Data: fmt.Appendf(nil, "m%d", i)}); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-b.JS.PublishAsyncComplete():
		case <-b.Ctx.Done():
			t.Fatal("publishes not acknowledged")
		}
	}
	storeAsync(0, 900)
	mid = time.Now()
	time.Sleep(5 * time.Millisecond) // stored strictly after mid
	storeAsync(900, 1500)
	base := watch.Config{Stream: topology.StreamDLQ}
	with := func(f func(*watch.Config)) watch.Config {
		c := base
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  watch.Config
	}{
		{"everything", base},
		{"one filter", with(func(c *watch.Config) { c.Filters = []string{"failbus.dlq.c"} })},
		{"two filters, merged", with(func(c *watch.Config) { c.Filters = []string{"failbus.dlq.c", "failbus.dlq.b"} })},
		{"a wildcard and a subject", with(func(c *watch.Config) { c.Filters = []string{"failbus.dlq.b", "failbus.dlq.a"} })},
		{"from a sequence", with(func(c *watch.Config) {
			c.DeliverPolicy, c.StartSeq, c.Filters = jetstream.DeliverByStartSequencePolicy, 1234, []string{"failbus.dlq.a", "failbus.dlq.c"}
		})},
		{"from a time", with(func(c *watch.Config) {
			c.DeliverPolicy, c.StartTime, c.Filters = jetstream.DeliverByStartTimePolicy, &mid, []string{"failbus.dlq.b", "failbus.dlq.c"}
		})},
		{"the latest of each subject", with(func(c *watch.Config) { c.DeliverPolicy = jetstream.DeliverLastPerSubjectPolicy })},
		{"nothing new", with(func(c *watch.Config) { c.DeliverPolicy = jetstream.DeliverNewPolicy })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := readAll(t, b, tc.cfg, 0)
			d := tc.cfg
			d.Direct = true
			got := readAll(t, b, d, 0)
			if !slices.Equal(got, want) {
				t.Errorf("direct read: %d messages, a consumer's: %d; first difference at %d", len(got), len(want), firstDiff(got, want))
			}
			if tc.cfg.DeliverPolicy != jetstream.DeliverNewPolicy && len(want) == 0 {
				t.Error("the consumer read nothing: the case checks nothing")
			}
		})
	}

	t.Run("following", func(t *testing.T) {
		cfg := with(func(c *watch.Config) {
			c.DeliverPolicy, c.StartSeq, c.Filters, c.Follow = jetstream.DeliverByStartSequencePolicy, 1490, []string{"failbus.dlq.a", "failbus.dlq.c"}, true
			c.Direct, c.PollInterval = true, 10*time.Millisecond
		})
		var got []string
		arrived := make(chan struct{}, 100)
		w, err := watch.Start(b.Ctx, b.JS, cfg, func(m jetstream.Msg) error {
			got = append(got, line(m))
			arrived <- struct{}{}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for i := 1500; i < 1520; i++ {
			store(subjects[i%len(subjects)], i)
		}
		want := readAll(t, b, with(func(c *watch.Config) {
			c.DeliverPolicy, c.StartSeq, c.Filters = jetstream.DeliverByStartSequencePolicy, 1490, []string{"failbus.dlq.a", "failbus.dlq.c"}
		}), 0)
		for range want {
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatalf("following: %d of %d messages arrived", len(got), len(want))
			}
		}
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("following: got %q, want %q", got, want)
		}
	})
	if n := ephemerals(t, b, topology.StreamDLQ); n != 0 {
		t.Errorf("%d consumers left on the stream", n)
	}
}

func firstDiff(a, b []string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
