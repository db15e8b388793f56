package events_test

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// hotMessages are the three types every outcome crosses the bus as, as the
// services write them (wirecodec.go encodes and decodes them).
func hotMessages() map[string]events.Message {
	when := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	return map[string]events.Message{
		"outcome": sample(),
		"classification": &events.Classification{OutcomeID: "o-1", At: events.At(when), Agent: "agent-17", Provider: "openai", Model: "gpt", Profile: "key-1",
			Class: events.ClassRateLimit, Retryable: true, Scope: events.ScopeProfile, Rule: "status-429", Evidence: []string{"status 429", "retry-after-ms: 1500"},
			Hints: &events.RetryHints{AfterMS: 1500, Source: "retry-after-ms"}, Session: "s-3", Turn: 7, Step: 1},
		"decision": &events.Decision{OutcomeID: "o-1", At: events.At(when), Agent: "agent-17", Action: events.ActionRetry,
			Reason: "rate_limit: retry 1 of 10 after 1.5s (retry-after)", DelayMS: 1500, DueAt: events.At(when.Add(1500 * time.Millisecond)), Retry: 1, RetryID: "r-0123456789abcdef"},
	}
}

// BenchmarkMarshal is the encoding every stored output pays (a decision, a
// classification): allocations per message show here with -benchmem.
func BenchmarkMarshal(b *testing.B) {
	for name, m := range hotMessages() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := events.Marshal(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecode is what every consumed input pays: the limits scan
// (CheckMsgpack) and the decoding. Allocations per message show here with
// -benchmem.
func BenchmarkDecode(b *testing.B) {
	subjects := map[string]string{
		"outcome":        events.OutcomeSubject("my-gateway", "agent/1"),
		"classification": events.ClassifiedSubject("openai", events.ClassRateLimit),
		"decision":       events.DecisionSubject("agent-17"),
	}
	for name, m := range hotMessages() {
		data, hdr, err := events.Encode(m)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := events.Decode(subjects[name], hdr, data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	data, _, err := events.Encode(sample())
	if err != nil {
		b.Fatal(err)
	}
	b.Run("check only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := events.CheckMsgpack(data, events.Limits{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Marshal reuses its encoders and their buffers: what it returned must
// stay as it was when later calls, on any goroutine, encode other
// messages.
func TestMarshalResultsDoNotShareTheEncodersBuffer(t *testing.T) {
	first := &events.Decision{OutcomeID: "o-1", Agent: "a", Action: events.ActionGiveUp, Reason: "first"}
	want, err := events.Marshal(first)
	if err != nil {
		t.Fatal(err)
	}
	kept := string(want)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				d := &events.Decision{OutcomeID: fmt.Sprintf("o-%d-%d", i, j), Agent: "b", Action: events.ActionRetry, Reason: strings.Repeat("x", j)}
				if _, err := events.Marshal(d); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if string(want) != kept {
		t.Fatalf("a Marshal result changed after later calls")
	}
	var back events.Decision
	if err := msgpack.Unmarshal(want, &back); err != nil || back.Reason != "first" {
		t.Fatalf("decoded %+v (%v), want the first decision", back, err)
	}
}

// loose is a record type of another package whose encoder interns a
// string and turns compact integers off for itself: neither may leak into
// the next message Marshal encodes with the same pooled encoder.
type loose struct {
	Name string `msgpack:"name,intern"`
}

func (*loose) SchemaName() string { return "test_loose" }
func (*loose) Validate() error    { return nil }

func (l *loose) EncodeMsgpack(enc *msgpack.Encoder) error {
	enc.UseCompactInts(false)
	type plain loose
	return enc.Encode((*plain)(l))
}

func TestMarshalStartsEachMessageFromAFreshEncoder(t *testing.T) {
	d := &events.Decision{OutcomeID: "o-1", Agent: "a", Action: events.ActionRetry, DelayMS: 5, Retry: 1, RetryID: "r-1"}
	want, err := events.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	l := &loose{Name: "hello"}
	first, err := events.Marshal(l)
	if err != nil {
		t.Fatal(err)
	}
	// Without -race the pool hands the same encoder back every time
	// on this goroutine; under -race it may drop it, which only makes
	// the test easier to pass.
	for range 20 {
		again, err := events.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, first) {
			t.Fatalf("the same interned record encoded %x, then %x (a dictionary kept from the call before)", first, again)
		}
		var back loose
		if err := msgpack.Unmarshal(again, &back); err != nil || back.Name != "hello" {
			t.Fatalf("decoded %+v, %v", back, err)
		}
		got, err := events.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("a decision after a record that turned compact integers off: %x, want %x", got, want)
		}
	}
}
