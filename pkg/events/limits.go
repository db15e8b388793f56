package events

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/pkg/redact"
)

// Defaults of Limits. A failbus message is a flat map with a few small
// nested values (headers, origin, labels), so these leave room for large
// bodies and generous pass-through payloads while bounding what one message
// can cost to decode: at most defaultMaxValues values (a few MB of Go
// objects) and no recursion deeper than defaultMaxDepth.
const (
	// defaultMaxBytes is the largest payload decoded: 8 MiB, the
	// max_payload `failbus dev` gives its server (nats-server's own default
	// is 1 MiB, which then bounds first).
	defaultMaxBytes = 8 << 20
	// defaultMaxDepth is the deepest nesting of arrays and maps, the
	// payload's own map counting as 1.
	defaultMaxDepth = 64
	// defaultMaxEntries is the most elements of one array or entries of one
	// map.
	defaultMaxEntries = 65_536
	// defaultMaxValues is the most values in one payload, keys and
	// containers included: it bounds the objects a decode can allocate.
	defaultMaxValues = 262_144
	// DefaultMaxString is the longest string, binary or extension value:
	// 4 MiB.
	DefaultMaxString = 4 << 20
)

// Errors for payloads outside Limits or the ranges failbus accepts. Each is
// the Err of a *LimitError, which says by how much and where; use errors.Is.
// A service dead-letters such input with the error's text as the reason, so
// the limit is named there.
var (
	// errTooLarge: the payload exceeds Limits.MaxBytes.
	errTooLarge = errors.New("payload too large")
	// errTooDeep: arrays and maps nest deeper than Limits.MaxDepth.
	errTooDeep = errors.New("nesting too deep")
	// errTooManyEntries: one array or map exceeds Limits.MaxEntries.
	errTooManyEntries = errors.New("too many entries in one array or map")
	// errTooManyValues: the payload holds more than Limits.MaxValues values.
	errTooManyValues = errors.New("too many values")
	// errStringTooLong: a string, binary or extension value exceeds
	// Limits.MaxString.
	errStringTooLong = errors.New("string too long")
	// errTruncated: a length or count claims more bytes than the payload
	// has left (a lying length), or the payload ends inside a value.
	errTruncated = errors.New("truncated payload or lying length")
	// ErrMalformed: bytes msgpack never produces (0xc1), or trailing bytes
	// after the message.
	ErrMalformed = errors.New("malformed msgpack")
	// errNumberRange: an integer outside what failbus stores (above
	// 2^63-1), or a count outside a field's bound. Integers are never
	// wrapped around.
	errNumberRange = errors.New("number out of range")
	// errTimeRange: a time outside years 0001–9999, whatever its shape.
	errTimeRange = errors.New("time out of range")
)

// limitError says which limit a payload broke, by how much and where.
type limitError struct {
	// Err is the sentinel: errTooLarge, errTooDeep, ...
	Err error
	// Limit is the bound that was exceeded (for errTruncated: the bytes
	// that were left).
	Limit int64
	// Got is what the payload had or claimed.
	Got int64
	// Field is the top-level key whose value broke the limit, when there is
	// one (at most 64 bytes of it).
	Field string
	// Offset is the byte offset in the payload where the offending value
	// starts.
	Offset int
}

