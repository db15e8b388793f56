package events

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Raw is a value failbus carries without looking inside (a task's payload):
// kept as its msgpack encoding, so it reaches the dispatch byte for byte.
// In JSON (offline commands, tail) it is the same value as JSON. The zero
// Raw is absent.
type Raw []byte

// IsZero reports an absent value.
func (r Raw) IsZero() bool { return len(r) == 0 }

var (
	_ msgpack.CustomEncoder = Raw(nil)
	_ msgpack.CustomDecoder = (*Raw)(nil)
)

// EncodeMsgpack writes the value as it was received.
func (r Raw) EncodeMsgpack(enc *msgpack.Encoder) error {
	if len(r) == 0 {
		return enc.EncodeNil()
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
