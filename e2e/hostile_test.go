package e2e

// Acceptance of the hostile-input bounds on a real embedded nats-server: no
// message takes the classifier down, each hostile payload is a dead letter
// naming the limit it broke or a sane classification, good outcomes keep
// being classified in between, the process's peak RSS stays under a stated
// bound, an input at max_payload is dead-lettered once with a bounded
// record, the same outcome id is classified once whatever its Nats-Msg-Id,
// and a deleted durable comes back by itself.

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/service/classifier"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// hostileRSSBound is the peak resident set the test process (embedded
// nats-server with an 8 MiB max_payload, classifier, publisher and the
// test's own payloads) may reach while the hostile suite runs, from a reset
// high-water mark. Measured on a shared 2-core machine (go1.26, nats-server
// 2.15.2): 333-357 MiB, and 971-1098 MiB under -race, whose shadow memory
// multiplies every allocation. Before the pre-scan, one 1 MB nested payload
// alone cost ~0.7 GB, and a 2 MB one killed the process.
var hostileRSSBound int64 = 512 << 20

func init() {
	if raceDetector {
		hostileRSSBound = 1536 << 20
	}
}

// hostileBuilder builds msgpack payloads by hand, the way an attacker
// would: nesting, counts and lengths that lie.
type hostileBuilder struct{}

func (hostileBuilder) str(s string) []byte {
	b, _ := msgpack.Marshal(s)
	return b
}

func (hostileBuilder) raw(v any) []byte {
	b, err := msgpack.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// mapHeader starts a msgpack map of n entries.
func (hostileBuilder) mapHeader(n int) []byte {
	switch {
	case n < 16:
		return []byte{0x80 | byte(n)}
	case n < 1<<16:
		return binary.BigEndian.AppendUint16([]byte{0xde}, uint16(n))
	}
	return binary.BigEndian.AppendUint32([]byte{0xdf}, uint32(n))
}

// nested is depth arrays (or maps with key "k") around nil.
func (hostileBuilder) nested(depth int, maps bool) []byte {
	level := []byte{0x91}
	if maps {
		level = []byte{0x81, 0xa1, 'k'}
	}
	return append(bytes.Repeat(level, depth), 0xc0)
}

// outcome is an outcome map with id, agent and provider, plus the raw
// value under key (nothing when key is "").
func (h hostileBuilder) outcome(id, key string, value []byte) []byte {
	var b bytes.Buffer
	n := 3
	if key != "" {
		n++
	}
	b.Write(h.mapHeader(n))
	for _, kv := range [][2]string{{"id", id}, {"agent", "hostile"}, {"provider", "p"}} {
		if kv[0] == key {
			continue
		}
		b.Write(h.str(kv[0]))
		b.Write(h.str(kv[1]))
	}
	if key == "provider" || key == "id" || key == "agent" {
		b.Write(h.str("status"))
		b.Write(h.raw(500))
	}
	if key != "" {
		b.Write(h.str(key))
		b.Write(value)
	}
	return b.Bytes()
}

// manyHeaders is a headers map of n entries with distinct 4-character
// names (6 bytes an entry with an empty value: a million fit in 8 MiB).
func (h hostileBuilder) manyHeaders(n int, value string) []byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	var b bytes.Buffer
	b.Write(h.mapHeader(n))
	v := h.str(value)
	for i := range n {
		b.Write([]byte{0xa4, alphabet[i>>18&63], alphabet[i>>12&63], alphabet[i>>6&63], alphabet[i&63]})
		b.Write(v)
	}
	return b.Bytes()
}

// hostileCase is one payload and what must become of it.
type hostileCase struct {
	name string
	data []byte
	// reason is a substring of the dead letter's reason; empty means the
	// payload is valid and must be classified.
	reason string
}

