package events_test

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// FuzzDecode feeds arbitrary bytes and schema headers to the bus decoder: it
// must never panic, and whatever it accepts must be valid and re-encodable.
func FuzzDecode(f *testing.F) {
	good, _, _ := events.Encode(sample())
	f.Add(good, "")
	f.Add(good, "outcome/1")
	f.Add([]byte("not msgpack"), "")
	f.Add([]byte{0x81, 0xa2, 'a', 't', 0xa3, 'b', 'a', 'd'}, "")
	f.Add([]byte{0xde, 0xff, 0xff}, "decision/1")
	ts, _ := msgpack.Marshal(map[string]any{"id": "x", "agent": "a", "provider": "p", "at": uint64(1 << 63)})
	f.Add(ts, "")
	f.Fuzz(func(t *testing.T, data []byte, schema string) {
		h := nats.Header{}
		if schema != "" {
			h.Set(events.HeaderSchema, schema)
		}
		m, err := events.Decode(h, data)
		if err != nil {
			if m != nil {
				t.Fatalf("error %v with a message", err)
			}
			return
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
