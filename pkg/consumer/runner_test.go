package consumer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// Streams of the test bench: inputs, outputs, and the dead letters on the
// real failbus.dlq.> subjects.
const (
	inStream  = "TEST_IN"
	outStream = "TEST_OUT"
	dlqStream = "TEST_DLQ"
	service   = "tester"
)

type bench struct {
	t   *testing.T
	ctx context.Context
	srv *embedded.Server
	nc  *nats.Conn
	js  jetstream.JetStream
}

// setup starts an embedded server with an input, an output and a
// dead-letter stream.
func setup(t *testing.T) *bench {
	t.Helper()
	return setupOpts(t, embedded.Options{Dir: t.TempDir()})
}

// setupOpts is setup on a server started with opts.
func setupOpts(t *testing.T, opts embedded.Options) *bench {
	t.Helper()
	srv := embedded.StartTestOpts(t, opts)
	nc := embedded.ConnectTest(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	for name, subj := range map[string]string{inStream: "test.in.>", outStream: "test.out.>", dlqStream: "failbus.dlq.>"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, Duplicates: time.Minute}); err != nil {
			t.Fatalf("create stream %s: %v", name, err)
		}
	}
	return &bench{t: t, ctx: ctx, srv: srv, nc: nc, js: js}
}

// consumerConfig is the durable every test runner creates: short AckWait so
// a lost ack shows quickly, MaxDeliver 4, so the handler runs on at most 3
// deliveries and the runner keeps the fourth spare.
func consumerConfig() *jetstream.ConsumerConfig {
	return &jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second, MaxDeliver: 4}
}

// config is a runner config for the bench with fast retries and a short
// pull, so a drain ends quickly.
func config() consumer.Config {
	return consumer.Config{
		Service:        service,
		Stream:         inStream,
		ConsumerConfig: consumerConfig(),
		Backoff:        []time.Duration{10 * time.Millisecond},
		FetchWait:      100 * time.Millisecond,
	}
}

// start runs a runner until the returned stop is called (or the test ends);
// stop cancels it and returns Run's error.
func (b *bench) start(cfg consumer.Config, h consumer.Handler) (*consumer.Runner, func() error) {
	b.t.Helper()
	r, err := consumer.New(b.js, cfg, h)
	if err != nil {
		b.t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			runErr = <-done
		})
		return runErr
	}
	b.t.Cleanup(func() { _ = stop() })
	b.waitFor("runner healthy", func() bool { return r.Healthy() == nil })
	return r, stop
}

func (b *bench) waitFor(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval, bounded by the deadline
	}
}

// settled reports whether the consumer has nothing pending or unacked.
func (b *bench) settled(name string) bool {
	ok, err := embedded.CaughtUp(b.ctx, b.js, inStream, name)
	return err == nil && ok
}

// storeOutput stores on test.out.x the output key of input id as a
// runner that died after storing it, before its ack, left it: under the
// Nats-Msg-Id the runner gives it.
func (b *bench) storeOutput(id, key string) {
	b.t.Helper()
	data, hdr, err := events.Encode(note(id))
	if err != nil {
		b.t.Fatal(err)
	}
	hdr.Set(nats.MsgIdHdr, msgid.Output(service, id, key))
	if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: "test.out.x", Header: hdr, Data: data}); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bench) publishIn(subject, id string, data []byte) {
	b.t.Helper()
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	if id != "" {
		m.Header.Set(nats.MsgIdHdr, id)
	}
	if _, err := b.js.PublishMsg(b.ctx, m); err != nil {
		b.t.Fatalf("publish %s: %v", subject, err)
	}
}

// read returns every message of a stream.
func (b *bench) read(stream string) []jetstream.Msg {
	b.t.Helper()
	s, err := b.js.Stream(b.ctx, stream)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	n := int(info.State.Msgs)
	if n == 0 {
		return nil
	}
	oc, err := s.OrderedConsumer(b.ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.t.Fatal(err)
	}
	var out []jetstream.Msg
	for len(out) < n {
		batch, err := oc.Fetch(n-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			out = append(out, m)
			got++
		}
		if got == 0 {
			b.t.Fatalf("stream %s: read %d of %d messages", stream, len(out), n)
		}
	}
	return out
}

func (b *bench) count(stream string) int {
	s, err := b.js.Stream(b.ctx, stream)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	return int(info.State.Msgs)
}

func (b *bench) deadLetters() []*events.DeadLetter {
	b.t.Helper()
	var out []*events.DeadLetter
	for _, m := range b.read(dlqStream) {
		dl, err := events.DecodeAs[*events.DeadLetter](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			b.t.Fatalf("dead letter does not decode: %v", err)
		}
		out = append(out, dl)
	}
	return out
}

func outcome(id string) *events.Outcome {
	return &events.Outcome{ID: id, Agent: "a1", Provider: "openai", At: events.At(time.Unix(1700000000, 0)), RequestTokens: 10}
}

