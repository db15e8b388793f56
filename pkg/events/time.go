package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/failbus/failbus/pkg/redact"
)

// Time is a timestamp that decodes from every shape agents write: RFC 3339
// strings, integer epoch milliseconds, and msgpack timestamps. A refusal guard
// once showed why: a guard that understood only one shape silently flipped behaviour on
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
		return inRange(t)
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return millis(n)
	}
	return Time{}, fmt.Errorf("time %q is neither RFC 3339 nor epoch milliseconds", truncate(s, 64))
}

// Bounds of every accepted time, whatever its shape.
var (
	minTime = time.UnixMilli(minEpochMillis).UTC()
	maxTime = time.UnixMilli(maxEpochMillis).UTC()
)

func millis(n int64) (Time, error) {
	if n < minEpochMillis || n > maxEpochMillis {
		return Time{}, fmt.Errorf("%w: epoch milliseconds %d outside years 0001-9999", ErrTimeRange, n)
	}
	return FromMillis(n), nil
}

// inRange accepts t when it lies in years 0001–9999, like epoch
// milliseconds: a msgpack timestamp can say year 292277026596.
func inRange(t time.Time) (Time, error) {
	if t.Before(minTime) || t.After(maxTime) {
		return Time{}, fmt.Errorf("%w: %d-%02d-%02d is outside years 0001-9999", ErrTimeRange, t.Year(), t.Month(), t.Day())
	}
	return At(t), nil
}

func floatMillis(f float64) (Time, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f) {
		return Time{}, fmt.Errorf("time %v is not an integer of epoch milliseconds", f)
	}
	if f < minEpochMillis || f > maxEpochMillis {
		return Time{}, fmt.Errorf("%w: epoch milliseconds %v outside years 0001-9999", ErrTimeRange, f)
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
// of epoch milliseconds, a string (RFC 3339 or digits), or nil; every shape
// must lie in years 0001–9999 (ErrTimeRange otherwise). It reads one scalar
// and never recurses: an array or map where a time belongs is an error
// before any of it is read.
func (t *Time) DecodeMsgpack(dec *msgpack.Decoder) error {
	c, err := dec.PeekCode()
	if err != nil {
		return fmt.Errorf("time: %w", err)
	}
	var out Time
	switch {
	case c == msgpcode.Nil:
		err = dec.DecodeNil()
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		var b []byte
		if b, err = dec.DecodeBytes(); err == nil {
			out, err = ParseTime(string(b))
		}
	case c == msgpcode.Uint64:
		var n uint64
		if n, err = dec.DecodeUint64(); err == nil {
			if n > math.MaxInt64 {
				return fmt.Errorf("%w: epoch milliseconds %d outside years 0001-9999", ErrTimeRange, n)
			}
			out, err = millis(int64(n))
		}
	case msgpcode.IsFixedNum(c) || c >= msgpcode.Uint8 && c <= msgpcode.Int64:
		var n int64
		if n, err = dec.DecodeInt64(); err == nil {
			out, err = millis(n)
		}
	case c == msgpcode.Float || c == msgpcode.Double:
		var f float64
		if f, err = dec.DecodeFloat64(); err == nil {
			out, err = floatMillis(f)
		}
	case msgpcode.IsExt(c) || msgpcode.IsFixedExt(c):
		var tm time.Time
		if tm, err = dec.DecodeTime(); err == nil {
			out, err = inRange(tm)
		}
	default:
		return fmt.Errorf("time must be a timestamp, RFC 3339 string or epoch milliseconds, got %s", kindOfCode(c))
	}
	if err != nil {
		return err
	}
	*t = out
	return nil
}

// kindOfCode names the kind of msgpack value that starts with c.
func kindOfCode(c byte) string {
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		return "a map"
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		return "an array"
	case c == msgpcode.True || c == msgpcode.False:
		return "a bool"
	}
	return fmt.Sprintf("msgpack code 0x%02x", c)
}

// truncate is how an error quotes input: credentials masked
// (redact.String), then at most n bytes, cut at a character boundary.
func truncate(s string, n int) string {
	if len(s) > 4*n {
		s = s[:4*n] // redact no more than a few times what is shown
	}
	s = redact.String(s)
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// The window in which an event's own time (`at`, the agent's clock) is
// believed, around when the bus stored the event (the stream's timestamp,
// the bus's clock). Decoding accepts any time in years 0001–9999, so
// `failbus simulate` can replay any history; a service that keeps a clock
// of its own from events (the scheduler's fault scope) goes by EventTime.
const (
	// MaxAtAhead is how far `at` may lie after the stored time and still
	// be an agent's clock running fast: such an `at` counts as the stored
	// time. Further ahead, `at` is not believed.
	MaxAtAhead = time.Minute
	// MaxAtBehind is how far `at` may lie before the stored time: an agent
	// that buffered outcomes through a disconnection publishes them late.
	// 30 days, as long as FAILBUS_OUTCOMES keeps them; older is not
	// believed.
	MaxAtBehind = 30 * 24 * time.Hour
)

// EventTime is the time to order an event by: its `at` when that lies in
// [stored − MaxAtBehind, stored], the stored time when `at` is ahead of it
// (believed when by at most MaxAtAhead), and the stored time, not believed,
// when `at` is absent or outside the window. It is never later than stored:
// a clock that advances by EventTime never runs ahead of the bus's own
// clock, whatever one event says (a year-9999 `at` moves it by nothing).
func EventTime(at Time, stored time.Time) (t time.Time, believed bool) {
	switch {
	case at.IsZero() || stored.IsZero():
		if stored.IsZero() {
			return at.Time, !at.IsZero()
		}
		return stored, false
	case at.After(stored):
		return stored, !at.After(stored.Add(MaxAtAhead))
	case at.Before(stored.Add(-MaxAtBehind)):
		return stored, false
	}
	return at.Time, true
}
