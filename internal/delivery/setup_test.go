package delivery_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/notify"
)

// bundle is what a notifier test needs: a real embedded server with the
// topology applied, and a controllable clock.
type bundle struct {
	srv   *embedded.Server
	js    jetstream.JetStream
	clock *clock
}

func setup(t *testing.T) *bundle {
	t.Helper()
	srv := embedded.StartTest(t)
	nc := embedded.ConnectTest(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := topology.Apply(ctx, js, topology.Options{}); err != nil {
		t.Fatalf("apply topology: %v", err)
	}
	return &bundle{srv: srv, js: js, clock: newClock(time.Date(2026, 3, 14, 9, 0, 0, 0, time.UTC))}
}

// notifier builds a Notifier on the bundle with cfg's gaps filled.
func (b *bundle) notifier(t *testing.T, cfg delivery.Config) *delivery.Notifier {
	t.Helper()
	if cfg.JetStream == nil {
		cfg.JetStream = b.js
	}
	if cfg.Now == nil {
		cfg.Now = b.clock.Now
	}
	if cfg.DailyBudget == 0 {
		cfg.DailyBudget = delivery.Unlimited
	}
	n, err := delivery.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("delivery.New: %v", err)
	}
	return n
}

// process runs one request and fails the test on a bus error.
func process(t *testing.T, n *delivery.Notifier, id string, note events.Notification) delivery.Result {
	t.Helper()
	res, err := n.Process(context.Background(), delivery.Request{ID: id, Notification: note})
	if err != nil {
		t.Fatalf("Process(%s): %v", id, err)
	}
	return res
}

// audits reads every audit record stored so far.
func (b *bundle) audits(t *testing.T) []*delivery.Audit {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, topology.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*delivery.Audit
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		a := &delivery.Audit{}
		if err := events.Unmarshal(m.Data, a); err != nil {
			t.Fatalf("audit %d: %v", seq, err)
		}
		out = append(out, a)
	}
	return out
}

// kinds counts audit records by kind.
func kinds(as []*delivery.Audit) map[string]int {
	m := map[string]int{}
	for _, a := range as {
		m[a.Kind]++
	}
	return m
}

// notifyMsgs reads every request on the notify stream.
func (b *bundle) notifyMsgs(t *testing.T) []*events.Notification {
	t.Helper()
	ctx := context.Background()
	s, err := b.js.Stream(ctx, topology.StreamNotify)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*events.Notification
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		n, err := events.DecodeAs[*events.Notification](m.Subject, m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n)
	}
	return out
}

// clock is a manual clock shared by replicas.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock(t time.Time) *clock { return &clock{now: t} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// recSink records deliveries in memory and fails on demand. It is the
// receiver of the notifier's logic tests; the sinks' own wire formats are
// covered by the conformance suite and the acceptance test uses HTTP.
type recSink struct {
	name string
	idem bool

	mu          sync.Mutex
	got         []notify.Delivery
	fail        func(notify.Delivery) error
	inflight    int
	maxInflight int
	gate        chan struct{} // when set, Send waits for it
}

func newRecSink(name string, idem bool) *recSink { return &recSink{name: name, idem: idem} }

func (s *recSink) Name() string     { return s.name }
func (s *recSink) Idempotent() bool { return s.idem }

func (s *recSink) Send(ctx context.Context, d notify.Delivery) error {
	s.mu.Lock()
	s.inflight++
	s.maxInflight = max(s.maxInflight, s.inflight)
	fail, gate := s.fail, s.gate
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight--
		s.mu.Unlock()
	}()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return &notify.SinkError{Sink: s.name, Answer: ctx.Err().Error()}
		}
	}
	if fail != nil {
		if err := fail(d); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.got = append(s.got, d)
	s.mu.Unlock()
	return nil
}

func (s *recSink) setFail(f func(notify.Delivery) error) {
	s.mu.Lock()
	s.fail = f
	s.mu.Unlock()
}

func (s *recSink) deliveries() []notify.Delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]notify.Delivery(nil), s.got...)
}

// perKey counts deliveries by dedupe key.
func (s *recSink) perKey() map[string]int {
	m := map[string]int{}
	for _, d := range s.deliveries() {
		m[d.Notification.DedupeKey]++
	}
	return m
}

func note(key, severity string) events.Notification {
	return events.Notification{DedupeKey: key, Severity: severity, Title: "title of " + key, Text: "text of " + key}
}

func reqID(i int) string { return fmt.Sprintf("FAILBUS_NOTIFY:%d", i) }