func encode(t *testing.T, m events.Message) []byte {
	t.Helper()
	data, _, err := events.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// note is the output the test handlers publish.
func note(id string) *events.Notification {
	return &events.Notification{DedupeKey: id, Severity: events.SeverityInfo}
}

func TestRunnerAcksAfterPublishingOutputs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 10
	for i := range n {
		b.publishIn("test.in.x", fmt.Sprintf("in-%d", i), []byte("payload"))
	}
	b.publishIn("test.in.noid", "", []byte("payload")) // identity falls back to stream:seq
	cfg := config()
	cfg.Concurrency = 3
	cfg.FetchBatch = 4
	r, _ := b.start(cfg, func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		out.Publish("test.out.a", note(m.ID()), "a")
		out.Publish("test.out.b", note(m.ID()), "")
		return nil
	})
	b.waitFor("every input acked", func() bool { return b.settled(service) })

	msgs := b.read(outStream)
	if len(msgs) != 2*(n+1) {
		t.Fatalf("outputs: got %d, want %d", len(msgs), 2*(n+1))
	}
	ids := map[string]bool{}
	for _, m := range msgs {
		ids[m.Headers().Get(nats.MsgIdHdr)] = true
		if got := m.Headers().Get(events.HeaderSchema); got != "notification/1" {
			t.Errorf("output schema header %q", got)
		}
	}
	for _, want := range []string{
		msgid.Output(service, "in-0", "a"), msgid.Output(service, "in-0", "1"),
		msgid.Output(service, inStream+":11", "a"),
	} {
		if !ids[want] {
			t.Errorf("no output with Nats-Msg-Id %q among %v", want, ids)
		}
	}
	if got := b.count(dlqStream); got != 0 {
		t.Errorf("dead letters: %d, want 0", got)
	}
	if got := counterValue(t, r.Gatherer(), "failbus_consumer_messages_total", map[string]string{"result": "ack"}); got != n+1 {
		t.Errorf("failbus_consumer_messages_total{result=ack}: %v, want %d", got, n+1)
	}
}

