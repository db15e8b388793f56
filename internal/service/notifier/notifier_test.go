package notifier_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/service/notifier"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/notify"
)

// hook is a webhook receiver counting deliveries per dedupe key; while
// failing it answers 503 with a recognisable body.
type hook struct {
	srv     *httptest.Server
	mu      sync.Mutex
	got     map[string]int
	failing bool
}

func newHook(t *testing.T) *hook {
	h := &hook{got: map[string]int{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.failing {
			http.Error(w, "receiver down for maintenance", http.StatusServiceUnavailable)
			return
		}
		var p notify.WebhookPayload
		if err := json.Unmarshal(body, &p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h.got[p.DedupeKey]++
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) count() (keys, total int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.got {
		total += c
	}
	return len(h.got), total
}

func (h *hook) setFailing(f bool) {
	h.mu.Lock()
	h.failing = f
	h.mu.Unlock()
}

type bundle struct {
	js jetstream.JetStream
}

func setup(t *testing.T) *bundle {
	t.Helper()
	srv := embedded.StartTest(t)
	js, err := jetstream.New(embedded.ConnectTest(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(context.Background(), js, topology.Options{}); err != nil {
		t.Fatal(err)
	}
	return &bundle{js: js}
}

// fastConsumer is the topology's notifier consumer with short waits, so a
// test sees redeliveries quickly.
func fastConsumer() *jetstream.ConsumerConfig {
	_, c, _ := topology.Consumer(topology.ConsumerNotifier)
	c.AckWait = 2 * time.Second
	c.BackOff = nil
	return &c
}

// start runs one replica until the test ends.
func (b *bundle) start(t *testing.T, cfg notifier.Config) *notifier.Service {
	t.Helper()
	if cfg.ConsumerConfig == nil {
		cfg.ConsumerConfig = fastConsumer()
	}
	if cfg.FetchWait == 0 {
		cfg.FetchWait = 200 * time.Millisecond
	}
	s, err := notifier.New(b.js, cfg)
	if err != nil {
		t.Fatalf("notifier.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s
}

func (b *bundle) publish(t *testing.T, n *events.Notification) {
	t.Helper()
	data, hdr, err := events.Encode(n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.PublishMsg(context.Background(), &nats.Msg{Subject: events.NotifySubject(n.Severity), Header: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
}

// deadLetters reads failbus.dlq.notifier.
func (b *bundle) deadLetters(t *testing.T) []*events.DeadLetter {
	t.Helper()
	s, err := b.js.Stream(context.Background(), topology.StreamDLQ)
	if err != nil {
		t.Fatal(err)
	}
	var out []*events.DeadLetter
	for seq := uint64(1); ; seq++ {
		m, err := s.GetMsg(context.Background(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		dl, err := events.DecodeAs[*events.DeadLetter](m.Subject, m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, dl)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func webhookPolicy(url string, extra func(*notification.SinkConfig)) notification.Config {
	sc := notification.SinkConfig{Name: "ops", Type: notification.SinkWebhook, URL: url, SecretEnv: "HOOK_SECRET"}
	if extra != nil {
		extra(&sc)
	}
	return notification.Config{DailyBudget: 1000, Sinks: []notification.SinkConfig{sc}}
}

func getenv(k string) string {
	if k == "HOOK_SECRET" {
		return "shh"
	}
	return ""
}

func TestServiceDeliversOncePerKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newHook(t)
	b.start(t, notifier.Config{Notify: webhookPolicy(h.srv.URL, nil), Getenv: getenv})
	for i := range 30 {
		b.publish(t, &events.Notification{DedupeKey: fmt.Sprintf("k-%d", i%10), Severity: events.SeverityNormal, Title: "t"})
	}
	waitFor(t, "10 deliveries", func() bool { k, _ := h.count(); return k == 10 })
	// Every request is decided (acked) before we look at the total.
	waitFor(t, "all requests acked", func() bool {
		ok, err := embedded.CaughtUp(context.Background(), b.js, topology.StreamNotify, topology.ConsumerNotifier)
		return err == nil && ok
	})
	if k, total := h.count(); k != 10 || total != 10 {
		t.Fatalf("%d keys, %d deliveries; want 10 and 10", k, total)
	}
}

func TestServiceDeadLettersWithTheSinksAnswer(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		failing bool   // 503 from the receiver (temporary)
		url     string // overrides the receiver (permanent 404)
		want    string
	}{
		{"past the retry budget", true, "", "receiver down for maintenance"},
		{"a permanent answer at once", false, "/no-such-hook", "404"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			h := newHook(t)
			h.setFailing(tc.failing)
			url := h.srv.URL
			if tc.url != "" {
				mux := http.NewServeMux()
				srv := httptest.NewServer(mux) // every path 404
				t.Cleanup(srv.Close)
				url = srv.URL + tc.url
			}
			b.start(t, notifier.Config{Notify: webhookPolicy(url, func(sc *notification.SinkConfig) {
				sc.MaxAttempts, sc.RetryInitial, sc.RetryMax = 3, 20*time.Millisecond, 50*time.Millisecond
			}), Getenv: getenv})
			b.publish(t, &events.Notification{DedupeKey: "doomed", Severity: events.SeverityCritical, Title: "t"})
			waitFor(t, "a dead letter", func() bool { return len(b.deadLetters(t)) == 1 })
			dl := b.deadLetters(t)[0]
			if !strings.Contains(dl.Reason, tc.want) || dl.Service != notifier.Name {
				t.Fatalf("dead letter %q from %s: want the sink's answer %q", dl.Reason, dl.Service, tc.want)
			}
			n, err := events.DecodeAs[*events.Notification](dl.Subject, nats.Header(dl.Headers), dl.Data)
			if err != nil || n.DedupeKey != "doomed" {
				t.Fatalf("dead letter holds %v, %v: want the original request", n, err)
			}
		})
	}
}

func TestServiceLogsByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var buf strings.Builder
	log := zerologTo(&mu, &buf)
	b.start(t, notifier.Config{Notify: notification.DefaultConfig(), Logger: log})
	b.publish(t, &events.Notification{DedupeKey: "hello", Severity: events.SeverityCritical, Title: "provider down"})
	waitFor(t, "the log line", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(buf.String(), `"message":"notification"`) && strings.Contains(buf.String(), "provider down")
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func zerologTo(mu *sync.Mutex, b *strings.Builder) zerolog.Logger {
	return zerolog.New(lockedWriter{mu: mu, b: b})
}

// Severity on subject and payload: a request on failbus.notify.critical whose payload says info
// was budgeted as info. A request whose subject and payload disagree on
// severity is now a dead letter naming both, and nothing is sent; the
// requests around it are delivered.
func TestServiceDeadLettersASeverityMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newHook(t)
	b.start(t, notifier.Config{Notify: webhookPolicy(h.srv.URL, nil), Getenv: getenv})
	b.publish(t, &events.Notification{DedupeKey: "before", Severity: events.SeverityNormal, Title: "t"})
	n := &events.Notification{DedupeKey: "mismatch", Severity: events.SeverityInfo, Title: "t"}
	data, hdr, err := events.Encode(n)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.PublishMsg(context.Background(), &nats.Msg{Subject: events.NotifySubject(events.SeverityCritical), Header: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
	b.publish(t, &events.Notification{DedupeKey: "after", Severity: events.SeverityCritical, Title: "t"})
	waitFor(t, "a dead letter", func() bool { return len(b.deadLetters(t)) == 1 })
	waitFor(t, "all requests handled", func() bool {
		ok, err := embedded.CaughtUp(context.Background(), b.js, topology.StreamNotify, topology.ConsumerNotifier)
		return err == nil && ok
	})
	dl := b.deadLetters(t)[0]
	if !strings.Contains(dl.Reason, `subject failbus.notify.critical says critical, the payload says "info"`) || dl.Subject != events.NotifySubject(events.SeverityCritical) {
		t.Fatalf("dead letter %q on %s: want the severity mismatch named", dl.Reason, dl.Subject)
	}
	if k, total := h.count(); k != 2 || total != 2 {
		t.Fatalf("%d keys, %d deliveries: want the two agreeing requests delivered, the mismatch not", k, total)
	}
}