func (e *limitError) Error() string {
	var s string
	switch {
	case errors.Is(e.Err, errTooLarge):
		s = fmt.Sprintf("payload of %d bytes exceeds the limit of %d bytes", e.Got, e.Limit)
	case errors.Is(e.Err, errTooDeep):
		s = fmt.Sprintf("nesting depth exceeds the limit of %d", e.Limit)
	case errors.Is(e.Err, errTooManyEntries):
		s = fmt.Sprintf("array or map of %d entries exceeds the limit of %d", e.Got, e.Limit)
	case errors.Is(e.Err, errTooManyValues):
		s = fmt.Sprintf("more than the limit of %d values", e.Limit)
	case errors.Is(e.Err, errStringTooLong):
		s = fmt.Sprintf("value of %d bytes exceeds the limit of %d bytes", e.Got, e.Limit)
	case errors.Is(e.Err, errTruncated):
		s = fmt.Sprintf("needs %d bytes, %d left", e.Got, e.Limit)
	case errors.Is(e.Err, errNumberRange):
		s = fmt.Sprintf("integer %s exceeds the limit of %d", strconv.FormatUint(uint64(e.Got), 10), e.Limit)
	case errors.Is(e.Err, ErrMalformed) && e.Got == 0:
		s = "trailing bytes after the message"
	case errors.Is(e.Err, ErrMalformed):
		s = fmt.Sprintf("byte 0x%02x is not msgpack", e.Got)
	}
	if e.Field != "" {
		s = strconv.Quote(redact.String(e.Field)) + ": " + s
	}
	if s == "" {
		return fmt.Sprintf("%s at byte %d", e.Err, e.Offset)
	}
	return fmt.Sprintf("%s: %s at byte %d", e.Err, s, e.Offset)
}

func (e *limitError) Unwrap() error { return e.Err }

// Limits bound what decoding one payload may cost. They are checked by a
// pre-scan of the msgpack bytes (CheckMsgpack) before anything is decoded:
// the scan does not recurse and allocates nothing that depends on the
// input, and it rejects a length or count that claims more bytes than the
// payload has, so neither recursion nor allocation follows a lying length.
// The zero value of each field selects its default (DefaultMaxBytes, ...);
// a negative value is treated as the default too.
type Limits struct {
	// MaxBytes is the largest payload. Defaults to defaultMaxBytes (8 MiB).
	MaxBytes int
	// MaxDepth is the deepest nesting of arrays and maps, the top-level map
	// counting as 1. Defaults to defaultMaxDepth (64).
	MaxDepth int
	// MaxEntries is the most elements of one array or entries of one map.
	// Defaults to defaultMaxEntries (65 536).
	MaxEntries int
	// MaxValues is the most values in the payload, map keys and the
	// containers themselves included. Defaults to defaultMaxValues
	// (262 144).
	MaxValues int
	// MaxString is the longest string, binary or extension value in bytes.
	// Defaults to DefaultMaxString (4 MiB).
	MaxString int
}

func (l Limits) resolve() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.MaxBytes, defaultMaxBytes)
	def(&l.MaxDepth, defaultMaxDepth)
	def(&l.MaxEntries, defaultMaxEntries)
	def(&l.MaxValues, defaultMaxValues)
	def(&l.MaxString, DefaultMaxString)
	return l
}

// scanFrame is one open array or map of the pre-scan: how many values
// (keys and values, for a map) are still to come.
type scanFrame struct {
	left  int
	isMap bool
}

// maxFieldName is how much of a top-level key a limitError repeats.
const maxFieldName = 64

// CheckMsgpack checks that data is exactly one msgpack value within lim,
// without decoding it: it walks the bytes once with an explicit stack (at
// most lim.MaxDepth frames), so a payload nested two million levels deep is
// rejected after MaxDepth+1 headers, and a length that claims more than the
// bytes left is rejected before anything would allocate it. Integers above
// 2^63-1 are rejected too (they would wrap around in an int field). The
// error is a *LimitError naming the limit, the top-level field and the byte
// offset.
func CheckMsgpack(data []byte, lim Limits) error {
	lim = lim.resolve()
	if len(data) > lim.MaxBytes {
		return &limitError{Err: errTooLarge, Limit: int64(lim.MaxBytes), Got: int64(len(data))}
	}
	// failbus messages nest three deep at most (the top map, a map or
	// list in it, its elements); deeper input grows the stack.
	s := scanner{data: data, lim: lim, stack: make([]scanFrame, 0, min(lim.MaxDepth, 4))}
	if err := s.run(); err != nil {
		return err
	}
	if s.pos != len(data) {
		return s.fail(ErrMalformed, 0, 0, s.pos)
	}
	return nil
}

// scanner is the state of one CheckMsgpack.
type scanner struct {
	data   []byte
	lim    Limits
	pos    int
	values int
	stack  []scanFrame
	// field is where the last key read from a top-level map lies in
	// data (the bytes, not a string: made only for an error); topKey is
	// true while that key itself is being read.
	fieldFrom, fieldTo int
	topKey             bool
}