// TestRunnerHandlerResults covers what the runner does with each answer a
// handler can give.
func TestRunnerHandlerResults(t *testing.T) {
	t.Parallel()
	errFlaky := errors.New("dependency down")
	tests := []struct {
		name   string
		decode bool
		data   []byte
		// noSchema publishes without the Failbus-Schema header: test.in.x
		// carries no type of its own, so then nothing says what it is.
		noSchema bool
		handler  func(m *consumer.Msg, out *consumer.Outputs) error
		// want
		calls      int
		outputs    int
		deadReason string // substring; empty = no dead letter
	}{
		{
			name: "nil acks and publishes the outputs",
			handler: func(m *consumer.Msg, out *consumer.Outputs) error {
				out.Publish("test.out.x", note(m.ID()), "")
				return nil
			},
			calls: 1, outputs: 1,
		},
		{
			name: "Retry redelivers after its delay, then the handler succeeds",
			handler: func(m *consumer.Msg, out *consumer.Outputs) error {
				if m.Delivered == 1 {
					out.Publish("test.out.x", note("dropped"), "")
					return consumer.Retry(10*time.Millisecond, "not yet")
				}
				out.Publish("test.out.x", note(m.ID()), "")
				return nil
			},
			calls: 2, outputs: 1,
		},
		{
			name: "an error is retried with backoff, then the handler succeeds",
			handler: func(m *consumer.Msg, out *consumer.Outputs) error {
				if m.Delivered < 3 {
					return errFlaky
				}
				out.Publish("test.out.x", note(m.ID()), "")
				return nil
			},
			calls: 3, outputs: 1,
		},
		{
			name: "DeadLetter dead-letters at once and drops the outputs",
			handler: func(m *consumer.Msg, out *consumer.Outputs) error {
				out.Publish("test.out.x", note(m.ID()), "")
				return consumer.DeadLetterf("field %q is wrong", "x")
			},
			calls: 1, deadReason: `field "x" is wrong`,
		},
		{
			name:    "an error on every delivery is dead-lettered on delivery MaxDeliver",
			handler: func(*consumer.Msg, *consumer.Outputs) error { return errFlaky },
			calls:   3, deadReason: "failed 3 deliveries, last error: dependency down",
		},
		{
			name: "Retry on every delivery is dead-lettered on the last one",
			handler: func(*consumer.Msg, *consumer.Outputs) error {
				return consumer.Retry(time.Millisecond, "still not ready")
			},
			calls: 3, deadReason: "gave up after 3 deliveries: still not ready",
		},
		{
			name:    "a panic is dead-lettered with its value",
			handler: func(*consumer.Msg, *consumer.Outputs) error { panic("boom") },
			calls:   1, deadReason: "panic: boom",
		},
		{
			name: "an output that does not validate dead-letters the input",
			handler: func(_ *consumer.Msg, out *consumer.Outputs) error {
				out.Publish("test.out.x", &events.Notification{Severity: "loud"}, "")
				return nil
			},
			calls: 1, deadReason: `invalid output: output 0 to test.out.x: invalid notification: field "dedupe_key": required`,
		},
		{
			name: "an output key used twice dead-letters the input",
			handler: func(m *consumer.Msg, out *consumer.Outputs) error {
				out.Publish("test.out.x", note(m.ID()), "k")
				out.Publish("test.out.y", note(m.ID()), "k")
				return nil
			},
			calls: 1, deadReason: `output key "k" used twice`,
		},
		{
			name:   "with Decode, a valid message arrives as Value",
			decode: true,
			handler: func(m *consumer.Msg, out *consumer.Outputs) error {
				o, ok := m.Value.(*events.Outcome)
				if !ok || o.ID != "o-1" {
					return consumer.DeadLetterf("Value %#v", m.Value)
				}
				out.Publish("test.out.x", note(o.ID), "")
				return nil
			},
			calls: 1, outputs: 1,
		},
		{
			name:       "with Decode, bytes that are not msgpack are dead-lettered without calling the handler",
			decode:     true,
			data:       []byte("not msgpack"),
			handler:    func(*consumer.Msg, *consumer.Outputs) error { return nil },
			calls:      0,
			deadReason: "decode: not a failbus message",
		},
		{
			name:       "with Decode, a missing required field is dead-lettered naming it",
			decode:     true,
			data:       []byte{0x81, 0xa5, 'a', 'g', 'e', 'n', 't', 0xa1, 'x'}, // {"agent":"x"}
			handler:    func(*consumer.Msg, *consumer.Outputs) error { return nil },
			calls:      0,
			deadReason: `decode: invalid outcome: field "id": required`,
		},
		{
			name:       "with Decode, a message without schema header on a subject without a type is dead-lettered",
			decode:     true,
			noSchema:   true,
			handler:    func(*consumer.Msg, *consumer.Outputs) error { return nil },
			calls:      0,
			deadReason: "decode: not a failbus message: no Failbus-Schema header, and subject test.in.x carries no failbus type",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			data := tt.data
			if data == nil {
				data = encode(t, outcome("o-1"))
			}
			hdr := nats.Header{}
			hdr.Set(nats.MsgIdHdr, "o-1")
			hdr.Set("X-Trace", "t-1")
			if !tt.noSchema {
				hdr.Set(events.HeaderSchema, "outcome/1")
			}
			if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: "test.in.x", Header: hdr, Data: data}); err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int32
			cfg := config()
			cfg.Decode = tt.decode
			b.start(cfg, func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
				calls.Add(1)
				return tt.handler(m, out)
			})
			b.waitFor("input settled", func() bool { return b.settled(service) })

			if got := int(calls.Load()); got != tt.calls {
				t.Errorf("handler calls: %d, want %d", got, tt.calls)
			}
			if got := b.count(outStream); got != tt.outputs {
				t.Errorf("outputs: %d, want %d", got, tt.outputs)
			}
			dls := b.deadLetters()
			if tt.deadReason == "" {
				if len(dls) != 0 {
					t.Fatalf("unexpected dead letter: %+v", dls[0])
				}
				return
			}
			if len(dls) != 1 {
				t.Fatalf("dead letters: %d, want 1", len(dls))
			}
			dl := dls[0]
			if !strings.Contains(dl.Reason, tt.deadReason) {
				t.Errorf("reason %q, want it to contain %q", dl.Reason, tt.deadReason)
			}
			if dl.Service != service || dl.Subject != "test.in.x" || dl.Stream != inStream || dl.Seq != 1 {
				t.Errorf("dead letter origin: service %q subject %q stream %q seq %d", dl.Service, dl.Subject, dl.Stream, dl.Seq)
			}
			if string(dl.Data) != string(data) {
				t.Errorf("dead letter data %q, want the original bytes %q", dl.Data, data)
			}
			if got := dl.Headers["X-Trace"]; len(got) != 1 || got[0] != "t-1" {
				t.Errorf("dead letter headers %v, want the original X-Trace", dl.Headers)
			}
			raw := b.read(dlqStream)[0]
			if got, want := raw.Subject(), events.DLQSubject(service); got != want {
				t.Errorf("dead letter subject %q, want %q", got, want)
			}
			if got, want := raw.Headers().Get(nats.MsgIdHdr), msgid.DeadLetter(service, inStream, 1); got != want {
				t.Errorf("dead letter Nats-Msg-Id %q, want %q", got, want)
			}
		})
	}
}

// TestRunnerRedeliveryDoesNotDoubleOutputs: the first delivery publishes one
// output and fails on the second (no stream takes its subject), so the input
// is redelivered and publishes both again; the first is deduplicated.
func TestRunnerRedeliveryDoesNotDoubleOutputs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publishIn("test.in.x", "in-1", []byte("x"))
	r, _ := b.start(config(), func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		out.Publish("test.out.first", note(m.ID()), "first")
		second := "test.out.second"
		if m.Delivered == 1 {
			second = "nowhere.second"
		}
		out.Publish(second, note(m.ID()), "second")
		return nil
	})
	b.waitFor("input settled", func() bool { return b.settled(service) })

	msgs := b.read(outStream)
	var subjects []string
	for _, m := range msgs {
		subjects = append(subjects, m.Subject())
	}
	if strings.Join(subjects, ",") != "test.out.first,test.out.second" {
		t.Errorf("outputs %v, want each once", subjects)
	}
	if got := counterValue(t, r.Gatherer(), "failbus_consumer_outputs_published_total", map[string]string{"service": service, "duplicate": "true"}); got != 1 {
		t.Errorf("duplicate outputs: %v, want 1 (the first output re-published by the redelivery)", got)
	}
}

