package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Time is a timestamp that decodes from every shape agents write: RFC 3339
// strings, integer epoch milliseconds, and msgpack timestamps. Seed 000 shows
// why: a guard that understood only one shape silently flipped behaviour on
// the other. It encodes as a msgpack timestamp on the bus and as RFC 3339
// with milliseconds in JSON. The zero Time means "absent".
type Time struct{ time.Time }

// At wraps t, normalised to UTC.
func At(t time.Time) Time { return Time{t.UTC()} }

// FromMillis builds a Time from epoch milliseconds.
func FromMillis(ms int64) Time { return Time{time.UnixMilli(ms).UTC()} }

// JSONTimeLayout is how failbus writes times in JSON: RFC 3339, milliseconds,
// UTC.
const JSONTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// maxEpochMillis bounds accepted epoch-millisecond integers to years
// 0001–9999, so a garbage number is an error, not a nonsense date.
const (
	minEpochMillis = -62135596800000
	maxEpochMillis = 253402300799999
)

// ParseTime reads a time from a string: RFC 3339 (with or without fraction),
// or a decimal integer of epoch milliseconds.
func ParseTime(s string) (Time, error) {
	if s == "" {
		return Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return At(t), nil
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return millis(n)
	}
	return Time{}, fmt.Errorf("time %q is neither RFC 3339 nor epoch milliseconds", truncate(s, 64))
}

func millis(n int64) (Time, error) {
	if n < minEpochMillis || n > maxEpochMillis {
		return Time{}, fmt.Errorf("epoch milliseconds %d out of range", n)
	}
	return FromMillis(n), nil
}

func floatMillis(f float64) (Time, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f) {
		return Time{}, fmt.Errorf("time %v is not an integer of epoch milliseconds", f)
	}
	if f < minEpochMillis || f > maxEpochMillis {
		return Time{}, fmt.Errorf("epoch milliseconds %v out of range", f)
	}
	return FromMillis(int64(f)), nil
}

// MarshalJSON writes RFC 3339 with milliseconds; the zero Time is null.
func (t Time) MarshalJSON() ([]byte, error) {
	if t.IsZero() {
		return []byte("null"), nil
	}
	return []byte(`"` + t.UTC().Format(JSONTimeLayout) + `"`), nil
}

// UnmarshalJSON accepts an RFC 3339 string, a number of epoch milliseconds
// (also as a string) or null.
func (t *Time) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || string(b) == "null" {
		*t = Time{}
		return nil
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("time: %w", err)
		}
		v, err := ParseTime(s)
		if err != nil {
			return err
		}
		*t = v
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("time must be an RFC 3339 string or epoch milliseconds, got %s", truncate(string(b), 64))
	}
	if i, err := n.Int64(); err == nil {
		v, err := millis(i)
		if err != nil {
			return err
		}
		*t = v
		return nil
	}
	f, err := n.Float64()
	if err != nil {
		return fmt.Errorf("time %s: %w", n, err)
	}
	v, err := floatMillis(f)
	if err != nil {
		return err
	}
	*t = v
	return nil
}

var (
	_ msgpack.CustomEncoder = Time{}
	_ msgpack.CustomDecoder = (*Time)(nil)
)

// EncodeMsgpack writes a msgpack timestamp; the zero Time is nil.
func (t Time) EncodeMsgpack(enc *msgpack.Encoder) error {
	if t.IsZero() {
		return enc.EncodeNil()
	}
	return enc.EncodeTime(t.Time)
}

// DecodeMsgpack accepts a msgpack timestamp, an integer (or integral float)
// of epoch milliseconds, a string (RFC 3339 or digits), or nil.
func (t *Time) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := dec.DecodeInterface()
	if err != nil {
		return fmt.Errorf("time: %w", err)
	}
	var out Time
	switch x := v.(type) {
	case nil:
	case time.Time:
		out = At(x)
	case string:
		out, err = ParseTime(x)
	case []byte:
		out, err = ParseTime(string(x))
	case int8:
		out, err = millis(int64(x))
	case int16:
		out, err = millis(int64(x))
	case int32:
		out, err = millis(int64(x))
	case int64:
		out, err = millis(x)
	case uint8:
		out, err = millis(int64(x))
	case uint16:
		out, err = millis(int64(x))
	case uint32:
		out, err = millis(int64(x))
	case uint64:
		if x > math.MaxInt64 {
			return fmt.Errorf("epoch milliseconds %d out of range", x)
		}
		out, err = millis(int64(x))
	case float32:
		out, err = floatMillis(float64(x))
	case float64:
		out, err = floatMillis(x)
	default:
		return fmt.Errorf("time must be a timestamp, RFC 3339 string or epoch milliseconds, got %T", v)
	}
	if err != nil {
		return err
	}
	*t = out
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
