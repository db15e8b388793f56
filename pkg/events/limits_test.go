package events_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// hostile builds payloads shaped to hurt a decoder. They are shared by the
// table tests and the fuzz seeds.
type hostile struct{}

// mapOf encodes a msgpack map from alternating raw keys and raw values.
func (hostile) mapOf(kv ...[]byte) []byte {
	var b bytes.Buffer
	n := len(kv) / 2
	switch {
	case n < 16:
		b.WriteByte(0x80 | byte(n))
	default:
		b.WriteByte(0xde)
		_ = binary.Write(&b, binary.BigEndian, uint16(n))
	}
	for _, x := range kv {
		b.Write(x)
	}
	return b.Bytes()
}

func (hostile) str(s string) []byte {
	b, _ := msgpack.Marshal(s)
	return b
}

func (hostile) raw(v any) []byte {
	b, err := msgpack.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// nested is depth arrays (or maps with key "k") around nil.
func (hostile) nested(depth int, maps bool) []byte {
	var b bytes.Buffer
	b.Grow(depth*3 + 1)
	for range depth {
		if maps {
			b.Write([]byte{0x81, 0xa1, 'k'})
		} else {
			b.WriteByte(0x91)
		}
	}
	b.WriteByte(0xc0)
	return b.Bytes()
}

// outcome is a valid outcome with the given raw value under key.
func (h hostile) outcome(key string, value []byte) []byte {
	kv := [][]byte{h.str("id"), h.str("o-1"), h.str("agent"), h.str("a"), h.str("provider"), h.str("p")}
	return h.mapOf(append(kv, h.str(key), value)...)
}

// headersWith is an outcome whose headers map holds value under "x".
func (h hostile) headersWith(value []byte) []byte {
	return h.outcome("headers", h.mapOf(h.str("x"), value))
}

func TestCheckMsgpackLimits(t *testing.T) {
	var h hostile
	huge := make([]byte, 5<<20)
	manyKeys := func(n int) []byte {
		var b bytes.Buffer
		b.WriteByte(0xdf)
		_ = binary.Write(&b, binary.BigEndian, uint32(n))
		for i := range n {
			b.WriteByte(0xcd) // uint16 key: not a string, still one value
			_ = binary.Write(&b, binary.BigEndian, uint16(i))
			b.WriteByte(0xc0)
		}
		return b.Bytes()
	}
	tests := []struct {
		name  string
		data  []byte
		want  error
		field string
	}{
		{"10k nested arrays in at", h.outcome("at", h.nested(10_000, false)), events.ErrTooDeep, "at"},
		{"2M nested arrays in at (the payload that killed failbus dev)", h.outcome("at", h.nested(2_000_000, false)), events.ErrTooDeep, "at"},
		{"8M nested arrays under an unknown key", h.outcome("zz", h.nested(8_000_000, false)), events.ErrTooDeep, "zz"},
		{"1M nested maps in origin", h.outcome("origin", h.nested(1_000_000, true)), events.ErrTooDeep, "origin"},
		{"100k nested arrays in a header value", h.headersWith(h.nested(100_000, false)), events.ErrTooDeep, "headers"},
		{"100k nested arrays in status", h.outcome("status", h.nested(100_000, false)), events.ErrTooDeep, "status"},
		{"nesting as the whole payload", h.nested(1_000_000, true), events.ErrTooDeep, "k"},
		{"array32 claiming 4G elements", h.outcome("body", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}), events.ErrTooManyEntries, "body"},
		{"array16 claiming more than the bytes left", h.outcome("body", []byte{0xdc, 0x10, 0x00, 0xc0}), events.ErrTruncated, "body"},
		{"map16 claiming 4096 entries with 2 bytes left", h.outcome("headers", []byte{0xde, 0x10, 0x00, 0xc0, 0xc0}), events.ErrTruncated, "headers"},
		{"str32 claiming 4 GB", h.outcome("body", []byte{0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}), events.ErrStringTooLong, "body"},
		{"str32 claiming 1 MB with 1 byte", h.outcome("body", []byte{0xdb, 0x00, 0x10, 0x00, 0x00, 'x'}), events.ErrTruncated, "body"},
		{"bin32 length cut off", h.outcome("body", []byte{0xc6, 0x00}), events.ErrTruncated, "body"},
		{"ext32 claiming 4 GB in at", h.outcome("at", []byte{0xc9, 0xff, 0xff, 0xff, 0xff, 0xff}), events.ErrStringTooLong, "at"},
		{"5 MiB body", h.outcome("body", h.raw(string(huge))), events.ErrStringTooLong, "body"},
		{"map with 1M keys", h.outcome("headers", manyKeys(1_000_000)), events.ErrTooManyEntries, "headers"},
		{"uint64 max status", h.outcome("status", h.raw(uint64(math.MaxUint64))), events.ErrNumberRange, "status"},
		{"uint64 max request_tokens", h.outcome("request_tokens", h.raw(uint64(math.MaxUint64))), events.ErrNumberRange, "request_tokens"},
		{"0xc1 in a value", h.outcome("model", []byte{0xc1}), events.ErrMalformed, "model"},
		{"trailing bytes", append(h.outcome("model", h.str("m")), 0xc0), events.ErrMalformed, ""},
		{"payload cut in the middle", h.outcome("model", h.str("m"))[:10], events.ErrTruncated, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := events.CheckMsgpack(tt.data, events.Limits{})
			if !errors.Is(err, tt.want) {
				t.Fatalf("CheckMsgpack = %v, want %v", err, tt.want)
			}
			var le *events.LimitError
			if !errors.As(err, &le) {
				t.Fatalf("%T is not a *LimitError", err)
			}
			if tt.field != "" && le.Field != tt.field {
				t.Fatalf("field = %q, want %q (%v)", le.Field, tt.field, err)
			}
			if tt.field != "" && !strings.Contains(err.Error(), `"`+tt.field+`"`) {
				t.Fatalf("%q does not name the field", err)
			}
			// The decoders fail the same way, with the limit in the text.
			_, derr := events.Decode("failbus.outcome.p.a", nil, tt.data)
			if !errors.Is(derr, tt.want) {
				t.Fatalf("Decode = %v, want %v", derr, tt.want)
			}
		})
	}
}