func hostileCases(maxPayload int) []hostileCase {
	var h hostileBuilder
	const depthReason = "nesting depth exceeds the limit of 64"
	id := func(i int) string { return fmt.Sprintf("hostile-%02d", i) }
	var cs []hostileCase
	add := func(name string, build func(id string) []byte, reason string) {
		cs = append(cs, hostileCase{name: name, data: build(id(len(cs))), reason: reason})
	}
	for _, depth := range []int{10_000, 100_000, 2_000_000} {
		for _, key := range []string{"at", "headers", "origin", "status", "body", "zz_unknown"} {
			add(fmt.Sprintf("%d nested arrays in %s", depth, key), func(id string) []byte {
				return h.outcome(id, key, h.nested(depth, false))
			}, `"`+key+`": `+depthReason)
		}
	}
	add("1M nested maps in origin", func(id string) []byte { return h.outcome(id, "origin", h.nested(1_000_000, true)) }, `"origin": `+depthReason)
	add("1M nested arrays in a header value", func(id string) []byte {
		return h.outcome(id, "headers", append(append(h.mapHeader(1), h.str("x")...), h.nested(1_000_000, false)...))
	}, `"headers": `+depthReason)
	add("8M nested arrays under an unknown key (the skip path)", func(id string) []byte {
		return h.outcome(id, "zz_unknown", h.nested(min(8_000_000, maxPayload-200), false))
	}, `"zz_unknown": `+depthReason)
	add("the whole payload nested 1M maps deep", func(string) []byte { return h.nested(1_000_000, true) }, depthReason)
	add("array32 claiming 4G elements", func(id string) []byte { return h.outcome(id, "body", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}) }, "4294967295 entries exceeds the limit")
	add("map16 claiming 4096 entries with 2 bytes left", func(id string) []byte { return h.outcome(id, "headers", []byte{0xde, 0x10, 0x00, 0xc0, 0xc0}) }, "truncated payload or lying length")
	add("str32 claiming 4 GB", func(id string) []byte { return h.outcome(id, "body", []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}) }, "string too long")
	add("str32 claiming 1 MB with 1 byte", func(id string) []byte { return h.outcome(id, "body", []byte{0xdb, 0x00, 0x10, 0x00, 0x00, 'x'}) }, "truncated payload or lying length")
	add("ext32 timestamp claiming 4 GB in at", func(id string) []byte { return h.outcome(id, "at", []byte{0xc9, 0xff, 0xff, 0xff, 0xff, 0xff}) }, "string too long")
	add("a map with 1M keys", func(id string) []byte { return h.outcome(id, "headers", h.manyHeaders(1_000_000, "")) }, "1000000 entries exceeds the limit of 65536")
	add("uint64 max status", func(id string) []byte { return h.outcome(id, "status", h.raw(uint64(math.MaxUint64))) }, `"status": integer 18446744073709551615 exceeds the limit`)
	add("uint64 max request_tokens", func(id string) []byte { return h.outcome(id, "request_tokens", h.raw(uint64(math.MaxUint64))) }, `"request_tokens": integer`)
	add("request_tokens 2^62", func(id string) []byte { return h.outcome(id, "request_tokens", h.raw(int64(1)<<62)) }, `"request_tokens": number out of range`)
	add("a msgpack timestamp in year 292277026596", func(id string) []byte { return h.outcome(id, "at", h.raw(time.Unix(math.MaxInt64/2, 0))) }, `"at": time out of range`)
	add("an id with CR LF (header injection)", func(string) []byte { return h.outcome("x", "id", h.str("a\r\nNats-Msg-Id: b")) }, `"id": control character`)
	add("a 100 kB provider name", func(id string) []byte { return h.outcome(id, "provider", h.str(strings.Repeat("p", 100_000))) }, `"provider": 100000 bytes exceed the limit of 512`)
	add("trailing bytes", func(id string) []byte { return append(h.outcome(id, "", nil), 0xc0, 0xc0) }, "trailing bytes after the message")
	add("a 5 MiB body (above the 4 MiB string limit)", func(id string) []byte {
		return h.outcome(id, "body", h.str(strings.Repeat("b", 5<<20)))
	}, `"body": value of 5242880 bytes exceeds the limit of 4194304`)
	add("a body at max_payload", func(id string) []byte {
		return h.outcome(id, "body", h.str(strings.Repeat("b", maxPayload-200)))
	}, "string too long")
	// Valid, if odd: these must be classified, not dead-lettered.
	add("a 3 MiB body", func(id string) []byte {
		return h.outcome(id, "body", h.str(strings.Repeat("upstream connect error ", (3<<20)/23)))
	}, "")
	add("headers filling max_payload (60 000 entries)", func(id string) []byte {
		return h.outcome(id, "headers", h.manyHeaders(60_000, strings.Repeat("v", (maxPayload-(1<<20))/60_000)))
	}, "")
	add("at in year 9999", func(id string) []byte { return h.outcome(id, "at", h.raw(int64(253402300799999))) }, "")
	add("63 nested arrays under an unknown key", func(id string) []byte { return h.outcome(id, "zz_unknown", h.nested(63, false)) }, "")
	return cs
}

// peakRSS resets the process's resident-set high-water mark (Linux) and
// returns a function that reads it. ok is false where /proc cannot do it.
func peakRSS() (read func() int64, ok bool) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return nil, false
	}
	return func() int64 {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return -1
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, found := strings.CutPrefix(line, "VmHWM:"); found {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				return kb << 10
			}
		}
		return -1
	}, true
}

