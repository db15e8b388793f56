package events

import (
	"fmt"
	"io"
	"reflect"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// The records every outcome crosses the bus as (Outcome, then
// Classification, then Decision, and the scheduler's ledger entries)
// encode and decode through field tables instead of msgpack's reflection:
// reflection was most of their codec cost (boxing each field to test
// omitempty, a reflect.Value per field), and each outcome is encoded and
// decoded several times on its way through the services (`failbus bench
// --cpuprofile-failbus`).
//
// A table writes the bytes msgpack's reflection writes for the same
// struct tags (same keys in field order, same omitempty, same integer
// widths), through a pointer or as a value, and reads what it reads (any
// key order, unknown keys skipped, nil for a whole struct, the array
// form), under the encoder and decoder settings failbus uses: compact
// integers or not, sorted map keys or not. It does not follow the
// settings nothing here turns on: DisallowUnknownFields,
// UseArrayEncodedStructs, SetOmitEmpty, custom struct tags, interned
// strings (an interned key is an error). One input reads differently:
// reflection also takes an inlined embedded struct's own name as a key
// ({"Record": {…}} into a LedgerEntry's retry.Record), which a table
// skips as unknown; failbus never writes that key.
// internal/wirecheck holds a table to reflection on a mirror type without
// its methods, and fails when a field is added to a type but not to its
// table (TestWireCodecMatchesReflection, FuzzWireDecode).
//
// The types' EncodeMsgpack has a value receiver (a value that is not
// addressable, such as a map's, encodes too); like any method, it is
// promoted to a struct that embeds the type, and would then write only
// the embedded fields: give such a struct a named field instead.

// Field is one struct field of a FieldTable: its msgpack key, whether an
// omitempty field is empty (nil: never omitted), and how it is written
// and read. The constructors below make one per Go kind.
type Field[T any] struct {
	name  string
	empty func(*T) bool
	enc   func(*msgpack.Encoder, *T) error
	dec   func(*msgpack.Decoder, *T) error
}

// FieldTable is a type's msgpack codec: its fields in struct order, as
// msgpack's reflection would write them. A type's EncodeMsgpack and
// DecodeMsgpack call Encode and Decode.
type FieldTable[T any] struct {
	fields []Field[T]
	index  map[string]int
}

// NewFieldTable is the table of fields, which must be every field of T
// that msgpack would write, in struct order.
func NewFieldTable[T any](fields ...Field[T]) *FieldTable[T] {
	s := &FieldTable[T]{fields: fields, index: make(map[string]int, len(fields))}
	for i, f := range fields {
		s.index[f.name] = i
	}
	return s
}

// Encode writes v as a map of its fields, omitempty ones left out when
// empty.
func (s *FieldTable[T]) Encode(enc *msgpack.Encoder, v *T) error {
	if v == nil {
		return enc.EncodeNil()
	}
	n := 0
	for i := range s.fields {
		if f := &s.fields[i]; f.empty == nil || !f.empty(v) {
			n++
		}
	}
	if err := enc.EncodeMapLen(n); err != nil {
		return err
	}
	for i := range s.fields {
		f := &s.fields[i]
		if f.empty != nil && f.empty(v) {
			continue
		}
		if err := enc.EncodeString(f.name); err != nil {
			return err
		}
		if err := f.enc(enc, v); err != nil {
			return err
		}
	}
	return nil
}

// maxWireKey is the longest key of any table; a longer key is unknown.
const maxWireKey = 32

// keys holds the buffers keys are read into: one on the stack escapes
// (Decoder.ReadFull reads through an interface), an allocation per struct.
var keys = sync.Pool{New: func() any { return new([maxWireKey]byte) }}

// Decode reads a map (or nil, or the array form) into v, as msgpack's
// decodeStructValue does.
func (s *FieldTable[T]) Decode(dec *msgpack.Decoder, v *T) error {
	c, err := dec.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case c == msgpcode.Nil || msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := dec.DecodeMapLen()
		if err != nil {
			return err
		}
		if n == -1 {
			*v = *new(T)
			return nil
		}
		key := keys.Get().(*[maxWireKey]byte)
		defer keys.Put(key)
		next := 0 // keys come in table order when the tables wrote them
		for range n {
			kn, err := dec.DecodeBytesLen()
			if err != nil {
				return err
			}
			var name []byte
			if kn > 0 {
				if kn > len(key) {
					if err := discard(dec, kn); err != nil {
						return err
					}
					if err := dec.Skip(); err != nil { // an unknown key's value
						return err
					}
					continue
				}
				name = key[:kn]
				if err := dec.ReadFull(name); err != nil {
					return err
				}
			}
			i := s.after(next, name)
			if i < 0 {
				if err := dec.Skip(); err != nil {
					return err
				}
				continue
			}
			if err := s.fields[i].dec(dec, v); err != nil {
				return err
			}
			next = i + 1
		}
		return nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := dec.DecodeArrayLen()
		if err != nil {
			return err
		}
		if n <= 0 {
			*v = *new(T)
			return nil
		}
		if n != len(s.fields) {
			return errArrayStruct
		}
		for i := range s.fields {
			if err := s.fields[i].dec(dec, v); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("msgpack: invalid code=%x decoding map length", c)
}

// after finds the field named name: first among the fields from next on
// (in order, as the tables write them, it is usually the first compared),
// then by name; -1 when there is none.
func (s *FieldTable[T]) after(next int, name []byte) int {
	for j := next; j < len(s.fields); j++ {
		if s.fields[j].name == string(name) {
			return j
		}
	}
	if i, ok := s.index[string(name)]; ok {
		return i
	}
	return -1
}

// errArrayStruct is msgpack's error for an array form of the wrong length.
var errArrayStruct = fmt.Errorf("msgpack: number of fields in array-encoded struct has changed")

// discard reads n bytes of a key too long to be a field's.
func discard(dec *msgpack.Decoder, n int) error {
	var buf [256]byte
	for n > 0 {
		k := min(n, len(buf))
		if err := dec.ReadFull(buf[:k]); err != nil {
			if err == io.EOF {
				return io.ErrUnexpectedEOF
			}
			return err
		}
		n -= k
	}
	return nil
}

// Field kinds. Each reads and writes as msgpack's reflection does for
// that Go kind: strings with EncodeString/DecodeString, int with EncodeInt
// (always compact), int64 and uint64 through EncodeValue (compact only
// when the encoder is set to compact ints), bools, Time with its own
// methods, and anything else (maps, slices, pointers to structs) through
// reflection, which is rare on the hot path. name is the msgpack key,
// omitEmpty its tag's omitempty, p the field's address in a *T.

// StringField is a string field.
func StringField[T any](name string, omitEmpty bool, p func(*T) *string) Field[T] {
	return scalarField(name, omitEmpty, p, (*msgpack.Encoder).EncodeString, (*msgpack.Decoder).DecodeString)
}

// IntField is an int field.
func IntField[T any](name string, omitEmpty bool, p func(*T) *int) Field[T] {
	return scalarField(name, omitEmpty, p,
		func(enc *msgpack.Encoder, n int) error { return enc.EncodeInt(int64(n)) },
		func(dec *msgpack.Decoder) (int, error) {
			n, err := dec.DecodeInt64()
			return int(n), err
		})
}

// BoolField is a bool field.
func BoolField[T any](name string, omitEmpty bool, p func(*T) *bool) Field[T] {
	return scalarField(name, omitEmpty, p, (*msgpack.Encoder).EncodeBool, (*msgpack.Decoder).DecodeBool)
}

// scalarField is a field of a comparable kind written by enc and read by
// dec; empty is its zero value. A failed read leaves the field as it was.
func scalarField[T any, F comparable](name string, omitEmpty bool, p func(*T) *F,
	enc func(*msgpack.Encoder, F) error, dec func(*msgpack.Decoder) (F, error)) Field[T] {
	f := Field[T]{
		name: name,
		enc:  func(e *msgpack.Encoder, v *T) error { return enc(e, *p(v)) },
		dec: func(d *msgpack.Decoder, v *T) error {
			x, err := dec(d)
			if err != nil {
				return err
			}
			*p(v) = x
			return nil
		},
	}
	if omitEmpty {
		var zero F
		f.empty = func(v *T) bool { return *p(v) == zero }
	}
	return f
}

// TimeField is a Time field.
func TimeField[T any](name string, omitEmpty bool, p func(*T) *Time) Field[T] {
	f := Field[T]{
		name: name,
		enc:  func(enc *msgpack.Encoder, v *T) error { return p(v).EncodeMsgpack(enc) },
		dec:  func(dec *msgpack.Decoder, v *T) error { return p(v).DecodeMsgpack(dec) },
	}
	if omitEmpty {
		f.empty = func(v *T) bool { return p(v).IsZero() }
	}
	return f
}

// ReflectField is a field msgpack's reflection writes and reads, through
// the same per-type function a struct field of its type goes through;
// empty says whether omitempty leaves it out (nil: never).
func ReflectField[T any, F any](name string, empty func(*T) bool, p func(*T) *F) Field[T] {
	return Field[T]{
		name:  name,
		empty: empty,
		enc:   func(enc *msgpack.Encoder, v *T) error { return enc.EncodeValue(reflect.ValueOf(p(v)).Elem()) },
		dec:   func(dec *msgpack.Decoder, v *T) error { return dec.DecodeValue(reflect.ValueOf(p(v)).Elem()) },
	}
}

// Int64Field is an int64 field. It goes through EncodeValue so that it
// is compact exactly when the encoder is (msgpack writes a full-width
// int64 otherwise).
func Int64Field[T any](name string, omitEmpty bool, p func(*T) *int64) Field[T] {
	return reflectScalar(name, omitEmpty, p)
}

// Uint64Field is a uint64 field, compact exactly when the encoder is.
func Uint64Field[T any](name string, omitEmpty bool, p func(*T) *uint64) Field[T] {
	return reflectScalar(name, omitEmpty, p)
}

// reflectScalar is ReflectField for a comparable kind, empty at its zero.
func reflectScalar[T any, F comparable](name string, omitEmpty bool, p func(*T) *F) Field[T] {
	f := ReflectField(name, nil, p)
	if omitEmpty {
		var zero F
		f.empty = func(v *T) bool { return *p(v) == zero }
	}
	return f
}

// Keys are the table's msgpack keys in order, each with whether it is
// omitted when empty: a test compares them with the type's struct tags.
func (s *FieldTable[T]) Keys() (names []string, omitEmpty []bool) {
	for _, f := range s.fields {
		names, omitEmpty = append(names, f.name), append(omitEmpty, f.empty != nil)
	}
	return names, omitEmpty
}

var outcomeWire = NewFieldTable(
	StringField("id", false, func(o *Outcome) *string { return &o.ID }),
	TimeField("at", false, func(o *Outcome) *Time { return &o.At }),
	StringField("agent", false, func(o *Outcome) *string { return &o.Agent }),
	StringField("session", true, func(o *Outcome) *string { return &o.Session }),
	IntField("segment", true, func(o *Outcome) *int { return &o.Segment }),
	IntField("turn", true, func(o *Outcome) *int { return &o.Turn }),
	IntField("step", true, func(o *Outcome) *int { return &o.Step }),
	StringField("provider", false, func(o *Outcome) *string { return &o.Provider }),
	StringField("model", true, func(o *Outcome) *string { return &o.Model }),
	StringField("profile", true, func(o *Outcome) *string { return &o.Profile }),
	BoolField("ok", false, func(o *Outcome) *bool { return &o.OK }),
	IntField("status", true, func(o *Outcome) *int { return &o.Status }),
	StringField("body", true, func(o *Outcome) *string { return &o.Body }),
	ReflectField("headers", func(o *Outcome) bool { return len(o.Headers) == 0 }, func(o *Outcome) *map[string]string { return &o.Headers }),
	StringField("transport_error", true, func(o *Outcome) *string { return &o.TransportError }),
	StringField("upstream_code", true, func(o *Outcome) *string { return &o.UpstreamCode }),
	StringField("stop_reason", true, func(o *Outcome) *string { return &o.StopReason }),
	StringField("refusal_scope", true, func(o *Outcome) *string { return &o.RefusalScope }),
	IntField("request_tokens", true, func(o *Outcome) *int { return &o.RequestTokens }),
	IntField("context_window", true, func(o *Outcome) *int { return &o.ContextWindow }),
	IntField("max_output_tokens", true, func(o *Outcome) *int { return &o.MaxOutputTokens }),
	ReflectField("origin", func(o *Outcome) bool { return o.Origin == nil }, func(o *Outcome) **Origin { return &o.Origin }),
)

var classificationWire = NewFieldTable(
	StringField("outcome_id", false, func(c *Classification) *string { return &c.OutcomeID }),
	TimeField("at", true, func(c *Classification) *Time { return &c.At }),
	StringField("agent", true, func(c *Classification) *string { return &c.Agent }),
	StringField("provider", true, func(c *Classification) *string { return &c.Provider }),
	StringField("model", true, func(c *Classification) *string { return &c.Model }),
	StringField("profile", true, func(c *Classification) *string { return &c.Profile }),
	StringField("class", false, func(c *Classification) *string { return &c.Class }),
	BoolField("retryable", false, func(c *Classification) *bool { return &c.Retryable }),
	StringField("scope", true, func(c *Classification) *string { return &c.Scope }),
	StringField("rule", false, func(c *Classification) *string { return &c.Rule }),
	ReflectField("evidence", func(c *Classification) bool { return len(c.Evidence) == 0 }, func(c *Classification) *[]string { return &c.Evidence }),
	StringField("overruled", true, func(c *Classification) *string { return &c.Overruled }),
	ReflectField("hints", func(c *Classification) bool { return c.Hints == nil }, func(c *Classification) **RetryHints { return &c.Hints }),
	StringField("session", true, func(c *Classification) *string { return &c.Session }),
	IntField("segment", true, func(c *Classification) *int { return &c.Segment }),
	IntField("turn", true, func(c *Classification) *int { return &c.Turn }),
	IntField("step", true, func(c *Classification) *int { return &c.Step }),
	StringField("refusal_scope", true, func(c *Classification) *string { return &c.RefusalScope }),
)

var decisionWire = NewFieldTable(
	StringField("outcome_id", false, func(d *Decision) *string { return &d.OutcomeID }),
	TimeField("at", true, func(d *Decision) *Time { return &d.At }),
	StringField("agent", false, func(d *Decision) *string { return &d.Agent }),
	StringField("action", false, func(d *Decision) *string { return &d.Action }),
	StringField("reason", true, func(d *Decision) *string { return &d.Reason }),
	StringField("class", true, func(d *Decision) *string { return &d.Class }),
	StringField("rule", true, func(d *Decision) *string { return &d.Rule }),
	Int64Field("delay_ms", true, func(d *Decision) *int64 { return &d.DelayMS }),
	TimeField("due_at", true, func(d *Decision) *Time { return &d.DueAt }),
	IntField("retry", true, func(d *Decision) *int { return &d.Retry }),
	StringField("retry_id", true, func(d *Decision) *string { return &d.RetryID }),
	StringField("provider", true, func(d *Decision) *string { return &d.Provider }),
	StringField("model", true, func(d *Decision) *string { return &d.Model }),
	StringField("profile", true, func(d *Decision) *string { return &d.Profile }),
)

var (
	_ msgpack.CustomEncoder = (*Outcome)(nil)
	_ msgpack.CustomDecoder = (*Outcome)(nil)
	_ msgpack.CustomEncoder = (*Classification)(nil)
	_ msgpack.CustomDecoder = (*Classification)(nil)
	_ msgpack.CustomEncoder = (*Decision)(nil)
	_ msgpack.CustomDecoder = (*Decision)(nil)
)

// EncodeMsgpack writes the outcome without reflection (wirecodec.go).
func (o Outcome) EncodeMsgpack(enc *msgpack.Encoder) error { return outcomeWire.Encode(enc, &o) }

// DecodeMsgpack reads an outcome without reflection (wirecodec.go).
func (o *Outcome) DecodeMsgpack(dec *msgpack.Decoder) error { return outcomeWire.Decode(dec, o) }

// EncodeMsgpack writes the classification without reflection (wirecodec.go).
func (c Classification) EncodeMsgpack(enc *msgpack.Encoder) error {
	return classificationWire.Encode(enc, &c)
}

// DecodeMsgpack reads a classification without reflection (wirecodec.go).
func (c *Classification) DecodeMsgpack(dec *msgpack.Decoder) error {
	return classificationWire.Decode(dec, c)
}

// EncodeMsgpack writes the decision without reflection (wirecodec.go).
func (d Decision) EncodeMsgpack(enc *msgpack.Encoder) error { return decisionWire.Encode(enc, &d) }

// DecodeMsgpack reads a decision without reflection (wirecodec.go).
func (d *Decision) DecodeMsgpack(dec *msgpack.Decoder) error { return decisionWire.Decode(dec, d) }
