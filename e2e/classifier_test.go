package e2e

// Acceptance of the classifier service on a real embedded nats-server:
// every outcome classified exactly once, republished outcomes
// acknowledged as duplicates, exactly once across a crash in mid-batch, and
// junk dead-lettered while consumption goes on. "Exactly once" is counted on
// the FAILBUS_CLASSIFIED stream itself, not by handler calls.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/internal/service/classifier"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// clsBench is one embedded server with the failbus topology applied.
type clsBench struct {
	t   *testing.T
	ctx context.Context
	srv *embedded.Server
	js  jetstream.JetStream
}

func clsSetup(t *testing.T) *clsBench {
	t.Helper()
	bus := bustest.Start(t, 2*time.Minute)
	srv, js, ctx := bus.Srv, bus.JS, bus.Ctx
	return &clsBench{t: t, ctx: ctx, srv: srv, js: js}
}

// clsOutcomes returns n outcomes of varied providers and failure kinds, so
// the classifications spread over several subjects.
func clsOutcomes(prefix string, n int) []*events.Outcome {
	out := make([]*events.Outcome, n)
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range n {
		o := &events.Outcome{
			ID:       fmt.Sprintf("%s-%04d", prefix, i),
			At:       events.At(at.Add(time.Duration(i) * time.Millisecond)),
			Agent:    fmt.Sprintf("agent-%d", i%7),
			Provider: []string{"openai", "anthropic", "my-gateway"}[i%3],
			Model:    "m-1",
			Session:  "s", Segment: 1, Turn: i,
		}
		switch i % 5 {
		case 0:
			o.OK, o.Status = true, 200
		case 1:
			o.Status, o.Body = 429, `{"error":{"message":"Rate limit reached, please retry"}}`
		case 2:
			o.Status, o.Body = 500, "internal server error"
		case 3:
			o.TransportError = "read tcp: ECONNRESET"
		case 4:
			o.Status, o.Body = 401, `{"error":{"message":"Invalid API key"}}`
		}
		out[i] = o
	}
	return out
}

// publishOutcomes publishes outcomes the way agents do (msgpack,
// Nats-Msg-Id = id) and returns JetStream's acknowledgements.
func (b *clsBench) publishOutcomes(outs []*events.Outcome) []*jetstream.PubAck {
	b.t.Helper()
	futures := make([]jetstream.PubAckFuture, len(outs))
	for i, o := range outs {
		data, hdr, err := events.Encode(o)
		if err != nil {
			b.t.Fatal(err)
		}
		hdr.Set(nats.MsgIdHdr, o.ID)
		futures[i], err = b.js.PublishMsgAsync(&nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: hdr, Data: data})
		if err != nil {
			b.t.Fatalf("publish %s: %v", o.ID, err)
		}
	}
	acks := make([]*jetstream.PubAck, len(outs))
	for i, f := range futures {
		select {
		case acks[i] = <-f.Ok():
		case err := <-f.Err():
			b.t.Fatalf("publish %s: %v", outs[i].ID, err)
		case <-b.ctx.Done():
			b.t.Fatal("publish: timed out")
		}
	}
	return acks
}

func (b *clsBench) publishRaw(subject string, hdr nats.Header, data []byte) {
	b.t.Helper()
	if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: subject, Header: hdr, Data: data}); err != nil {
		b.t.Fatalf("publish %s: %v", subject, err)
	}
}

// clsRunnerConfig is the runner config the tests use: several handlers and
// a short pull so a stop is quick.
func clsRunnerConfig(reg prometheus.Registerer) consumer.Config {
	return consumer.Config{Concurrency: 8, FetchBatch: 32, FetchWait: 200 * time.Millisecond, Registerer: reg}
}

// startClassifier runs the classifier service until the test ends.
func (b *clsBench) startClassifier(reg prometheus.Registerer) *classifier.Service {
	b.t.Helper()
	return b.startClassifierWith(clsRunnerConfig(reg))
}

// startClassifierWith runs the classifier with runner settings rc until
// the test ends.
func (b *clsBench) startClassifierWith(rc consumer.Config) *classifier.Service {
	b.t.Helper()
	r, err := classifier.New(b.js, classifier.Config{Runner: rc})
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("classifier Run: %v", err)
		}
	})
	return r
}

func (b *clsBench) poll(what string, cond func() bool) {
	b.t.Helper()
	for !cond() {
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond): // poll interval, bounded by b.ctx
		}
	}
}