// TestHostilePayloads publishes every hostile case between batches of good
// outcomes to a running classifier. It is not parallel: the RSS it measures
// is the process's.
func TestHostilePayloads(t *testing.T) {
	runtime.GC()
	readRSS, rssOK := peakRSS()
	start := time.Now()
	b := clsSetup(t)
	maxPayload := int(b.js.Conn().MaxPayload())
	cases := hostileCases(maxPayload)
	good := clsOutcomes("good", 5*(len(cases)+1))
	reg := prometheus.NewRegistry()
	// The classifier's own pull wait, not the other classifier tests'
	// 200 ms: nats.go's Fetch drops a delivery that reaches the process
	// more than the wait plus one second after the one before it, and a
	// starved -race process reading payloads of several MiB got there
	// (inputs delivered to a pull that had stopped listening, redelivered
	// after AckWait; see consumer.Config.FetchWait).
	rc := clsRunnerConfig(reg)
	rc.FetchWait = consumer.DefaultFetchWait
	r := b.startClassifierWith(rc)
	b.poll("runner healthy", func() bool { return r.Healthy() == nil })

	// One subject (a classifier lane) per case, all of agent "hostile",
	// whose records they are: the subject is the identity.
	subjectOf := func(i int) string { return events.OutcomeSubject(fmt.Sprintf("p%02d", i), "hostile") }
	for i, c := range cases {
		b.publishOutcomes(good[i*5 : i*5+5])
		b.publishRaw(subjectOf(i), nil, c.data) // the simplest agent: no headers at all
	}
	b.publishOutcomes(good[len(cases)*5:])
	b.waitIdle()
	elapsed := time.Since(start)

	// Every good outcome classified exactly once, hostile valid ones too.
	ids := b.classified()
	for _, o := range good {
		if ids[o.ID] != 1 {
			t.Errorf("good outcome %s classified %d times", o.ID, ids[o.ID])
		}
	}
	dls := map[string]*events.DeadLetter{}
	for _, m := range b.read(topology.StreamDLQ) {
		dl, err := events.DecodeAs[*events.DeadLetter](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			t.Fatalf("dead letter does not decode: %v", err)
		}
		if dls[dl.Subject] != nil {
			t.Errorf("%s dead-lettered twice", dl.Subject)
		}
		dls[dl.Subject] = dl
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dl := dls[subjectOf(i)]
			id := fmt.Sprintf("hostile-%02d", i)
			if c.reason == "" {
				if dl != nil {
					t.Fatalf("dead-lettered: %s", dl.Reason)
				}
				if ids[id] != 1 {
					t.Fatalf("classified %d times, want 1", ids[id])
				}
				return
			}
			if dl == nil {
				t.Fatalf("not dead-lettered (classified %d times)", ids[id])
			}
			if !strings.Contains(dl.Reason, c.reason) {
				t.Errorf("reason %q, want it to name %q", dl.Reason, c.reason)
			}
			if len(dl.Reason) > consumer.MaxReasonBytes {
				t.Errorf("reason of %d bytes", len(dl.Reason))
			}
			// Inputs above the 4 MiB string limit cannot be kept whole in a
			// record that must itself decode: a bounded prefix, the length
			// and hash, and where the whole input lies.
			truncated := len(c.data) > events.DefaultMaxString
			if dl.Truncated != truncated {
				t.Errorf("truncated %v, want %v", dl.Truncated, truncated)
			}
			if !truncated && !bytes.Equal(dl.Data, c.data) {
				t.Error("a dead letter that fits does not keep the original bytes")
			}
			sum := sha256.Sum256(c.data)
			if dl.DataLen != len(c.data) || dl.DataSHA256 != hex.EncodeToString(sum[:]) || dl.Stream != topology.StreamOutcomes || dl.Seq == 0 {
				t.Errorf("record: data_len %d (want %d), sha256 %s, %s/%d", dl.DataLen, len(c.data), dl.DataSHA256, dl.Stream, dl.Seq)
			}
			if truncated && len(dl.Data) > consumer.DefaultDeadLetterPrefix {
				t.Errorf("truncated record keeps %d bytes", len(dl.Data))
			}
		})
	}
	if n := len(dls); n != countDead(cases) {
		t.Errorf("%d dead letters, want %d", n, countDead(cases))
	}
	// Each input was settled once, by an ack or a dead letter: no delivery
	// loop (a nak, a failed store, a second dead letter would each be one
	// more settlement, or a result other than these two). A delivery that
	// never reached the runner (see above) is not a loop: the runner
	// settles its redelivery once, and the count of those is logged.
	settled := map[string]float64{}
	for _, res := range []string{"ack", "dead_letter", "retry", "error"} {
		settled[res] = counterValue(t, reg, "failbus_consumer_messages_total", map[string]string{"service": classifier.Name, "result": res})
	}
	if n := len(good) + len(cases); settled["ack"]+settled["dead_letter"] != float64(n) || settled["retry"]+settled["error"] != 0 {
		t.Errorf("inputs settled %v, want each of the %d once, by an ack or a dead letter", settled, n)
	}
	if got := counterValue(t, reg, "failbus_consumer_redeliveries_total", map[string]string{"service": classifier.Name}); got != 0 {
		t.Logf("%v redeliveries, each settled once", got)
	}
	if rssOK {
		peak := readRSS()
		t.Logf("%d hostile payloads (%d dead letters) among %d good outcomes in %v; peak RSS of the process %d MiB (bound %d MiB)",
			len(cases), len(dls), len(good), elapsed.Round(time.Millisecond), peak>>20, hostileRSSBound>>20)
		if peak > hostileRSSBound {
			t.Errorf("peak RSS %d MiB exceeds the stated bound of %d MiB", peak>>20, hostileRSSBound>>20)
		}
	}
}

