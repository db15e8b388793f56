package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Duration is a span of time on the wire. CONTRACT.md writes durations as Go
// duration strings ("30m", "1h30m"); an integer is read as milliseconds, the
// way times accept epoch milliseconds. It encodes as a Go duration string.
// The zero Duration means "absent" (the default applies).
type Duration time.Duration

// Std is d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// IsZero reports an absent duration (for omitempty/omitzero).
func (d Duration) IsZero() bool { return d == 0 }

// String is the Go duration string.
func (d Duration) String() string { return time.Duration(d).String() }

// parseDuration reads a Go duration string or decimal milliseconds.
func parseDuration(s string) (Duration, error) {
	if s == "" {
		return 0, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return Duration(d), nil
	}
	var n json.Number = json.Number(s)
	if i, err := n.Int64(); err == nil {
		return durationMillis(float64(i))
	}
	return 0, fmt.Errorf("duration %q is neither a Go duration string (30m, 1h30m) nor milliseconds", truncate(s, 64))
}

func durationMillis(f float64) (Duration, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > float64(math.MaxInt64/int64(time.Millisecond)) {
		return 0, fmt.Errorf("duration of %v milliseconds out of range", f)
	}
	return Duration(time.Duration(f * float64(time.Millisecond))), nil
}

// MarshalJSON writes the Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// UnmarshalJSON accepts a duration string, a number of milliseconds or null.
func (d *Duration) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || string(b) == "null" {
		*d = 0
		return nil
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("duration: %w", err)
		}
		v, err := parseDuration(s)
		if err != nil {
			return err
		}
		*d = v
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("duration must be a string like \"30m\" or milliseconds, got %s", truncate(string(b), 64))
	}
	v, err := durationMillis(f)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

var (
	_ msgpack.CustomEncoder = Duration(0)
	_ msgpack.CustomDecoder = (*Duration)(nil)
)

// EncodeMsgpack writes the Go duration string.
func (d Duration) EncodeMsgpack(enc *msgpack.Encoder) error { return enc.EncodeString(d.String()) }

// DecodeMsgpack accepts a duration string, a number of milliseconds or nil.
func (d *Duration) DecodeMsgpack(dec *msgpack.Decoder) error {
	v, err := dec.DecodeInterface()
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	var out Duration
	switch x := v.(type) {
	case nil:
	case string:
		out, err = parseDuration(x)
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		var n int64
		switch y := x.(type) {
		case int8:
			n = int64(y)
		case int16:
			n = int64(y)
		case int32:
			n = int64(y)
		case int64:
			n = y
		case uint8:
			n = int64(y)
		case uint16:
			n = int64(y)
		case uint32:
			n = int64(y)
		case uint64:
			if y > math.MaxInt64 {
				return fmt.Errorf("duration of %d milliseconds out of range", y)
			}
			n = int64(y)
		}
		out, err = durationMillis(float64(n))
	case float32:
		out, err = durationMillis(float64(x))
	case float64:
		out, err = durationMillis(x)
	default:
		return fmt.Errorf("duration must be a string like \"30m\" or milliseconds, got %T", v)
	}
	if err != nil {
		return err
	}
	*d = out
	return nil
}