func (b *clsBench) consumerInfo() *jetstream.ConsumerInfo {
	b.t.Helper()
	c, err := b.js.Consumer(b.ctx, topology.StreamOutcomes, topology.ConsumerClassifier)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := c.Info(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	return info
}

// waitIdle waits until the classifier consumer has had every outcome
// delivered and acknowledged.
func (b *clsBench) waitIdle() {
	b.t.Helper()
	b.poll("classifier consumer idle", func() bool {
		info := b.consumerInfo()
		return info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= b.streamInfo(topology.StreamOutcomes).State.LastSeq
	})
}

func (b *clsBench) streamInfo(name string) *jetstream.StreamInfo {
	b.t.Helper()
	s, err := b.js.Stream(b.ctx, name)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(b.ctx)
	if err != nil {
		b.t.Fatal(err)
	}
	return info
}

func (b *clsBench) count(stream string) int { return int(b.streamInfo(stream).State.Msgs) }

// read returns every message of a stream, in order.
func (b *clsBench) read(stream string) []jetstream.Msg {
	b.t.Helper()
	n := b.count(stream)
	if n == 0 {
		return nil
	}
	s, err := b.js.Stream(b.ctx, stream)
	if err != nil {
		b.t.Fatal(err)
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

// classified reads FAILBUS_CLASSIFIED and checks every message on the way:
// it decodes, sits on the subject of its provider and class, and carries
// the Nats-Msg-Id derived from its outcome. It returns the count of
// classifications per outcome id.
func (b *clsBench) classified() map[string]int {
	b.t.Helper()
	ids := map[string]int{}
	for _, m := range b.read(topology.StreamClassified) {
		c, err := events.DecodeAs[*events.Classification](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			b.t.Fatalf("classification does not decode: %v", err)
		}
		if want := events.ClassifiedSubject(c.Provider, c.Class); m.Subject() != want {
			b.t.Errorf("%s: subject %s, want %s", c.OutcomeID, m.Subject(), want)
		}
		if got, want := m.Headers().Get(nats.MsgIdHdr), msgid.Output(classifier.Name, c.OutcomeID, "0"); got != want {
			b.t.Errorf("%s: Nats-Msg-Id %q, want %q", c.OutcomeID, got, want)
		}
		ids[c.OutcomeID]++
	}
	return ids
}

// checkExactlyOnce fails unless every outcome has exactly one
// classification and nothing else was classified.
func (b *clsBench) checkExactlyOnce(outs []*events.Outcome) {
	b.t.Helper()
	if got := b.count(topology.StreamClassified); got != len(outs) {
		b.t.Errorf("FAILBUS_CLASSIFIED holds %d messages, want %d", got, len(outs))
	}
	ids := b.classified()
	if len(ids) != len(outs) {
		b.t.Errorf("%d distinct outcome ids classified, want %d", len(ids), len(outs))
	}
	for _, o := range outs {
		if ids[o.ID] != 1 {
			b.t.Errorf("outcome %s classified %d times, want 1", o.ID, ids[o.ID])
		}
	}
}

func TestClassifierThousandOutcomesExactlyOnceAndDuplicatesProduceNothing(t *testing.T) {
	t.Parallel()
	b := clsSetup(t)
	outs := clsOutcomes("call", 1000)
	for _, ack := range b.publishOutcomes(outs) {
		if ack.Duplicate {
			t.Fatalf("first publish of seq %d acknowledged as a duplicate", ack.Sequence)
		}
	}
	reg := prometheus.NewRegistry()
	r := b.startClassifier(reg)
	b.poll("runner healthy", func() bool { return r.Healthy() == nil })
	b.waitIdle()
	b.checkExactlyOnce(outs)
	if got := b.count(topology.StreamDLQ); got != 0 {
		t.Errorf("dead letters: %d, want 0", got)
	}
	classes := map[string]float64{}
	total := 0.0
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "failbus_classifier_classified_total" {
			for _, m := range mf.GetMetric() {
				classes[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
				total += m.GetCounter().GetValue()
			}
		}
	}
	if total != 1000 || len(classes) < 3 {
		t.Errorf("failbus_classifier_classified_total: %v (total %v), want 1000 over several classes", classes, total)
	}

	// The same 1,000 again: JetStream acknowledges each as a duplicate and
	// stores nothing, so there is nothing to classify.
	for _, ack := range b.publishOutcomes(outs) {
		if !ack.Duplicate {
			t.Fatalf("republished outcome stored again at seq %d, want a duplicate ack", ack.Sequence)
		}
	}
	if got := b.count(topology.StreamOutcomes); got != 1000 {
		t.Errorf("FAILBUS_OUTCOMES holds %d after republishing, want 1000", got)
	}
	// A sentinel outcome after the duplicates: once it is classified and the
	// consumer is idle, everything before it has been seen.
	sentinel := clsOutcomes("sentinel", 1)
	b.publishOutcomes(sentinel)
	b.waitIdle()
	b.checkExactlyOnce(append(outs, sentinel...))
}

// TestClassifierCrashChild is not a test: it is the classifier process that
// TestClassifierStoppedMidBatchWithoutAckingThenRestarted kills. It handles
// outcomes until crashAfter of them, then hangs every handler (so nothing
// more is acknowledged) until it is killed.
func TestClassifierCrashChild(t *testing.T) {
	url := os.Getenv("FAILBUS_TEST_CLASSIFIER_CHILD")
	if url == "" {
		t.Skip("helper process of TestClassifierStoppedMidBatchWithoutAckingThenRestarted")
	}
	const crashAfter = 600
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	hang := make(chan struct{}) // never closed: the process is SIGKILLed
	cfg := clsRunnerConfig(nil)
	cfg.Middleware = []consumer.Middleware{func(next consumer.Handler) consumer.Handler {
		return func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
			if handled.Add(1) > crashAfter {
				<-hang
			}
			return next(ctx, m, out)
		}
	}}
	r, err := classifier.New(js, classifier.Config{Runner: cfg})
	if err != nil {
		t.Fatal(err)
	}
	t.Fatalf("child classifier returned: %v", r.Run(context.Background()))
}

// TestClassifierStoppedMidBatchWithoutAckingThenRestarted: a classifier
// process is SIGKILLed in the middle of 1,000 outcomes, with handlers in
// flight and fetched messages unacknowledged (some possibly with their
// classification already stored); a fresh classifier then finishes the
// work. FAILBUS_CLASSIFIED must hold exactly 1,000 classifications, one per
// outcome.
func TestClassifierStoppedMidBatchWithoutAckingThenRestarted(t *testing.T) {
	t.Parallel()
	b := clsSetup(t)
	// Redeliver unacknowledged outcomes after 2s instead of the topology's
	// 30s first backoff step, so the test does not wait it out.
	stream, cc, ok := topology.Consumer(topology.ConsumerClassifier)
	if !ok {
		t.Fatal("no classifier consumer in the topology")
	}
	cc.AckWait, cc.BackOff = 2*time.Second, nil
	if _, err := b.js.UpdateConsumer(b.ctx, stream, cc); err != nil {
		t.Fatalf("shorten AckWait: %v", err)
	}
	outs := clsOutcomes("crash", 1000)
	b.publishOutcomes(outs)

	child := exec.CommandContext(b.ctx, os.Args[0], "-test.run=^TestClassifierCrashChild$")
	child.Env = append(os.Environ(), "FAILBUS_TEST_CLASSIFIER_CHILD="+b.srv.ClientURL())
	var childOut bytes.Buffer // exec serialises writes when Stdout == Stderr; read after Wait
	child.Stdout, child.Stderr = &childOut, &childOut
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	b.poll("the first classifier to be in mid-batch", func() bool {
		return b.count(topology.StreamClassified) >= 500
	})
	if err := child.Process.Kill(); err != nil { // SIGKILL: no drain, no acks
		t.Fatal(err)
	}
	_ = child.Wait()
	if strings.Contains(childOut.String(), "--- FAIL") {
		t.Fatalf("child classifier failed before the kill:\n%s", childOut.String())
	}
	info := b.consumerInfo()
	t.Logf("killed with %d classifications stored, %d outcomes acknowledged (ack floor), %d delivered but unacknowledged",
		b.count(topology.StreamClassified), info.AckFloor.Stream, info.NumAckPending)
	if info.NumAckPending == 0 {
		t.Fatal("nothing was in flight when the classifier was killed; the test proves nothing")
	}

	reg := prometheus.NewRegistry()
	b.startClassifier(reg)
	b.waitIdle()
	b.checkExactlyOnce(outs)
	if got := b.count(topology.StreamDLQ); got != 0 {
		t.Errorf("dead letters: %d, want 0", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "failbus_consumer_redeliveries_total", "failbus_consumer_outputs_published_total":
			for _, m := range mf.GetMetric() {
				t.Logf("restarted classifier: %s%v = %v", mf.GetName(), m.GetLabel(), m.GetCounter().GetValue())
			}
		}
	}
}

// clsMsgpack encodes any value as msgpack, for junk no failbus type would
// produce.
func clsMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestClassifierDeadLettersMalformedAndKeepsConsuming(t *testing.T) {
	t.Parallel()
	b := clsSetup(t)
	decision := &events.Decision{OutcomeID: "x", Agent: "a", Action: events.ActionRetry}
	decisionData, decisionHdr, err := events.Encode(decision)
	if err != nil {
		t.Fatal(err)
	}
	junk := []struct {
		name   string
		hdr    nats.Header
		data   []byte
		reason string // substring of the dead letter's reason
	}{
		{"not msgpack", nil, []byte("hello, I am not msgpack"), "not a failbus message"},
		{"JSON instead of msgpack", nil, []byte(`{"id":"j-1","agent":"a","provider":"openai"}`), "not a msgpack map"},
		{"empty payload", nil, []byte{}, "empty payload"},
		{"no id", nil, clsMsgpack(t, map[string]any{"agent": "a", "provider": "openai", "status": 500}), `field "id": required`},
		{"no provider", nil, clsMsgpack(t, map[string]any{"id": "np-1", "agent": "a"}), `field "provider": required`},
		{"unreadable time", nil, clsMsgpack(t, map[string]any{"id": "t-1", "agent": "a", "provider": "openai", "at": "next tuesday-ish"}), `field "at"`},
		{"time of the wrong type", nil, clsMsgpack(t, map[string]any{"id": "t-2", "agent": "a", "provider": "openai", "at": true}), `field "at"`},
		{"another schema on the outcome subject", decisionHdr, decisionData, "names a decision, but failbus.outcome.openai.junk-7 carries outcome"},
		{"a newer outcome version", nats.Header{events.HeaderSchema: []string{"outcome/99"}}, clsMsgpack(t, map[string]any{"id": "v-1"}), "newer than this reader"},
	}
	good := clsOutcomes("good", 60)
	reg := prometheus.NewRegistry()
	r := b.startClassifier(reg)
	b.poll("runner healthy", func() bool { return r.Healthy() == nil })

	// Junk interleaved with good outcomes, and a segment boundary, which the
	// classifier acknowledges without classifying.
	for i, j := range junk {
		b.publishOutcomes(good[i*6 : i*6+3])
		b.publishRaw(events.OutcomeSubject("openai", "junk-"+fmt.Sprint(i)), j.hdr, j.data)
		b.publishOutcomes(good[i*6+3 : i*6+6])
	}
	boundary := &events.Boundary{Agent: "a", Session: "s", Segment: 2, Reason: "compaction"}
	data, hdr, err := events.Encode(boundary)
	if err != nil {
		t.Fatal(err)
	}
	b.publishRaw(events.SegmentSubject("a"), hdr, data)
	b.publishOutcomes(good[len(junk)*6:])
	b.waitIdle()

	b.checkExactlyOnce(good)
	dlqs := b.read(topology.StreamDLQ)
	if len(dlqs) != len(junk) {
		t.Fatalf("dead letters: %d, want %d", len(dlqs), len(junk))
	}
	bySubject := map[string]*events.DeadLetter{}
	for _, m := range dlqs {
		if m.Subject() != events.DLQSubject(classifier.Name) {
			t.Errorf("dead letter on %s, want %s", m.Subject(), events.DLQSubject(classifier.Name))
		}
		dl, err := events.DecodeAs[*events.DeadLetter](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			t.Fatalf("dead letter does not decode: %v", err)
		}
		bySubject[dl.Subject] = dl
	}
	for i, j := range junk {
		t.Run(j.name, func(t *testing.T) {
			dl := bySubject[events.OutcomeSubject("openai", "junk-"+fmt.Sprint(i))]
			if dl == nil {
				t.Fatal("not dead-lettered")
			}
			if !strings.Contains(dl.Reason, j.reason) {
				t.Errorf("reason %q, want it to contain %q", dl.Reason, j.reason)
			}
			if string(dl.Data) != string(j.data) || dl.Service != classifier.Name || dl.Stream != topology.StreamOutcomes || dl.Seq == 0 {
				t.Errorf("dead letter %+v does not keep the original", dl)
			}
		})
	}
}