// TestRunnerCrashAfterPublishBeforeAck: a runner that died after its
// outputs were stored but before its ack left behind exactly the outputs the
// next delivery publishes; they are stored once.
func TestRunnerCrashAfterPublishBeforeAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publishIn("test.in.x", "in-1", []byte("x"))
	b.storeOutput("in-1", "0") // what the dead runner stored before dying
	b.start(config(), func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		out.Publish("test.out.x", note(m.ID()), "")
		return nil
	})
	b.waitFor("input settled", func() bool { return b.settled(service) })
	if got := b.count(outStream); got != 1 {
		t.Errorf("outputs: %d, want 1", got)
	}
}

// TestRunnerDrainsOnCancel: cancelling Run lets the in-flight handler finish
// and ack, hands the fetched but unstarted messages back at once (the
// consumer's AckWait is a minute, so waiting it out would time the test
// out), and returns nil.
func TestRunnerDrainsOnCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 5 {
		b.publishIn("test.in.x", fmt.Sprintf("in-%d", i), []byte("x"))
	}
	cfg := config()
	cfg.ConsumerConfig.AckWait = time.Minute
	cfg.FetchBatch = 5
	started, release := make(chan string, 5), make(chan struct{})
	r, err := consumer.New(b.js, cfg, func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		started <- m.ID()
		<-release
		out.Publish("test.out.x", note(m.ID()), "")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	first := <-started
	cancel() // SIGTERM while a handler is in flight
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Run: %v, want nil after a drain", err)
	}
	if !errors.Is(r.Healthy(), consumer.ErrStopped) {
		t.Errorf("Healthy after Run: %v, want ErrStopped", r.Healthy())
	}
	msgs := b.read(outStream)
	if len(msgs) != 1 || msgs[0].Headers().Get(nats.MsgIdHdr) != msgid.Output(service, first, "0") {
		t.Fatalf("after drain: %d outputs, want exactly the in-flight message's", len(msgs))
	}

	// The other four were handed back: a new runner gets them now.
	b.start(cfg, func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		out.Publish("test.out.x", note(m.ID()), "")
		return nil
	})
	b.waitFor("the handed-back messages handled", func() bool { return b.count(outStream) == 5 })
}

func TestRunnerHealthAndOpsEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := consumer.New(b.js, config(), func(context.Context, *consumer.Msg, *consumer.Outputs) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(r.Healthy(), consumer.ErrNotRunning) {
		t.Errorf("Healthy before Run: %v, want ErrNotRunning", r.Healthy())
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	addr, err := ops.Serve(ctx, "127.0.0.1:0", r.Gatherer(), r.Healthy, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not running") {
		t.Errorf("/healthz before Run: %d %q", code, body)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	b.waitFor("healthy", func() bool { return r.Healthy() == nil })
	b.publishIn("test.in.x", "in-1", []byte("x"))
	b.waitFor("input settled", func() bool { return b.settled(service) })
	if code, body := get("/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz while running: %d %q", code, body)
	}
	// The result is counted just after the ack that settled the input, so
	// wait for it rather than race it.
	b.waitFor("the ack counted on /metrics", func() bool {
		code, body := get("/metrics")
		return code == http.StatusOK && strings.Contains(body, `failbus_consumer_messages_total{result="ack",service="tester"} 1`)
	})
	stopRun()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if code, body := get("/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "stopped") {
		t.Errorf("/healthz after Run: %d %q", code, body)
	}
}

// TestRunnerHeartbeatKeepsLongHandlers: a handler running three times the
// AckWait keeps its message under Heartbeat: one delivery, no redelivery.
func TestRunnerHeartbeatKeepsLongHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publishIn("test.in.x", "in-1", []byte("x"))
	cfg := config()
	cfg.ConsumerConfig.AckWait = 2 * time.Second
	cfg.Middleware = []consumer.Middleware{consumer.Heartbeat(200 * time.Millisecond)}
	var calls atomic.Int32
	b.start(cfg, func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		calls.Add(1)
		// Simulated long work, longer than AckWait.
		select {
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
		out.Publish("test.out.x", note(m.ID()), "")
		return nil
	})
	b.waitFor("input settled", func() bool { return b.count(outStream) == 1 && b.settled(service) })
	if got := calls.Load(); got != 1 {
		t.Errorf("handler calls: %d, want 1 (no redelivery while heartbeating)", got)
	}
}

