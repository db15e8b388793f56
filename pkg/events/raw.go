package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Raw is a value failbus carries without looking inside (a task's payload):
// kept as its msgpack encoding, so it reaches the dispatch byte for byte.
// In JSON (offline commands, tail) it is the same value as JSON. The zero
// Raw is absent.
//
// It holds msgpack, not JSON: build one from a Go value with RawOf, or
// from JSON text with rawJSON (or json.Unmarshal into a Raw). Encoding a
// Raw that is not exactly one msgpack value fails (ErrRawNotMsgpack),
// so a record carrying, say, JSON bytes is refused before it is
// published rather than dead-lettered on the bus.
type Raw []byte

// ErrRawNotMsgpack: a Raw does not hold exactly one msgpack value (JSON
// bytes put in one, say).
var ErrRawNotMsgpack = errors.New("payload is not one msgpack value")

// RawOf encodes v as a Raw: its msgpack encoding, map keys sorted and
// integers compact, as a JSON payload of the same value is stored.
func RawOf(v any) (Raw, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	enc.UseCompactInts(true)
	enc.SetCustomStructTag("json") // a struct keeps the names its JSON has
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	return Raw(buf.Bytes()), nil
}

// rawJSON converts JSON text to a Raw of the same value (integers stay
// integers).
func rawJSON(text []byte) (Raw, error) {
	var r Raw
	if err := r.UnmarshalJSON(text); err != nil {
		return nil, err
	}
	return r, nil
}

// Check reports whether r is absent or exactly one msgpack value, saying
// what it holds instead when not.
func (r Raw) Check() error {
	if len(r) == 0 {
		return nil
	}
	err := CheckMsgpack(r, Limits{})
	if err == nil {
		return nil
	}
	if json.Valid(r) {
		return fmt.Errorf("%w: it holds JSON text (%d bytes); build it with events.RawJSON or events.RawOf", ErrRawNotMsgpack, len(r))
	}
	return fmt.Errorf("%w: %v; build it with events.RawOf", ErrRawNotMsgpack, err)
}

// IsZero reports an absent value.
func (r Raw) IsZero() bool { return len(r) == 0 }

var (
	_ msgpack.CustomEncoder = Raw(nil)
	_ msgpack.CustomDecoder = (*Raw)(nil)
)

// EncodeMsgpack writes the value as it was received; a Raw that is not
// one msgpack value is an error (Check), never bytes that would break
// the record around it.
func (r Raw) EncodeMsgpack(enc *msgpack.Encoder) error {
	if len(r) == 0 {
		return enc.EncodeNil()
	}
	if err := r.Check(); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	return msgpack.RawMessage(r).EncodeMsgpack(enc)
}

// DecodeMsgpack keeps the value's bytes.
func (r *Raw) DecodeMsgpack(dec *msgpack.Decoder) error {
	b, err := dec.DecodeRaw()
	if err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	if len(b) == 1 && b[0] == 0xc0 { // nil
		*r = nil
		return nil
	}
	*r = append(Raw(nil), b...)
	return nil
}

// MarshalJSON renders the value as JSON (binary strings as base64, as
// encoding/json does).
func (r Raw) MarshalJSON() ([]byte, error) {
	if len(r) == 0 {
		return []byte("null"), nil
	}
	var v any
	if err := msgpack.Unmarshal(r, &v); err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	return json.Marshal(jsonable(v))
}

// UnmarshalJSON stores a JSON value as msgpack; integers stay integers.
func (r *Raw) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || string(b) == "null" {
		*r = nil
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true) // one JSON value, one encoding
	enc.UseCompactInts(true)
	if err := enc.Encode(fromJSON(v)); err != nil {
		return fmt.Errorf("payload: %w", err)
	}
	*r = buf.Bytes()
	return nil
}

// fromJSON turns json.Number into int64 where exact, else float64.
func fromJSON(v any) any {
	switch x := v.(type) {
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return i
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = fromJSON(e)
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = fromJSON(e)
		}
		return x
	}
	return v
}
