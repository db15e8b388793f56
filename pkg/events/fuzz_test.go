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