func TestRunnerConfigErrors(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := func(context.Context, *consumer.Msg, *consumer.Outputs) error { return nil }
	tests := []struct {
		name string
		cfg  consumer.Config
		want string
	}{
		{"no service", consumer.Config{Stream: "S"}, "Service is required"},
		{"service not a subject token", consumer.Config{Service: "a.b", Stream: "S"}, "subject token"},
		{"unknown consumer without stream", consumer.Config{Service: "costs"}, `Stream is required: consumer "costs"`},
		{"negative concurrency", consumer.Config{Service: "x", Stream: "S", Concurrency: -1}, "Concurrency -1"},
		{"empty backoff", consumer.Config{Service: "x", Stream: "S", Backoff: []time.Duration{}}, "Backoff: needs"},
		{"backoff beyond the duplicate window's margin", consumer.Config{Service: "x", Stream: "S", Backoff: []time.Duration{time.Hour}}, "Backoff[0] 1h0m0s"},
		{"tiny fetch wait", consumer.Config{Service: "x", Stream: "S", FetchWait: time.Millisecond}, "FetchWait"},
		{"nil middleware", consumer.Config{Service: "x", Stream: "S", Middleware: []consumer.Middleware{nil}}, "Middleware[0] is nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := consumer.New(b.js, tt.cfg, h)
			if !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want ErrInvalidConfig containing %q", err, tt.want)
			}
		})
	}
	// A topology consumer needs no Stream.
	if _, err := consumer.New(b.js, consumer.Config{Service: "classifier"}, h); err != nil {
		t.Errorf("topology consumer: %v", err)
	}
}

func TestRunnerRefusesMaxDeliverAboveTheConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := config()
	cfg.ConsumerConfig.MaxDeliver = 3
	cfg.MaxDeliver = 4 // the consumer allows 3
	r, err := consumer.New(b.js, cfg, func(context.Context, *consumer.Msg, *consumer.Outputs) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(b.ctx); !errors.Is(err, consumer.ErrInvalidConfig) || !strings.Contains(err.Error(), "MaxDeliver 4 exceeds") {
		t.Errorf("Run: %v, want ErrInvalidConfig about MaxDeliver", err)
	}
}

func TestRunnerMissingConsumerIsAClearError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := config()
	cfg.ConsumerConfig = nil
	r, err := consumer.New(b.js, cfg, func(context.Context, *consumer.Msg, *consumer.Outputs) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(b.ctx); !errors.Is(err, jetstream.ErrConsumerNotFound) || !strings.Contains(err.Error(), "apply the topology first") {
		t.Errorf("Run: %v, want ErrConsumerNotFound with a hint", err)
	}
}

func counterValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestRunnerTimeoutGivesStuckHandlersBack: a handler that waits on its
// context forever is cut off by Timeout and retried, then dead-lettered on
// the last delivery with the deadline as the reason.
func TestRunnerTimeoutGivesStuckHandlersBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publishIn("test.in.x", "in-1", []byte("x"))
	cfg := config()
	cfg.Middleware = []consumer.Middleware{consumer.Timeout(20 * time.Millisecond)}
	var calls atomic.Int32
	b.start(cfg, func(ctx context.Context, _ *consumer.Msg, _ *consumer.Outputs) error {
		calls.Add(1)
		<-ctx.Done()
		return ctx.Err()
	})
	b.waitFor("input settled", func() bool { return b.settled(service) })
	dls := b.deadLetters()
	if len(dls) != 1 || !strings.Contains(dls[0].Reason, "context deadline exceeded") {
		t.Fatalf("dead letters %+v, want one about the deadline", dls)
	}
	if got := calls.Load(); got != 3 {
		t.Errorf("handler calls: %d, want 3 (MaxDeliver)", got)
	}
}