func (s *scanner) fail(err error, limit, got int64, at int) error {
	e := &limitError{Err: err, Limit: limit, Got: got, Offset: at}
	if len(s.stack) > 0 && s.stack[0].isMap && (len(s.stack) > 1 || !s.topKey) {
		e.Field = string(s.data[s.fieldFrom:s.fieldTo])
	}
	return e
}

// uint reads an n-byte big-endian unsigned number at pos.
func (s *scanner) uint(n int, start int) (uint64, error) {
	if len(s.data)-s.pos < n {
		return 0, s.fail(errTruncated, int64(len(s.data)-s.pos), int64(n), start)
	}
	var v uint64
	for _, b := range s.data[s.pos : s.pos+n] {
		v = v<<8 | uint64(b)
	}
	s.pos += n
	return v, nil
}

// run scans one value from pos; bytes after it are the caller's business.
func (s *scanner) run() error {
	for first := true; first || len(s.stack) > 0; first = false {
		if !first {
			top := &s.stack[len(s.stack)-1]
			if top.left == 0 {
				s.stack = s.stack[:len(s.stack)-1] // done: the parent is next
				continue
			}
			top.left--
			// In the top-level map, a key leaves an odd count behind.
			s.topKey = len(s.stack) == 1 && top.isMap && top.left%2 == 1
		}
		if err := s.value(); err != nil {
			return err
		}
	}
	return nil
}

// value scans the value at pos: a scalar is skipped, a container is pushed.
func (s *scanner) value() error {
	start := s.pos
	if s.pos >= len(s.data) {
		return s.fail(errTruncated, 0, 1, start)
	}
	s.values++
	if s.values > s.lim.MaxValues {
		return s.fail(errTooManyValues, int64(s.lim.MaxValues), int64(s.values), start)
	}
	c := s.data[s.pos]
	s.pos++
	var (
		n      uint64 // bytes that follow (isBytes) or values (isCont)
		fixed  int    // a fixed number of bytes follows
		width  int    // width of a length or count that follows
		isStr  bool
		isByte bool
		isCont bool
		isMap  bool
	)
	switch {
	case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3: // fixint, nil, bool
	case c <= 0x8f: // fixmap
		n, isCont, isMap = uint64(c&0x0f), true, true
	case c <= 0x9f: // fixarray
		n, isCont = uint64(c&0x0f), true
	case c <= 0xbf: // fixstr
		n, isByte, isStr = uint64(c&0x1f), true, true
	case c == 0xc1:
		return s.fail(ErrMalformed, 0, int64(c), start)
	case c <= 0xc6: // bin8, bin16, bin32
		width, isByte = 1<<(c-0xc4), true
	case c <= 0xc9: // ext8, ext16, ext32: length, then a type byte
		width, isByte, fixed = 1<<(c-0xc7), true, 1
	case c == 0xca:
		fixed = 4
	case c == 0xcb:
		fixed = 8
	case c <= 0xcf: // uint8 ... uint64
		v, err := s.uint(1<<(c-0xcc), start)
		if err != nil {
			return err
		}
		if v > math.MaxInt64 {
			return s.fail(errNumberRange, math.MaxInt64, int64(v), start)
		}
		return nil
	case c <= 0xd3: // int8 ... int64
		fixed = 1 << (c - 0xd0)
	case c <= 0xd8: // fixext1 ... fixext16: type byte, then data
		fixed = 1 + 1<<(c-0xd4)
	case c <= 0xdb: // str8, str16, str32
		width, isByte, isStr = 1<<(c-0xd9), true, true
	case c <= 0xdd: // array16, array32
		width, isCont = 2<<(c-0xdc), true
	default: // map16, map32
		width, isCont, isMap = 2<<(c-0xde), true, true
	}
	if width > 0 {
		v, err := s.uint(width, start)
		if err != nil {
			return err
		}
		n = v
	}
	if s.topKey {
		s.fieldFrom, s.fieldTo = 0, 0
	}
	left := uint64(len(s.data) - s.pos)
	switch {
	case isByte:
		n += uint64(fixed)
		if n > uint64(s.lim.MaxString) {
			return s.fail(errStringTooLong, int64(s.lim.MaxString), clampInt64(n), start)
		}
		if n > left {
			return s.fail(errTruncated, int64(left), clampInt64(n), start)
		}
		if s.topKey && isStr {
			s.fieldFrom, s.fieldTo = s.pos, s.pos+int(min(n, maxFieldName))
		}
		s.pos += int(n)
	case isCont:
		if n > uint64(s.lim.MaxEntries) {
			return s.fail(errTooManyEntries, int64(s.lim.MaxEntries), clampInt64(n), start)
		}
		if isMap {
			n *= 2
		}
		// Every value takes at least one byte: a count above the bytes left
		// is a lie, rejected before anything sizes a slice by it.
		if n > left {
			return s.fail(errTruncated, int64(left), clampInt64(n), start)
		}
		if len(s.stack) >= s.lim.MaxDepth {
			return s.fail(errTooDeep, int64(s.lim.MaxDepth), int64(len(s.stack)+1), start)
		}
		s.stack = append(s.stack, scanFrame{left: int(n), isMap: isMap})
	case fixed > 0:
		if uint64(fixed) > left {
			return s.fail(errTruncated, int64(left), int64(fixed), start)
		}
		s.pos += fixed
	}
	return nil
}