func TestCheckMsgpackNamesTheLimit(t *testing.T) {
	var h hostile
	err := events.CheckMsgpack(h.outcome("at", h.nested(70, false)), events.Limits{})
	if got, want := err.Error(), `nesting too deep: "at": nesting depth exceeds the limit of 64 at byte`; !strings.HasPrefix(got, want) {
		t.Fatalf("error %q, want prefix %q", got, want)
	}
	err = events.CheckMsgpack(h.outcome("body", h.raw(strings.Repeat("x", 100))), events.Limits{MaxString: 10})
	if got, want := err.Error(), `string too long: "body": value of 100 bytes exceeds the limit of 10 bytes at byte`; !strings.HasPrefix(got, want) {
		t.Fatalf("error %q, want prefix %q", got, want)
	}
	err = events.CheckMsgpack(h.outcome("body", h.raw("x")), events.Limits{MaxBytes: 10})
	if !errors.Is(err, events.ErrTooLarge) || !strings.Contains(err.Error(), "exceeds the limit of 10 bytes") {
		t.Fatalf("error %v", err)
	}
}

func TestCheckMsgpackAcceptsWhatFailbusWrites(t *testing.T) {
	var h hostile
	deep := h.outcome("zz", h.nested(events.DefaultMaxDepth-1, false))
	if err := events.CheckMsgpack(deep, events.Limits{}); err != nil {
		t.Fatalf("depth %d: %v", events.DefaultMaxDepth, err)
	}
	o := sample()
	o.Body = strings.Repeat("b", events.DefaultMaxString-100)
	for i := range 1000 {
		o.Headers[strings.Repeat("h", i%50)+string(rune('a'+i%26))] = "v"
	}
	data, _, err := events.Encode(o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.Decode(events.OutcomeSubject(o.Provider, o.Agent), nil, data); err != nil {
		t.Fatalf("a 4 MiB body and many headers: %v", err)
	}
}

// TestDecodeHostileAllocatesLittle: rejecting a 2M-deep or length-lying
// payload costs next to nothing, because nothing is decoded.
func TestDecodeHostileAllocatesLittle(t *testing.T) {
	var h hostile
	for _, data := range [][]byte{
		h.outcome("at", h.nested(2_000_000, false)),
		h.outcome("zz", h.nested(2_000_000, true)),
		h.outcome("headers", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}),
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		if _, err := events.Decode("failbus.outcome.p.a", nil, data); err == nil {
			t.Fatal("accepted")
		}
		runtime.ReadMemStats(&after)
		if d := after.TotalAlloc - before.TotalAlloc; d > 64<<10 {
			t.Fatalf("rejecting %d bytes allocated %d bytes", len(data), d)
		}
	}
}