// TestRunnerLastDeliveryDyingWithTheProcess: the process handling a
// message's last handler delivery dies (its connection closes while the
// handler hangs). With the spare delivery the runner keeps by default, the
// next process dead-letters the message on the spare without running the
// handler; without it (MaxDeliver equal to the consumer's) the server gives
// up, says so only in its MAX_DELIVERIES advisory, and no dead letter is
// ever written: the limit the spare exists for.
func TestRunnerLastDeliveryDyingWithTheProcess(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		maxDeliver int // Config.MaxDeliver; the consumer's is 4
		calls      int // handler runs, the last one dying
		deadLetter string
	}{
		{name: "the spare delivery dead-letters it without the handler", maxDeliver: 0, calls: 3,
			deadLetter: "delivery 4 exceeds the limit of 3: delivery 3 was never settled"},
		{name: "without a spare the server drops it with only an advisory", maxDeliver: 4, calls: 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			advisories := make(chan *nats.Msg, 4)
			sub, err := b.nc.ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES."+inStream+"."+service, advisories)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			b.publishIn("test.in.x", "in-1", []byte("x"))
			cfg := config()
			cfg.MaxDeliver = tt.maxDeliver
			cfg.ConsumerConfig.AckWait = 2 * time.Second

			var (
				mu    sync.Mutex
				lasts []bool
			)
			dying, release := make(chan struct{}), make(chan struct{})
			handler := func(_ context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
				mu.Lock()
				lasts = append(lasts, m.Last)
				mu.Unlock()
				if m.Last {
					close(dying) // the process dies in here
					<-release
				}
				return errors.New("dependency down")
			}
			calls := func() int {
				mu.Lock()
				defer mu.Unlock()
				return len(lasts)
			}

			// The first process, on its own connection.
			ncA := embedded.ConnectTest(t, b.srv)
			jsA, err := jetstream.New(ncA)
			if err != nil {
				t.Fatal(err)
			}
			a, err := consumer.New(jsA, cfg, handler)
			if err != nil {
				t.Fatal(err)
			}
			doneA := make(chan error, 1)
			go func() { doneA <- a.Run(b.ctx) }()
			t.Cleanup(func() { close(release); <-doneA })
			<-dying
			ncA.Close() // SIGKILL: no ack, no nak, no dead letter from this process

			// The next process.
			b.start(cfg, handler)
			if tt.deadLetter != "" {
				b.waitFor("the dead letter", func() bool { return b.count(dlqStream) == 1 })
				dls := b.deadLetters()
				if !strings.Contains(dls[0].Reason, tt.deadLetter) || dls[0].Subject != "test.in.x" || string(dls[0].Data) != "x" {
					t.Errorf("dead letter %+v, want reason %q with the input", dls[0], tt.deadLetter)
				}
				b.waitFor("input settled", func() bool { return b.settled(service) })
			} else {
				select {
				case <-advisories:
				case <-b.ctx.Done():
					t.Fatal("no MAX_DELIVERIES advisory")
				}
				if got := b.count(dlqStream); got != 0 {
					t.Errorf("dead letters: %d, want 0 (the server dropped the message)", got)
				}
			}
			if got := calls(); got != tt.calls {
				t.Errorf("handler calls: %d, want %d", got, tt.calls)
			}
			mu.Lock()
			defer mu.Unlock()
			for i, last := range lasts {
				if want := i == tt.calls-1; last != want {
					t.Errorf("delivery %d: Last = %v, want %v", i+1, last, want)
				}
			}
		})
	}
}

// TestRunnerDeadLetterOfAnInputAtMaxPayload: an input as large as the
// server accepts cannot be copied whole into a dead letter (the envelope
// would push it past max_payload, and every delivery would fail the same
// way until the server dropped it). It is dead-lettered once, at once, with
// a bounded prefix, its length and hash, and where the whole input lies.
func TestRunnerDeadLetterOfAnInputAtMaxPayload(t *testing.T) {
	t.Parallel()
	// nats-server's default max_payload (1 MiB) keeps the test cheap
	// under -race; the record is bounded the same way at any size.
	b := setupOpts(t, embedded.Options{Dir: t.TempDir(), MaxPayload: 1 << 20})
	data := make([]byte, int(b.nc.MaxPayload())-1024)
	for i := range data {
		data[i] = byte(i * 7)
	}
	b.publishIn("test.in.x", "big-1", data)
	var calls atomic.Int32
	r, _ := b.start(config(), func(context.Context, *consumer.Msg, *consumer.Outputs) error {
		calls.Add(1)
		return consumer.DeadLetter("no use for it")
	})
	b.waitFor("input settled", func() bool { return b.settled(service) })

	dls := b.deadLetters()
	if len(dls) != 1 || calls.Load() != 1 {
		t.Fatalf("%d dead letters after %d handler calls, want 1 and 1", len(dls), calls.Load())
	}
	dl := dls[0]
	sum := sha256.Sum256(data)
	switch {
	case !dl.Truncated:
		t.Error("not marked truncated")
	case len(dl.Data) != consumer.DefaultDeadLetterPrefix || !bytes.Equal(dl.Data, data[:len(dl.Data)]):
		t.Errorf("kept %d bytes, want the first %d", len(dl.Data), consumer.DefaultDeadLetterPrefix)
	case dl.DataLen != len(data) || dl.DataSHA256 != hex.EncodeToString(sum[:]):
		t.Errorf("length %d and hash %s do not identify the input", dl.DataLen, dl.DataSHA256)
	case dl.Stream != inStream || dl.Seq != 1 || dl.Reason != "no use for it":
		t.Errorf("dead letter %s/%d reason %q", dl.Stream, dl.Seq, dl.Reason)
	}
	// The whole input is still where the dead letter says.
	s, err := b.js.Stream(b.ctx, dl.Stream)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := s.GetMsg(b.ctx, dl.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(orig.Data, data) {
		t.Fatal("the input at the recorded sequence is not the original")
	}
	if got := counterValue(t, r.Gatherer(), "failbus_consumer_dead_letters_truncated_total", map[string]string{"service": service}); got != 1 {
		t.Errorf("truncated dead letters counted %v, want 1", got)
	}
}

// TestRunnerDeadLettersInputBeyondTheLimits: a msgpack input nested a
// million levels deep never reaches the handler (nor a decoder): it is
// dead-lettered with the limit it broke in the reason.
func TestRunnerDeadLettersInputBeyondTheLimits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	deep := append([]byte{0x81, 0xa2, 'a', 't'}, bytes.Repeat([]byte{0x91}, 1_000_000)...)
	deep = append(deep, 0xc0)
	m := &nats.Msg{Subject: "test.in.x", Data: deep, Header: nats.Header{}}
	m.Header.Set(events.HeaderContentType, events.ContentTypeMsgpack)
	if _, err := b.js.PublishMsg(b.ctx, m); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	b.start(config(), func(context.Context, *consumer.Msg, *consumer.Outputs) error {
		calls.Add(1)
		return nil
	})
	b.waitFor("input settled", func() bool { return b.settled(service) })
	dls := b.deadLetters()
	if len(dls) != 1 || calls.Load() != 0 {
		t.Fatalf("%d dead letters, %d handler calls; want 1 and 0", len(dls), calls.Load())
	}
	if want := `"at": nesting depth exceeds the limit of 64`; !strings.Contains(dls[0].Reason, want) {
		t.Fatalf("reason %q does not name the limit (%s)", dls[0].Reason, want)
	}
	if dls[0].Truncated || !bytes.Equal(dls[0].Data, deep) {
		t.Fatal("a dead letter that fits keeps the whole input")
	}
}

