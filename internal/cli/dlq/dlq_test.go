package dlq

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/requeue"
	"github.com/failbus/failbus/internal/servicespec"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// hook is a webhook receiver that fails until fixed and counts what it
// accepted per dedupe key.
type hook struct {
	srv     *httptest.Server
	failing atomic.Bool
	mu      sync.Mutex
	got     map[string]int
	refused int
}

func newHook(t *testing.T) *hook {
	h := &hook{got: map[string]int{}}
	h.failing.Store(true)
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n struct {
			DedupeKey string `json:"dedupe_key"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &n)
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.failing.Load() {
			h.refused++
			http.Error(w, "relay unreachable", http.StatusBadGateway)
			return
		}
		h.got[n.DedupeKey]++
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) count(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.got[key]
}

// dlqCmd runs `failbus dlq args...` and returns its exit code and output.
func dlqCmd(t *testing.T, url string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append(args, "--server", url), nil, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// streamMsgs returns every message stored on subject in stream.
func streamMsgs(t *testing.T, ctx context.Context, js jetstream.JetStream, stream, subject string) []jetstream.Msg {
	t.Helper()
	var out []jetstream.Msg
	err := watch.Read(ctx, js, watch.Config{Stream: stream, Filters: []string{subject}}, func(m jetstream.Msg) error {
		out = append(out, m)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRequeueADeadLetterWhoseCauseWasFixed is the acceptance story: the
// notifier dead-letters a request its webhook refused past the sink's
// retry budget; the webhook is fixed; `failbus dlq requeue` puts the
// request back and it is delivered exactly once; requeueing it again
// publishes nothing.
func TestRequeueADeadLetterWhoseCauseWasFixed(t *testing.T) {
	t.Parallel()
	h := newHook(t)
	pol, err := policy.Parse(fmt.Appendf(nil, `
notify:
  sinks:
    - name: ops
      type: webhook
      url: %s
      max_attempts: 2
      retry_initial: 10ms
      retry_max: 20ms
`, h.srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	bus, err := devbus.Start(devbus.Options{
		Server: embedded.Options{Dir: t.TempDir()}, Policy: pol,
		Specs: []daemon.Spec{servicespec.Notifier()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := bus.Srv.ClientURL()
	js := bus.JS

	data, hdr, err := events.Encode(&events.Notification{DedupeKey: "provider-down:openai", Severity: events.SeverityCritical, Title: "openai is down"})
	if err != nil {
		t.Fatal(err)
	}
	hdr.Set(nats.MsgIdHdr, "req-1")
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.NotifySubject(events.SeverityCritical), Header: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
	var letters []Letter
	clitest.WaitFor(t, "the refused request dead-lettered", func() bool {
		letters, err = List(ctx, js, Select{Services: []string{"notifier"}})
		return err == nil && len(letters) == 1
	})
	seq := letters[0].Seq
	if !strings.Contains(letters[0].DL.Reason, "502") {
		t.Errorf("dead letter reason %q: want the sink's 502", letters[0].DL.Reason)
	}

	code, out, errOut := dlqCmd(t, url, "ls")
	if code != 0 || !strings.Contains(out, "notifier") || !strings.Contains(out, events.NotifySubject(events.SeverityCritical)) || !strings.Contains(out, "502") {
		t.Errorf("dlq ls: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = dlqCmd(t, url, "show", strconv.FormatUint(seq, 10))
	if code != 0 || !strings.Contains(out, `"dedupe_key": "provider-down:openai"`) || !strings.Contains(out, "requeued     no") {
		t.Errorf("dlq show: exit %d, want the request decoded and not requeued:\n%s", code, out)
	}

	h.failing.Store(false) // the cause is fixed
	code, out, errOut = dlqCmd(t, url, "requeue", strconv.FormatUint(seq, 10))
	if code != 0 || !strings.Contains(out, "requeued → failbus.notify.critical") {
		t.Fatalf("dlq requeue: exit %d\n%s%s", code, out, errOut)
	}
	clitest.WaitFor(t, "the requeued request delivered", func() bool { return h.count("provider-down:openai") >= 1 })
	clitest.WaitFor(t, "the notifier caught up", func() bool {
		ok, err := embedded.CaughtUp(ctx, js, topology.StreamNotify, topology.ConsumerNotifier)
		return err == nil && ok
	})

	// Again, by the same or another operator: nothing is published.
	code, out, errOut = dlqCmd(t, url, "requeue", strconv.FormatUint(seq, 10))
	if code != 0 || !strings.Contains(out, "already requeued") {
		t.Errorf("second requeue: exit %d, want 'already requeued'\n%s%s", code, out, errOut)
	}
	code, out, _ = dlqCmd(t, url, "requeue", "--all")
	if code != 0 || out != "" {
		t.Errorf("requeue --all after everything was requeued: exit %d, printed %q; want nothing to do", code, out)
	}
	msgs := streamMsgs(t, ctx, js, topology.StreamNotify, events.NotifySubject(events.SeverityCritical))
	if len(msgs) != 2 {
		t.Fatalf("%d messages on the subject, want the original and one copy", len(msgs))
	}
	cp := msgs[1].Headers()
	wantFrom := requeue.From(topology.StreamDLQ, seq)
	if cp.Get(requeue.HeaderFrom) != wantFrom || cp.Get(requeue.HeaderFor) != "notifier" ||
		cp.Get(requeue.HeaderMsgID) != "req-1" || cp.Get(nats.MsgIdHdr) != requeue.MsgID(topology.StreamDLQ, seq) {
		t.Errorf("copy headers %v: want requeued from %s, for notifier, original id req-1", cp, wantFrom)
	}
	if !bytes.Equal(msgs[1].Data(), data) {
		t.Error("the copy's payload is not the original bytes")
	}
	if got := h.count("provider-down:openai"); got != 1 {
		t.Errorf("webhook received the notification %d times, want once", got)
	}
	code, out, _ = dlqCmd(t, url, "ls", "--json")
	var ln listLine
	if code != 0 || json.Unmarshal([]byte(out), &ln) != nil || !ln.Requeued || ln.Requeue.Seq != 2 || ln.Requeue.Runs != 1 {
		t.Errorf("dlq ls --json after the requeue: exit %d %s; want it marked requeued to seq 2", code, out)
	}
}

// bench is a bus with the topology and no services: requeued copies stay
// where they are stored, to be counted.
type bench struct {
	*bustest.Bus
	t *testing.T
}

// original is the outcome the bench dead-letters.
func (b *bench) original(id string) ([]byte, nats.Header) {
	data, hdr, err := events.Encode(&events.Outcome{ID: id, Agent: "bot", Provider: "openai", Status: 500})
	if err != nil {
		b.t.Fatal(err)
	}
	hdr.Set(nats.MsgIdHdr, id)
	return data, hdr
}

// deadLetter stores a dead letter of the classifier for outcome id and
// returns its sequence and the original's bytes.
func (b *bench) deadLetter(id string) (uint64, []byte) {
	b.t.Helper()
	data, hdr := b.original(id)
	return b.store(&events.DeadLetter{At: events.At(time.Now()), Service: "classifier", Reason: "decode: test",
		Subject: events.OutcomeSubject("openai", "bot"), Headers: hdr, Data: data}, "dlq:classifier:"+id), data
}

func (b *bench) store(dl any, msgID string) uint64 {
	b.t.Helper()
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	if err := enc.Encode(dl); err != nil {
		b.t.Fatal(err)
	}
	h := nats.Header{}
	h.Set(events.HeaderSchema, events.SchemaDeadLetter+"/1")
	h.Set(events.HeaderContentType, events.ContentTypeMsgpack)
	h.Set(nats.MsgIdHdr, msgID)
	ack, err := b.JS.PublishMsg(b.Ctx, &nats.Msg{Subject: events.DLQSubject("classifier"), Header: h, Data: buf.Bytes()})
	if err != nil {
		b.t.Fatal(err)
	}
	return ack.Sequence
}

// copies are the requeued copies of the dead letter at seq stored on the
// outcome subject.
func (b *bench) copies(seq uint64) []jetstream.Msg {
	var out []jetstream.Msg
	for _, m := range streamMsgs(b.t, b.Ctx, b.JS, topology.StreamOutcomes, events.OutcomeSubject("openai", "bot")) {
		if m.Headers().Get(requeue.HeaderFrom) == requeue.From(topology.StreamDLQ, seq) {
			out = append(out, m)
		}
	}
	return out
}

var errCrash = errors.New("crash")

// crashAt is a hook that stops a requeue after step.
func crashAt(step string) func(string) error {
	return func(s string) error {
		if s == step {
			return errCrash
		}
		return nil
	}
}

// TestRequeueOnce: whatever happens between the steps — operators racing,
// a crash after the claim, a crash after the publish, the finishing run
// coming after the duplicate window — one copy is stored and the mark
// says where.
func TestRequeueOnce(t *testing.T) {
	t.Parallel()
	b := &bench{Bus: bustest.Start(t, 2*time.Minute), t: t}
	q := func(by string) *Requeuer { return &Requeuer{JS: b.JS, By: by} }

	t.Run("four operators at once", func(t *testing.T) {
		seq, _ := b.deadLetter("race")
		var wg sync.WaitGroup
		results := make([]*Result, 4)
		errs := make([]error, 4)
		for i := range results {
			wg.Go(func() { results[i], errs[i] = q(fmt.Sprint("op", i)).Requeue(b.Ctx, seq) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("operator %d: %v", i, err)
			}
		}
		copies := b.copies(seq)
		if len(copies) != 1 {
			t.Fatalf("%d copies stored, want 1", len(copies))
		}
		md, _ := copies[0].Metadata()
		for i, r := range results {
			if r.Seq != md.Sequence.Stream {
				t.Errorf("operator %d reports the copy at %d, it is at %d", i, r.Seq, md.Sequence.Stream)
			}
		}
		l, err := Get(b.Ctx, b.JS, "", seq)
		if err != nil || l.Mark == nil || l.Mark.State != MarkRequeued || l.Mark.Seq != md.Sequence.Stream {
			t.Errorf("mark %+v (%v), want requeued to %d", l.Mark, err, md.Sequence.Stream)
		}
	})

	t.Run("crash after the claim, then requeue again", func(t *testing.T) {
		seq, data := b.deadLetter("claimed")
		crashing := q("first")
		crashing.hook = crashAt("claimed")
		if _, err := crashing.Requeue(b.Ctx, seq); !errors.Is(err, errCrash) {
			t.Fatalf("first run: %v, want the crash", err)
		}
		if n := len(b.copies(seq)); n != 0 {
			t.Fatalf("%d copies after a crash before publishing", n)
		}
		l, _ := Get(b.Ctx, b.JS, "", seq)
		if l.Mark == nil || l.Mark.State != MarkClaimed {
			t.Fatalf("mark after the crash: %+v, want claimed", l.Mark)
		}
		res, err := q("second").Requeue(b.Ctx, seq)
		if err != nil || !res.Resumed || res.Found || res.Mark.Runs != 2 || res.Mark.By != "second" {
			t.Fatalf("second run: %+v %v; want it to resume and publish", res, err)
		}
		copies := b.copies(seq)
		if len(copies) != 1 || !bytes.Equal(copies[0].Data(), data) {
			t.Fatalf("%d copies, want 1 with the original bytes", len(copies))
		}
	})

	t.Run("crash after the publish, finished after the duplicate window", func(t *testing.T) {
		// The original lived on a stream that forgets message ids after
		// 100ms, so only the search for the copy can keep the finishing
		// run from publishing another.
		const stream, subject = "TEST_SHORT_WINDOW", "test.short.window"
		if _, err := b.JS.CreateStream(b.Ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"test.short.>"}, Duplicates: 100 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		data, hdr := b.original("published")
		seq := b.store(&events.DeadLetter{At: events.At(time.Now()), Service: "tester", Reason: "test", Subject: subject, Headers: hdr, Data: data}, "dlq:tester:published")
		copies := func() int {
			n := 0
			for _, m := range streamMsgs(t, b.Ctx, b.JS, stream, subject) {
				if m.Headers().Get(requeue.HeaderFrom) == requeue.From(topology.StreamDLQ, seq) {
					n++
				}
			}
			return n
		}
		crashing := q("first")
		crashing.hook = crashAt("published")
		if _, err := crashing.Requeue(b.Ctx, seq); !errors.Is(err, errCrash) {
			t.Fatalf("first run: %v, want the crash", err)
		}
		if n := copies(); n != 1 {
			t.Fatalf("%d copies after the publish, want 1", n)
		}
		probe := "test.short.probe"
		clitest.WaitFor(t, "the stream to forget the copy's message id", func() bool {
			ack, err := b.JS.PublishMsg(b.Ctx, &nats.Msg{Subject: probe, Header: nats.Header{nats.MsgIdHdr: {requeue.MsgID(topology.StreamDLQ, seq)}}, Data: []byte{0x80}})
			return err == nil && !ack.Duplicate
		})
		res, err := q("second").Requeue(b.Ctx, seq)
		if err != nil || !res.Resumed || !res.Found {
			t.Fatalf("second run: %+v %v; want it to find the stored copy", res, err)
		}
		if n := copies(); n != 1 {
			t.Errorf("%d copies, want 1", n)
		}
		res, err = q("third").Requeue(b.Ctx, seq)
		if err != nil || !res.Already {
			t.Errorf("third run: %+v %v, want already requeued", res, err)
		}
	})
}

// TestRequeueOfADeadLetterThatKeptOnlyAPrefix: the whole input is read
// back from where it is stored and checked against the recorded hash; when
// it is gone, requeue says so and publishes nothing.
func TestRequeueOfADeadLetterThatKeptOnlyAPrefix(t *testing.T) {
	t.Parallel()
	b := &bench{Bus: bustest.Start(t, 2*time.Minute), t: t}
	stored := func(id string) (uint64, []byte) {
		data, hdr := b.original(id)
		ack, err := b.JS.PublishMsg(b.Ctx, &nats.Msg{Subject: events.OutcomeSubject("openai", "bot"), Header: hdr, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		return ack.Sequence, data
	}
	truncated := func(id string, origSeq uint64, data []byte) uint64 {
		sum := sha256.Sum256(data)
		// The shape pkg/consumer writes when the input would not fit whole.
		return b.store(&events.DeadLetter{At: events.At(time.Now()), Service: "classifier", Reason: "too big",
			Subject: events.OutcomeSubject("openai", "bot"), Stream: topology.StreamOutcomes, Seq: origSeq, Data: data[:8],
			DataLen: len(data), DataSHA256: hex.EncodeToString(sum[:]), Truncated: true}, "dlq:classifier:"+id)
	}

	origSeq, data := stored("big")
	seq := truncated("big", origSeq, data)
	code, out, _ := dlqCmd(t, b.Srv.ClientURL(), "show", strconv.FormatUint(seq, 10))
	if code != 0 || !strings.Contains(out, fmt.Sprintf("kept 8 of %d bytes", len(data))) || !strings.Contains(out, `"id": "big"`) {
		t.Errorf("dlq show of a truncated dead letter: exit %d, want the whole input read back:\n%s", code, out)
	}
	res, err := (&Requeuer{JS: b.JS, By: "op"}).Requeue(b.Ctx, seq)
	if err != nil {
		t.Fatal(err)
	}
	copies := b.copies(seq)
	if len(copies) != 1 || !bytes.Equal(copies[0].Data(), data) || res.Seq == origSeq {
		t.Fatalf("%d copies; want one with the whole original bytes", len(copies))
	}

	goneSeq, goneData := stored("gone")
	seq = truncated("gone", goneSeq, goneData)
	s, err := b.JS.Stream(b.Ctx, topology.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMsg(b.Ctx, goneSeq); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Requeuer{JS: b.JS, By: "op"}).Requeue(b.Ctx, seq); !errors.Is(err, ErrOriginalGone) {
		t.Errorf("requeue with the input gone: %v, want ErrOriginalGone", err)
	}
	if n := len(b.copies(seq)); n != 0 {
		t.Errorf("%d copies of a dead letter whose input is gone", n)
	}
	l, _ := Get(b.Ctx, b.JS, "", seq)
	if l.Mark != nil {
		t.Errorf("a requeue that could not start left a mark: %+v", l.Mark)
	}
}

func TestDLQUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{nil, 2, "Usage: failbus dlq"},
		{[]string{"nope"}, 2, `unknown subcommand "nope"`},
		{[]string{"show"}, 2, "show needs the sequence"},
		{[]string{"requeue"}, 2, "requeue needs sequences, or --all"},
		{[]string{"requeue", "3", "--all"}, 2, "not both"},
		{[]string{"show", "x"}, 2, `"x" is not a dead letter's sequence`},
		{[]string{"ls", "--since", "1h", "--start-seq", "3"}, 2, "exclude each other"},
	}
	for _, tc := range tests {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, nil, &stdout, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("dlq %v: exit %d, stderr %q; want %d and %q", tc.args, code, stderr.String(), tc.code, tc.stderr)
		}
	}
}

