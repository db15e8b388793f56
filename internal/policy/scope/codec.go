package scope

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// The fault scope's state is stored on every batch the scheduler observes
// (internal/scopestore) and read back when another replica wrote it: its
// records encode and decode through field tables (events.FieldTable), not
// msgpack's reflection, which was most of that cost (a provider's record
// holds an Entry per profile and per model). TestCodecMatchesReflection
// holds each table to what reflection writes and reads.

var entryWire = events.NewFieldTable(
	events.StringField("last_id", true, func(e *Entry) *string { return &e.LastID }),
	events.TimeField("last_seen", true, func(e *Entry) *events.Time { return &e.LastSeen }),
	events.TimeField("last_at", false, func(e *Entry) *events.Time { return &e.LastAt }),
	events.BoolField("last_ok", false, func(e *Entry) *bool { return &e.LastOK }),
	events.StringField("last_class", false, func(e *Entry) *string { return &e.LastClass }),
	events.BoolField("last_network", true, func(e *Entry) *bool { return &e.LastNetwork }),
	events.TimeField("fault_since", true, func(e *Entry) *events.Time { return &e.FaultSince }),
	events.StringField("fault_class", true, func(e *Entry) *string { return &e.FaultClass }),
	events.TimeField("cooldown_until", true, func(e *Entry) *events.Time { return &e.CooldownUntil }),
	events.TimeField("error_at", true, func(e *Entry) *events.Time { return &e.ErrorAt }),
	events.StringField("error_class", true, func(e *Entry) *string { return &e.ErrorClass }),
	events.ReflectField("agents", func(e *Entry) bool { return len(e.Agents) == 0 }, func(e *Entry) *Keys { return &e.Agents }),
)

var callWire = events.NewFieldTable(
	events.Uint64Field("id", false, func(k *Call) *uint64 { return &k.ID }),
	events.TimeField("at", false, func(k *Call) *events.Time { return &k.At }),
	events.BoolField("fail", true, func(k *Call) *bool { return &k.Fail }),
)

var markWire = events.NewFieldTable(
	events.StringField("id", false, func(m *Mark) *string { return &m.ID }),
	events.TimeField("at", false, func(m *Mark) *events.Time { return &m.At }),
)

var stateWire = events.NewFieldTable(
	events.StringField("provider", false, func(s *ProviderState) *string { return &s.Provider }),
	events.TimeField("clock", true, func(s *ProviderState) *events.Time { return &s.Clock }),
	events.BoolField("outage", true, func(s *ProviderState) *bool { return &s.Outage }),
	events.TimeField("outage_since", true, func(s *ProviderState) *events.Time { return &s.OutageSince }),
	events.StringField("outage_reason", true, func(s *ProviderState) *string { return &s.OutageReason }),
	events.TimeField("recovering_since", true, func(s *ProviderState) *events.Time { return &s.RecoveringSince }),
	events.IntField("recovery_successes", true, func(s *ProviderState) *int { return &s.RecoverySuccesses }),
	events.ReflectField("streak", func(s *ProviderState) bool { return len(s.Streak) == 0 }, func(s *ProviderState) *[]string { return &s.Streak }),
	events.BoolField("rate_limited", true, func(s *ProviderState) *bool { return &s.RateLimited }),
	events.BoolField("erroring", true, func(s *ProviderState) *bool { return &s.Erroring }),
	events.TimeField("erroring_since", true, func(s *ProviderState) *events.Time { return &s.ErroringSince }),
	events.ReflectField("calls", func(s *ProviderState) bool { return len(s.Calls) == 0 }, func(s *ProviderState) *Calls { return &s.Calls }),
	events.TimeField("last_success", true, func(s *ProviderState) *events.Time { return &s.LastSuccess }),
	events.ReflectField("net_failures", func(s *ProviderState) bool { return len(s.NetFailures) == 0 }, func(s *ProviderState) *[]Mark { return &s.NetFailures }),
	events.ReflectField("profiles", func(s *ProviderState) bool { return len(s.Profiles) == 0 }, func(s *ProviderState) *map[string]*Entry { return &s.Profiles }),
	events.ReflectField("models", func(s *ProviderState) bool { return len(s.Models) == 0 }, func(s *ProviderState) *map[string]*Entry { return &s.Models }),
)

var (
	_ msgpack.CustomEncoder = (*Entry)(nil)
	_ msgpack.CustomDecoder = (*Entry)(nil)
	_ msgpack.CustomEncoder = (*Mark)(nil)
	_ msgpack.CustomDecoder = (*Mark)(nil)
	_ msgpack.CustomEncoder = (*Call)(nil)
	_ msgpack.CustomDecoder = (*Call)(nil)
	_ msgpack.CustomEncoder = (*ProviderState)(nil)
	_ msgpack.CustomDecoder = (*ProviderState)(nil)
)

// EncodeMsgpack writes the entry without reflection (entryWire).
func (e Entry) EncodeMsgpack(enc *msgpack.Encoder) error { return entryWire.Encode(enc, &e) }