func clampInt64(n uint64) int64 {
	if n > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(n)
}

// PayloadID returns the `id` of a message whose type is identified by it
// (an Outcome, CONTRACT.md: "unique per call attempt"; a Task), read from the
// payload without decoding the rest, or "" when the message has no such
// type, no such key, or an id that could not be a valid one. Services key
// exactly-once on it instead of on the publisher's Nats-Msg-Id header,
// which a publisher may leave out or set to something else. The payload is
// read within the default Limits and never recursively.
func PayloadID(subject string, h nats.Header, data []byte) string {
	name, _, err := contract.schemaOf(subject, h)
	if err != nil || !identifiedByID(name) {
		return ""
	}
	v, ok := peekString(data, "id", Limits{}.resolve())
	if !ok || checkID(v) != nil || notACredential(v) != nil {
		return ""
	}
	return v
}

// identifiedByID reports whether messages of the schema carry their
// identity in an `id` key: outcomes and tasks (CONTRACT.md: the id is
// also the Nats-Msg-Id).
func identifiedByID(schema string) bool { return schema == SchemaOutcome || schema == SchemaTask }

// peekString returns the string value of key in the top-level msgpack map
// data, scanning (never decoding) the values before it.
func peekString(data []byte, key string, lim Limits) (string, bool) {
	if len(data) == 0 {
		return "", false
	}
	s := scanner{data: data, lim: lim}
	c := data[0]
	var n uint64
	switch {
	case c >= 0x80 && c <= 0x8f:
		n, s.pos = uint64(c&0x0f), 1
	case c == 0xde || c == 0xdf:
		s.pos = 1
		v, err := s.uint(2<<(c-0xde), 0)
		if err != nil {
			return "", false
		}
		n = v
	default:
		return "", false
	}
	for range min(n, uint64(lim.MaxEntries)) {
		k, ok := s.str()
		if !ok {
			return "", false
		}
		if k == key {
			v, ok := s.str()
			return v, ok
		}
		s.stack = s.stack[:0]
		if err := s.run(); err != nil {
			return "", false
		}
	}
	return "", false
}

// str reads a msgpack string at pos.
func (s *scanner) str() (string, bool) {
	if s.pos >= len(s.data) {
		return "", false
	}
	c := s.data[s.pos]
	var n uint64
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = uint64(c & 0x1f)
		s.pos++
	case c >= 0xd9 && c <= 0xdb:
		s.pos++
		v, err := s.uint(1<<(c-0xd9), s.pos-1)
		if err != nil {
			return "", false
		}
		n = v
	default:
		return "", false
	}
	if n > uint64(len(s.data)-s.pos) || n > uint64(s.lim.MaxString) {
		return "", false
	}
	v := string(s.data[s.pos : s.pos+int(n)])
	s.pos += int(n)
	return v, true
}