func TestTimeRanges(t *testing.T) {
	var h hostile
	far := time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC)
	tests := []struct {
		name string
		at   []byte
		want error // nil: accepted
	}{
		{"msgpack timestamp in year 292277026596", h.raw(time.Unix(math.MaxInt64/2, 0)), events.ErrTimeRange},
		{"msgpack timestamp in year 10000", h.raw(far.Add(time.Second)), events.ErrTimeRange},
		{"msgpack timestamp at the end of 9999", h.raw(far), nil},
		{"epoch ms above year 9999", h.raw(int64(253402300800000)), events.ErrTimeRange},
		{"uint64 epoch ms", h.raw(uint64(math.MaxInt64)), events.ErrTimeRange},
		{"float epoch ms", h.raw(1e300), events.ErrTimeRange},
		{"RFC 3339 year 0000", h.str("0000-01-01T00:00:00Z"), events.ErrTimeRange},
		{"a map", h.raw(map[string]int{"a": 1}), nil},
		{"an array", h.raw([]int{1, 2}), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := events.Decode("failbus.outcome.p.a", nil, h.outcome("at", tt.at))
			switch {
			case strings.HasPrefix(tt.name, "a"):
				if err == nil || !strings.Contains(err.Error(), `"at"`) {
					t.Fatalf("got %v, want an error naming at", err)
				}
			case tt.want == nil && err != nil:
				t.Fatalf("rejected: %v", err)
			case tt.want != nil && !errors.Is(err, tt.want):
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestOutcomeBounds(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(o *events.Outcome)
		field string
	}{
		{"id with a line break would break the Nats-Msg-Id header", func(o *events.Outcome) { o.ID = "a\r\nNats-Msg-Id: b" }, "id"},
		{"id of 1 kB", func(o *events.Outcome) { o.ID = strings.Repeat("i", 1000) }, "id"},
		{"provider of 1 kB", func(o *events.Outcome) { o.Provider = strings.Repeat("p", 1000) }, "provider"},
		{"request_tokens beyond 2^40", func(o *events.Outcome) { o.RequestTokens = events.MaxTokens + 1 }, "request_tokens"},
		{"negative context_window", func(o *events.Outcome) { o.ContextWindow = -1 }, "context_window"},
		{"an API key as the profile name", func(o *events.Outcome) { o.Profile = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx" }, "profile"},
		{"a JWT as the session", func(o *events.Outcome) { o.Session = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjMifQ.c2ln" }, "session"},
		{"a URL with a password as the provider", func(o *events.Outcome) { o.Provider = "https://svc:hunter2pass@gw.internal" }, "provider"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := sample()
			tt.edit(o)
			var fe *events.FieldError
			if err := o.Validate(); !errors.As(err, &fe) || fe.Field != tt.field {
				t.Fatalf("Validate = %v, want a field error on %s", err, tt.field)
			}
		})
	}
}

func TestPayloadID(t *testing.T) {
	var h hostile
	if got := events.PayloadID("failbus.outcome.p.a", nil, h.outcome("model", h.str("m"))); got != "o-1" {
		t.Fatalf("PayloadID = %q", got)
	}
	late := h.mapOf(h.str("zz"), h.nested(30, false), h.str("body"), h.raw(strings.Repeat("x", 70_000)), h.str("id"), h.str("o-9"))
	if got := events.PayloadID("failbus.outcome.p.a", nil, late); got != "o-9" {
		t.Fatalf("PayloadID after nested values = %q", got)
	}
	for name, data := range map[string][]byte{
		"deep before id":  h.mapOf(h.str("zz"), h.nested(100_000, false), h.str("id"), h.str("o-9")),
		"id not a string": h.mapOf(h.str("id"), h.raw(7)),
		"id with CR LF":   h.mapOf(h.str("id"), h.str("x\r\ny")),
		"no id":           h.mapOf(h.str("agent"), h.str("a")),
		"not a map":       h.raw([]int{1}),
		"empty":           nil,
	} {
		if got := events.PayloadID("failbus.outcome.p.a", nil, data); got != "" {
			t.Errorf("%s: PayloadID = %q, want none", name, got)
		}
	}
}

func TestEventTime(t *testing.T) {
	stored := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		at       events.Time
		want     time.Time
		believed bool
	}{
		{"on time", events.At(stored.Add(-time.Second)), stored.Add(-time.Second), true},
		{"a buffered outcome a day late", events.At(stored.Add(-24 * time.Hour)), stored.Add(-24 * time.Hour), true},
		{"a clock 30 s fast counts as the stored time", events.At(stored.Add(30 * time.Second)), stored, true},
		{"two minutes ahead is not believed", events.At(stored.Add(2 * time.Minute)), stored, false},
		{"year 9999 moves nothing", events.At(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)), stored, false},
		{"older than the outcome stream keeps", events.At(stored.Add(-31 * 24 * time.Hour)), stored, false},
		{"absent", events.Time{}, stored, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, believed := events.EventTime(tt.at, stored)
			if !got.Equal(tt.want) || believed != tt.believed {
				t.Fatalf("EventTime = %v, %v; want %v, %v", got, believed, tt.want, tt.believed)
			}
			if got.After(stored) {
				t.Fatalf("%v is after the stored time", got)
			}
		})
	}
}

// TestErrorsDoNotRepeatSecrets: a dead letter's reason is the decoder's
// error; a credential in the wrong field is masked there.
func TestErrorsDoNotRepeatSecrets(t *testing.T) {
	var h hostile
	const key = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
	for name, data := range map[string][]byte{
		"refusal_scope": h.outcome("refusal_scope", h.str(key)),
		"at":            h.outcome("at", h.str("Bearer "+key)),
		"profile":       h.outcome("profile", h.str(key)),
		"unknown key":   h.mapOf(h.str(key), h.nested(100, false)),
		"url password":  h.outcome("at", h.str("postgres://svc:S3cr3t-PASSWORD@db/app")),
	} {
		_, err := events.Decode("failbus.outcome.p.a", nil, data)
		if err == nil {
			t.Fatalf("%s: accepted", name)
		}
		if strings.Contains(err.Error(), key[8:]) || strings.Contains(err.Error(), "S3cr3t-PASSWORD") {
			t.Errorf("%s: %q repeats the secret", name, err)
		}
	}
}