// DecodeMsgpack reads an entry without reflection (entryWire).
func (e *Entry) DecodeMsgpack(dec *msgpack.Decoder) error { return entryWire.Decode(dec, e) }

// EncodeMsgpack writes the mark without reflection (markWire).
func (m Mark) EncodeMsgpack(enc *msgpack.Encoder) error { return markWire.Encode(enc, &m) }

// DecodeMsgpack reads a mark without reflection (markWire).
func (m *Mark) DecodeMsgpack(dec *msgpack.Decoder) error { return markWire.Decode(dec, m) }

// Calls are the provider's latest calls (ProviderState.Calls). On the wire
// they are one bin of callBytes per call — its id hash, its time in Unix
// nanoseconds, whether it failed — not a map each: the state is written
// at every batch of classifications the scheduler observes, and 40 calls
// as maps cost a hundred allocations to read back. In JSON they are a
// list of Call objects.
type Calls []Call

// callBytes is one call on the wire: id (8), at (8), fail (1).
const callBytes = 17

var (
	_ msgpack.CustomEncoder = Calls(nil)
	_ msgpack.CustomDecoder = (*Calls)(nil)
)

// EncodeMsgpack writes the calls as one bin.
func (cs Calls) EncodeMsgpack(enc *msgpack.Encoder) error {
	if cs == nil {
		return enc.EncodeNil()
	}
	buf := make([]byte, 0, len(cs)*callBytes)
	for _, c := range cs {
		var at int64
		if !c.At.IsZero() {
			at = c.At.UnixNano()
		}
		buf = binary.BigEndian.AppendUint64(buf, c.ID)
		buf = binary.BigEndian.AppendUint64(buf, uint64(at))
		var fail byte
		if c.Fail {
			fail = 1
		}
		buf = append(buf, fail)
	}
	return enc.EncodeBytes(buf)
}

// DecodeMsgpack reads the calls from their bin.
func (cs *Calls) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeBytesLen()
	if err != nil {
		return fmt.Errorf("calls: %w", err)
	}
	if n == -1 {
		*cs = nil
		return nil
	}
	if n%callBytes != 0 {
		return fmt.Errorf("calls: %d bytes is not a whole number of %d-byte calls", n, callBytes)
	}
	out := make(Calls, n/callBytes)
	var rec [callBytes]byte
	for i := range out {
		if err := dec.ReadFull(rec[:]); err != nil {
			return fmt.Errorf("calls: %w", err)
		}
		out[i].ID = binary.BigEndian.Uint64(rec[0:8])
		if at := int64(binary.BigEndian.Uint64(rec[8:16])); at != 0 {
			out[i].At = events.At(time.Unix(0, at).UTC())
		}
		out[i].Fail = rec[16] != 0
	}
	*cs = out
	return nil
}

// Keys are IDKey hashes (a profile's agents). On the wire they are one
// bin of 8 bytes each, not an array of integers msgpack's reflection
// reads one boxed value at a time; in JSON a list of numbers.
type Keys []uint64

var (
	_ msgpack.CustomEncoder = Keys(nil)
	_ msgpack.CustomDecoder = (*Keys)(nil)
)

// EncodeMsgpack writes the keys as one bin.
func (ks Keys) EncodeMsgpack(enc *msgpack.Encoder) error {
	if ks == nil {
		return enc.EncodeNil()
	}
	buf := make([]byte, 0, 8*len(ks))
	for _, k := range ks {
		buf = binary.BigEndian.AppendUint64(buf, k)
	}
	return enc.EncodeBytes(buf)
}

// DecodeMsgpack reads the keys from their bin.
func (ks *Keys) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeBytesLen()
	if err != nil {
		return fmt.Errorf("keys: %w", err)
	}
	if n == -1 {
		*ks = nil
		return nil
	}
	if n%8 != 0 {
		return fmt.Errorf("keys: %d bytes is not a whole number of 8-byte keys", n)
	}
	out := make(Keys, n/8)
	var rec [8]byte
	for i := range out {
		if err := dec.ReadFull(rec[:]); err != nil {
			return fmt.Errorf("keys: %w", err)
		}
		out[i] = binary.BigEndian.Uint64(rec[:])
	}
	*ks = out
	return nil
}

// EncodeMsgpack writes the call without reflection (callWire).
func (k Call) EncodeMsgpack(enc *msgpack.Encoder) error { return callWire.Encode(enc, &k) }

// DecodeMsgpack reads a call without reflection (callWire).
func (k *Call) DecodeMsgpack(dec *msgpack.Decoder) error { return callWire.Decode(dec, k) }

// EncodeMsgpack writes the state without reflection (stateWire).
func (s ProviderState) EncodeMsgpack(enc *msgpack.Encoder) error { return stateWire.Encode(enc, &s) }

// DecodeMsgpack reads a state without reflection (stateWire).
func (s *ProviderState) DecodeMsgpack(dec *msgpack.Decoder) error { return stateWire.Decode(dec, s) }