// TestRunnerKeepsQueuedInputsAlive: inputs fetched into the window wait
// for a free worker while their AckWait runs; the runner signals progress
// for them, so none is redelivered while it is still waiting here. Eight
// inputs behind one worker whose handler takes 500 ms each: the last
// starts after 3.5 s, past an AckWait of two seconds (a signal goes out
// at most a second after the last: a second of slack for a loaded
// machine).
func TestRunnerKeepsQueuedInputsAlive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 8
	for i := range n {
		b.publishIn("test.in.x", fmt.Sprintf("q-%d", i), []byte("x"))
	}
	cfg := config()
	cfg.ConsumerConfig.AckWait = 2 * time.Second
	cfg.Concurrency, cfg.MaxInFlight, cfg.FetchBatch = 1, n, n
	// The handler keeps its own input alive; the runner, those waiting.
	cfg.Middleware = []consumer.Middleware{consumer.Heartbeat(200 * time.Millisecond)}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	var mu sync.Mutex
	calls := map[string][]int{} // input id → its deliveries seen
	b.start(cfg, func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		mu.Lock()
		calls[m.ID()] = append(calls[m.ID()], m.Delivered)
		mu.Unlock()
		select { // simulated slow work
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		out.Publish("test.out.x", note(m.ID()), "")
		return nil
	})
	b.waitFor("every input settled", func() bool { return b.count(outStream) == n && b.settled(service) })
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != n {
		t.Fatalf("handled %d inputs, want %d", len(calls), n)
	}
	// Handled once each: an input whose AckWait ran out while it waited
	// here would have been handled again on its redelivery. (Its first
	// delivery may be a later one: a delivery that reached a starved
	// process after nats.go's Fetch stopped listening never reached the
	// runner, see Config.FetchWait.)
	for id, ds := range calls {
		if len(ds) != 1 {
			t.Errorf("input %s: deliveries %v, want handled once", id, ds)
		}
	}
	if got := counterValue(t, reg, "failbus_consumer_queued_kept_alive_total", map[string]string{"service": service}); got == 0 {
		t.Error("no progress signal sent for a queued input")
	}
}

// TestRunnerOnStoredAfterTheOutputsAreStored: OnStored runs once every
// output of a delivery is stored — not for a delivery whose store failed
// (its redelivery runs the handler again and calls its own) — and says
// whether the delivery stored anything new: a delivery that finds every
// output stored by one before it (a crash after storing, before the ack)
// is not fresh, so a count kept there is not doubled.
func TestRunnerOnStoredAfterTheOutputsAreStored(t *testing.T) {
	t.Parallel()
	type call struct {
		delivered int
		fresh     bool
	}
	for _, tc := range []struct {
		name      string
		preStored bool // the output was stored by a delivery that died before its ack
		failFirst bool // the first delivery's store fails (no stream on its subject)
		want      []call
	}{
		{name: "stored", want: []call{{1, true}}},
		{name: "store failed, then stored", failFirst: true, want: []call{{2, true}}},
		{name: "found stored", preStored: true, want: []call{{1, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.publishIn("test.in.x", "in-1", []byte("x"))
			if tc.preStored {
				b.storeOutput("in-1", "out")
			}
			var (
				mu    sync.Mutex
				calls []call
			)
			b.start(config(), func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
				subject := "test.out.x"
				if tc.failFirst && m.Delivered == 1 {
					subject = "nowhere.x"
				}
				out.Publish(subject, note(m.ID()), "out")
				delivered := m.Delivered
				out.OnStored(func(fresh bool) {
					mu.Lock()
					defer mu.Unlock()
					calls = append(calls, call{delivered, fresh})
				})
				return nil
			})
			b.waitFor("input settled", func() bool { return b.settled(service) })
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(calls, tc.want) {
				t.Errorf("OnStored calls (delivery, fresh): %v, want %v", calls, tc.want)
			}
			if got := b.count(outStream); got != 1 {
				t.Errorf("outputs stored: %d, want 1", got)
			}
		})
	}
}

