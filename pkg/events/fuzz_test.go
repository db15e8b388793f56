package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// FuzzDecode feeds arbitrary bytes and schema headers to the bus decoder: it
// must never panic, and whatever it accepts must be valid and re-encodable.
func FuzzDecode(f *testing.F) {
	good, _, _ := events.Encode(sample())
	f.Add(good, "", "failbus.outcome.p.a")
	f.Add(good, "outcome/1", "failbus.outcome.p.a")
	f.Add(good, "outcome/1", "failbus.notify.normal")
	f.Add(good, "", "")
	f.Add([]byte("not msgpack"), "", "failbus.outcome.p.a")
	f.Add([]byte{0x81, 0xa2, 'a', 't', 0xa3, 'b', 'a', 'd'}, "", "failbus.segment.a")
	f.Add([]byte{0xde, 0xff, 0xff}, "decision/1", "failbus.decision.a")
	ts, _ := msgpack.Marshal(map[string]any{"id": "x", "agent": "a", "provider": "p", "at": uint64(1 << 63)})
	f.Add(ts, "", "failbus.outcome.p.a")
	note, _ := msgpack.Marshal(map[string]any{"dedupe_key": "k", "severity": "normal"})
	f.Add(note, "", "failbus.notify.normal")
	for _, seed := range hostileSeeds() {
		f.Add(seed, "", "failbus.outcome.p.a")
	}
	f.Fuzz(func(t *testing.T, data []byte, schema, subject string) {
		h := nats.Header{}
		if schema != "" {
			h.Set(events.HeaderSchema, schema)
		}
		m, err := events.Decode(subject, h, data)
		if err != nil {
			if m != nil {
				t.Fatalf("error %v with a message", err)
			}
			return
		}
		if want := events.SubjectSchema(subject); want != "" && m.SchemaName() != want {
			t.Fatalf("decoded a %s on %s, which carries %s", m.SchemaName(), subject, want)
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("accepted an invalid message: %v", err)
		}
		if _, _, err := events.Encode(m); err != nil {
			t.Fatalf("accepted message does not re-encode: %v", err)
		}
	})
}

// FuzzOutcomeJSON feeds arbitrary JSON lines to the offline decoder.
func FuzzOutcomeJSON(f *testing.F) {
	f.Add(`{"id":"x","agent":"a","provider":"p","at":1795955445123}`)
	f.Add(`{"id":"x","agent":"a","provider":"p","at":"2026-11-29T12:00:00Z"}`)
	f.Add(`{"at":1e400}`)
	f.Add(`{"at":"1e3"}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, line string) {
		var o events.Outcome
		if err := events.UnmarshalJSON([]byte(line), &o); err != nil {
			return
		}
		if _, err := json.Marshal(&o); err != nil {
			t.Fatalf("decoded outcome does not re-encode: %v", err)
		}
	})
}

// hostileSeeds are depth- and size-shaped inputs: nesting in every
// position, lengths that lie, strings and collections at and past the
// limits, huge integers and times. The fuzzer mutates from them, so it
// explores the shapes that broke the decoder rather than only random bytes.
func hostileSeeds() [][]byte {
	var h hostile
	var seeds [][]byte
	for _, depth := range []int{events.DefaultMaxDepth - 2, events.DefaultMaxDepth, events.DefaultMaxDepth + 1, 1000} {
		for _, key := range []string{"at", "headers", "origin", "status", "zz", "id"} {
			seeds = append(seeds, h.outcome(key, h.nested(depth, false)), h.outcome(key, h.nested(depth, true)))
		}
		seeds = append(seeds, h.headersWith(h.nested(depth, false)), h.nested(depth, true))
	}
	for _, lie := range [][]byte{
		{0xdd, 0xff, 0xff, 0xff, 0xff}, {0xdc, 0x10, 0x00}, {0xdf, 0x00, 0x01, 0x00, 0x00},
		{0xdb, 0xff, 0xff, 0xff, 0xff}, {0xc6, 0x00, 0x10, 0x00, 0x00}, {0xc9, 0x00, 0x00, 0x00, 0x0c, 0xff},
		{0xd7, 0xff}, {0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, {0xc1},
	} {
		seeds = append(seeds, h.outcome("at", lie), h.outcome("body", lie), h.headersWith(lie))
	}
	seeds = append(seeds,
		h.outcome("body", h.raw(strings.Repeat("x", 70_000))),
		h.outcome("at", h.raw(time.Unix(1<<40, 0))),
		h.outcome("status", h.raw(uint64(math.MaxUint64))),
		h.outcome("request_tokens", h.raw(int64(math.MaxInt64))),
		h.outcome("id", h.str("a\r\nb")),
	)
	return seeds
}

// FuzzCheckMsgpack: whatever the pre-scan accepts is one well-formed
// msgpack value that msgpack itself can skip to the last byte, so the
// decode that follows never meets a length or a depth the scan did not
// bound; and the scan never panics.
func FuzzCheckMsgpack(f *testing.F) {
	for _, seed := range hostileSeeds() {
		f.Add(seed)
	}
	good, _, _ := events.Encode(sample())
	f.Add(good)
	f.Fuzz(func(t *testing.T, data []byte) {
		lim := events.Limits{MaxDepth: 8, MaxEntries: 64, MaxValues: 512, MaxString: 4096}
		if err := events.CheckMsgpack(data, lim); err != nil {
			var le *events.LimitError
			if !errors.As(err, &le) {
				t.Fatalf("%T is not a *LimitError: %v", err, err)
			}
			return
		}
		r := bytes.NewReader(data)
		if err := msgpack.NewDecoder(r).Skip(); err != nil {
			t.Fatalf("accepted but msgpack cannot skip it: %v", err)
		}
		if r.Len() != 0 {
			t.Fatal("accepted with trailing bytes")
		}
	})
}