// TestRequeueOfAnInputTooBigToKeepWhole: the classifier dead-letters an
// input close to the server's max_payload; the dead letter keeps a prefix
// (pkg/consumer), and requeue republishes the whole input read back from
// its stream.
func TestRequeueOfAnInputTooBigToKeepWhole(t *testing.T) {
	t.Parallel()
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}, Specs: []daemon.Spec{servicespec.Classifier()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := bytes.Repeat([]byte("x"), int(bus.JS.Conn().MaxPayload())-4096)
	if _, err := bus.JS.Publish(ctx, events.OutcomeSubject("openai", "bot"), big); err != nil {
		t.Fatal(err)
	}
	var letters []Letter
	clitest.WaitFor(t, "the big input dead-lettered", func() bool {
		letters, err = List(ctx, bus.JS, Select{})
		return err == nil && len(letters) == 1
	})
	l := letters[0]
	if !l.Whole.Truncated || l.Whole.Len != len(big) || len(l.DL.Data) >= len(big) {
		t.Fatalf("dead letter keeps %d bytes, whole %+v: want a prefix of the %d", len(l.DL.Data), l.Whole, len(big))
	}
	res, err := (&Requeuer{JS: bus.JS, By: "op"}).Requeue(ctx, l.Seq)
	if err != nil {
		t.Fatal(err)
	}
	s, err := bus.JS.Stream(ctx, res.Stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, res.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Data, big) {
		t.Errorf("the copy holds %d bytes, want the whole %d-byte input", len(m.Data), len(big))
	}
}