func countDead(cs []hostileCase) (n int) {
	for _, c := range cs {
		if c.reason != "" {
			n++
		}
	}
	return n
}

// TestHostileSameIDWhateverTheHeader: an outcome published with its
// Nats-Msg-Id, without one (twice), and with two other ids is stored five
// times in FAILBUS_OUTCOMES (the stream deduplicates only by header) and
// classified once: the classification's id derives from the payload's id.
func TestHostileSameIDWhateverTheHeader(t *testing.T) {
	t.Parallel()
	b := clsSetup(t)
	o := clsOutcomes("same", 1)[0]
	data, hdr, err := events.Encode(o)
	if err != nil {
		t.Fatal(err)
	}
	subject := events.OutcomeSubject(o.Provider, o.Agent)
	for _, msgID := range []string{o.ID, "", "", "agent-retry-7", "other:" + o.ID} {
		h := nats.Header{}
		for k, v := range hdr {
			h[k] = v
		}
		if msgID != "" {
			h.Set(nats.MsgIdHdr, msgID)
		}
		b.publishRaw(subject, h, data)
	}
	if got := b.count(topology.StreamOutcomes); got != 5 {
		t.Fatalf("FAILBUS_OUTCOMES holds %d copies, want 5", got)
	}
	reg := prometheus.NewRegistry()
	r := b.startClassifier(reg)
	b.poll("runner healthy", func() bool { return r.Healthy() == nil })
	b.waitIdle()
	b.checkExactlyOnce([]*events.Outcome{o})
	if got := counterValue(t, reg, "failbus_consumer_outputs_published_total", map[string]string{"service": classifier.Name, "duplicate": "true"}); got != 4 {
		t.Errorf("%v classifications recognised as duplicates, want 4", got)
	}
}

// TestHostileDeletedDurableComesBack: an operator deletes the classifier's
// durable; the service recreates it within seconds and classifies what was
// published meanwhile, once.
func TestHostileDeletedDurableComesBack(t *testing.T) {
	t.Parallel()
	b := clsSetup(t)
	reg := prometheus.NewRegistry()
	r := b.startClassifier(reg)
	b.poll("runner healthy", func() bool { return r.Healthy() == nil })
	before := clsOutcomes("before", 20)
	b.publishOutcomes(before)
	b.waitIdle()

	if err := b.js.DeleteConsumer(b.ctx, topology.StreamOutcomes, topology.ConsumerClassifier); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	after := clsOutcomes("after", 20)
	b.publishOutcomes(after)
	b.poll("durable recreated", func() bool {
		_, err := b.js.Consumer(b.ctx, topology.StreamOutcomes, topology.ConsumerClassifier)
		return err == nil
	})
	back := time.Since(deleted)
	b.waitIdle()
	t.Logf("durable back %v after the deletion, its %d messages classified %v after it", back.Round(time.Millisecond), len(after), time.Since(deleted).Round(time.Millisecond))
	b.checkExactlyOnce(append(before, after...))
	if got := counterValue(t, reg, "failbus_consumer_recreated_total", map[string]string{"service": classifier.Name}); got != 1 {
		t.Errorf("failbus_consumer_recreated_total = %v, want 1", got)
	}
	// The next start applies the topology over the recreated durable
	// without calling it incompatible, and keeps its position.
	if err := topology.Apply(b.ctx, b.js, topology.Options{}); err != nil {
		t.Fatalf("Apply over the recreated durable: %v", err)
	}
	if info := b.consumerInfo(); info.NumPending != 0 {
		t.Errorf("after Apply the durable has %d pending: its position moved", info.NumPending)
	}
}

// counterValue reads one series of a counter from g (0 when absent).
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