// TestRunnerAcksOnlyOnceAfterReturnsNil: an input whose handler handed
// work on with Outputs.After stays unacknowledged while that work is
// pending (the worker is free meanwhile: the next input is handled), is
// acknowledged once it is done, and is redelivered when it failed.
func TestRunnerAcksOnlyOnceAfterReturnsNil(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		failFor int // deliveries whose wait fails
		outputs bool
	}{
		{name: "no outputs"},
		{name: "with an output", outputs: true},
		{name: "failed once, then done", failFor: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			release := make(chan struct{})
			var (
				mu         sync.Mutex
				deliveries = map[string]int{}
				handled    = make(chan string, 8)
			)
			cfg := config()
			cfg.Concurrency = 1 // one worker: the second input is handled only if the first freed it
			b.start(cfg, func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
				mu.Lock()
				deliveries[m.ID()]++
				mu.Unlock()
				handled <- m.ID()
				if m.ID() != "in-1" {
					return nil
				}
				if tc.outputs {
					out.Publish("test.out.x", note(m.ID()), "out")
				}
				delivered := m.Delivered
				out.After(func(ctx context.Context) error {
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
					if delivered <= tc.failFor {
						return errors.New("the shared write failed")
					}
					return nil
				})
				return nil
			})
			b.publishIn("test.in.x", "in-1", []byte("x"))
			b.publishIn("test.in.x", "in-2", []byte("x"))
			for _, want := range []string{"in-1", "in-2"} {
				if got := <-handled; got != want {
					t.Fatalf("handled %s, want %s (the worker waits for After)", got, want)
				}
			}
			if b.settled(service) {
				t.Fatal("settled while the first input's After is pending")
			}
			close(release)
			b.waitFor("inputs settled", func() bool { return b.settled(service) })
			mu.Lock()
			defer mu.Unlock()
			if want := tc.failFor + 1; deliveries["in-1"] != want {
				t.Errorf("in-1 delivered %d times, want %d", deliveries["in-1"], want)
			}
			if want := map[bool]int{true: 1}[tc.outputs]; b.count(outStream) != want {
				t.Errorf("outputs stored: %d, want %d", b.count(outStream), want)
			}
			if dl := b.deadLetters(); len(dl) != 0 {
				t.Errorf("dead letters: %+v", dl)
			}
		})
	}
}

// TestRunnerKeepsAQueuedInputAliveOnlySoLong: an input queued behind a
// handler stuck on its key is kept alive for a bounded time (ten
// AckWaits), then left to its AckWait and redelivered — to another
// replica, if there is one — instead of being held here for as long as
// the stuck handler lasts. Its two deliveries store its output once.
func TestRunnerKeepsAQueuedInputAliveOnlySoLong(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.publishIn("test.in.x", "stuck", []byte("x"))
	b.publishIn("test.in.x", "queued", []byte("x"))
	cfg := config()
	cfg.ConsumerConfig.AckWait = time.Second
	cfg.Concurrency, cfg.MaxInFlight, cfg.FetchBatch = 1, 4, 2
	cfg.Key = func(*consumer.Msg) string { return "one key" }
	cfg.Middleware = []consumer.Middleware{consumer.Heartbeat(200 * time.Millisecond)}
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	var mu sync.Mutex
	calls := map[string][]int{}
	b.start(cfg, func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		mu.Lock()
		calls[m.ID()] = append(calls[m.ID()], m.Delivered)
		mu.Unlock()
		if m.ID() == "stuck" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		out.Publish("test.out.x", note(m.ID()), "")
		return nil
	})
	t.Cleanup(free) // before the runner stops (cleanups run last first), so a failure does not wait out the drain
	cons, err := b.js.Consumer(b.ctx, inStream, service)
	if err != nil {
		t.Fatal(err)
	}
	// Ten AckWaits of keep-alive, one more of AckWait: about 11 s.
	deadline := time.Now().Add(45 * time.Second)
	for {
		info, err := cons.Info(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumRedelivered > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the input queued behind the stuck handler was never redelivered: kept alive for as long as the handler lasts")
		}
		time.Sleep(100 * time.Millisecond) // poll interval, bounded by the deadline
	}
	mu.Lock()
	stuck := calls["stuck"]
	mu.Unlock()
	if len(stuck) != 1 {
		t.Fatalf("the stuck input's deliveries handled: %v, want only its first (its handler keeps it alive)", stuck)
	}
	free()
	b.waitFor("every input settled", func() bool { return b.count(outStream) == 2 && b.settled(service) })
	if got := b.count(outStream); got != 2 {
		t.Errorf("outputs: %d, want 2 (the queued input's once, whatever its deliveries)", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// The redelivered input is the queued one: once the stuck handler
	// returned, its later delivery ran too.
	if q := calls["queued"]; slices.Max(append([]int{0}, q...)) < 2 {
		t.Errorf("the queued input's deliveries handled: %v, want one past the first (it was the one redelivered)", q)
	}
	if s := calls["stuck"]; len(s) != 1 || s[0] != 1 {
		t.Errorf("the stuck input's deliveries handled: %v, want only its first", s)
	}
}
