package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/wire"
	"github.com/failbus/failbus/pkg/redact"
)

// Header names failbus sets on every message it writes.
const (
	// HeaderSchema names a payload's type and version, e.g. "outcome/1", so
	// old records stay readable after a type evolves.
	HeaderSchema = "Failbus-Schema"
	// HeaderContentType is always ContentTypeMsgpack on the bus.
	HeaderContentType = "Content-Type"
	// ContentTypeMsgpack is the payload encoding of every failbus message.
	ContentTypeMsgpack = "application/msgpack"
	// HeaderMsgID is JetStream's dedupe header.
	HeaderMsgID = nats.MsgIdHdr
)

// Schema names for the Failbus-Schema header.
const (
	SchemaOutcome        = "outcome"
	SchemaClassification = "classification"
	SchemaDecision       = "decision"
	SchemaRetryDue       = "retry_due"
	SchemaHealth         = "health"
	SchemaNotification   = "notification"
	SchemaBoundary       = "boundary"
	SchemaDeadLetter     = "dead_letter"
	SchemaHeartbeat      = "heartbeat"
	SchemaCronSpec       = "cron_spec"
	SchemaCronRun        = "cron_run"
	SchemaWrite          = "write"
	SchemaTask           = "task"
	SchemaDispatch       = "dispatch"
	SchemaControl        = "control"
	SchemaRecovery       = "recovery"
)

// Message is a failbus wire type: it knows its schema name and can check its
// own required fields.
type Message interface {
	// SchemaName is the type half of the Failbus-Schema header.
	SchemaName() string
	// Validate reports the first missing or invalid field as a *FieldError.
	Validate() error
}

// CurrentVersion is the version this code writes for every schema. A reader
// accepts every version up to it.
const CurrentVersion = 1

// ErrNotFailbus reports a payload that is not a failbus message at all: not
// msgpack, or an unknown schema.
var ErrNotFailbus = errors.New("not a failbus message")

// FieldError names the field that made a message invalid, so a dead letter
// says what to fix.
type FieldError struct {
	Field   string
	Problem string
	// Err is the cause when it is one callers can test for with errors.Is
	// (ErrTimeRange, errNumberRange, ...); nil otherwise.
	Err error
}

// Error names the field and the problem. A problem that quotes the input
// is masked by redact.String, so a dead letter's reason or a log line
// never repeats a credential that was put in the wrong field.
func (e *FieldError) Error() string {
	return fmt.Sprintf("field %q: %s", redact.String(e.Field), redact.String(e.Problem))
}

// Unwrap returns the cause, if any.
func (e *FieldError) Unwrap() error { return e.Err }

func required(field, v string) error {
	if strings.TrimSpace(v) == "" {
		return &FieldError{Field: field, Problem: "required"}
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// schemaHeader is the Failbus-Schema value for m at the current version:
// the one its type's table entry holds (built once, not per message), or
// built here for a type outside the table.
func schemaHeader(m Message) string {
	name := m.SchemaName()
	if h, ok := contract.header[name]; ok {
		return h
	}
	return name + "/" + strconv.Itoa(CurrentVersion)
}

// ParseSchemaHeader splits "name/version". A value without a version is
// version 1.
func ParseSchemaHeader(v string) (name string, version int, err error) {
	name, ver, found := strings.Cut(strings.TrimSpace(v), "/")
	if !found {
		return name, 1, nil
	}
	version, err = strconv.Atoi(ver)
	if err != nil || version < 1 {
		return "", 0, fmt.Errorf("schema header %q: bad version", v)
	}
	return name, version, nil
}

// Marshal encodes m as msgpack. Most callers want Encode, which also builds
// the headers.
func Marshal(m Message) ([]byte, error) {
	data, err := wire.Marshal(m, func(enc *msgpack.Encoder) { enc.UseCompactInts(true) })
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", m.SchemaName(), err)
	}
	return data, nil
}

// Encode validates m and returns its msgpack payload and the headers every
// failbus message carries (schema, content type). The caller adds
// Nats-Msg-Id.
func Encode(m Message) ([]byte, nats.Header, error) {
	if err := m.Validate(); err != nil {
		return nil, nil, fmt.Errorf("invalid %s: %w", m.SchemaName(), err)
	}
	data, err := Marshal(m)
	if err != nil {
		return nil, nil, err
	}
	h := nats.Header{}
	h.Set(HeaderSchema, schemaHeader(m))
	h.Set(HeaderContentType, ContentTypeMsgpack)
	return data, h, nil
}

// schemaOf reads the schema of a message on subject: the subject's type
// when the message has no Failbus-Schema header (CONTRACT.md: a subject
// carries one type, so a foreign client may omit the header), else the
// header's, which must then be the subject's type. On a subject without a
// type of its own (or subject "", when the caller does not know it) the
// header is required.
func (t *Types) schemaOf(subject string, h nats.Header) (string, int, error) {
	v := ""
	if h != nil {
		v = h.Get(HeaderSchema)
	}
	carried := t.SubjectSchema(subject)
	if v == "" {
		if carried == "" {
			if subject == "" {
				return "", 0, fmt.Errorf("%w: no %s header", ErrNotFailbus, HeaderSchema)
			}
			return "", 0, fmt.Errorf("%w: no %s header, and subject %s carries no failbus type", ErrNotFailbus, HeaderSchema, subject)
		}
		return carried, CurrentVersion, nil
	}
	name, ver, err := ParseSchemaHeader(v)
	if err != nil {
		return "", 0, err
	}
	if _, ok := t.bySchema[name]; !ok {
		return "", 0, fmt.Errorf("%w: unknown schema %q", ErrNotFailbus, name)
	}
	if carried != "" && name != carried {
		return "", 0, fmt.Errorf("%w: header %s %q names a %s, but %s carries %s", ErrSchemaMismatch, HeaderSchema, v, name, subject, carried)
	}
	if err := readable(name, ver); err != nil {
		return "", 0, err
	}
	return name, ver, nil
}

// readable refuses a schema version newer than this reader.
func readable(name string, ver int) error {
	if ver > CurrentVersion {
		return fmt.Errorf("schema %s version %d is newer than this reader (%d)", name, ver, CurrentVersion)
	}
	return nil
}

// ErrSchemaMismatch reports a Failbus-Schema header naming a type that does
// not belong on the message's subject (a decision published to an outcome
// subject): a dead letter with that reason, never read as the subject's type.
var ErrSchemaMismatch = errors.New("type does not belong on its subject")

// Decode reads a message from the bus: the subject picks the type (its
// Failbus-Schema header, when present, must agree; see schemaOf), the
// payload is msgpack, and the result is validated. Every error names what
// is wrong, and the field when it is one field. The payload must lie
// within the default Limits (a *LimitError otherwise). It knows the
// contract's types; Types.Decode knows a table's.
func Decode(subject string, h nats.Header, data []byte) (Message, error) {
	return contract.decodeLimits(subject, h, data, Limits{})
}

// DecodeLimits is Decode within lim.
func DecodeLimits(subject string, h nats.Header, data []byte, lim Limits) (Message, error) {
	return contract.decodeLimits(subject, h, data, lim)
}

// Decode is the package's Decode with the types of t.
func (t *Types) Decode(subject string, h nats.Header, data []byte) (Message, error) {
	return t.decodeLimits(subject, h, data, Limits{})
}

// decodeLimits is Types.Decode within lim.
func (t *Types) decodeLimits(subject string, h nats.Header, data []byte, lim Limits) (Message, error) {
	name, _, err := t.schemaOf(subject, h)
	if err != nil {
		return nil, err
	}
	m := t.New(name)
	if err := decodeInto(subject, h, data, m, lim, t.SubjectSchema(subject) == name); err != nil {
		return nil, err
	}
	return m, nil
}

// decodeInto reads data into m and validates it; carried is whether
// subject is one of the subjects of m's type (so an agent's record on it
// must name the subject's agent).
func decodeInto(subject string, h nats.Header, data []byte, m Message, lim Limits, carried bool) error {
	if ct := h.Get(HeaderContentType); ct != "" && !strings.HasPrefix(ct, ContentTypeMsgpack) {
		return fmt.Errorf("%w: content type %q, want %s", ErrNotFailbus, ct, ContentTypeMsgpack)
	}
	name := m.SchemaName()
	if err := unmarshalLimits(data, m, lim); err != nil {
		return err
	}
	if err := m.Validate(); err != nil {
		return fmt.Errorf("invalid %s: %w", name, err)
	}
	if carried {
		if err := checkSender(subject, m); err != nil {
			return fmt.Errorf("invalid %s: %w", name, err)
		}
	}
	return nil
}

// DecodeAs decodes a message on subject that must be of type T (for
// example a consumer that only reads Outcomes). T is a pointer to a
// contract type, read as Decode reads it, or to a record type of the
// caller's own: then its Failbus-Schema header, when present, must name
// T's schema, the subject must not carry a contract type, and the subject
// is taken to carry T (an agent's record must name the subject's agent).
// No table is needed for a type the caller names.
func DecodeAs[T Message](subject string, h nats.Header, data []byte) (T, error) {
	var zero T
	rt := reflect.TypeFor[T]()
	if rt.Kind() != reflect.Pointer {
		return zero, fmt.Errorf("events: DecodeAs needs a pointer type, got %s", rt)
	}
	want := reflect.Zero(rt).Interface().(T).SchemaName()
	if _, known := contract.bySchema[want]; known {
		m, err := contract.Decode(subject, h, data)
		if err != nil {
			return zero, err
		}
		t, ok := m.(T)
		if !ok {
			return zero, fmt.Errorf("%w: got a %s message on %s, want %s", ErrSchemaMismatch, m.SchemaName(), subject, want)
		}
		return t, nil
	}
	if v := h.Get(HeaderSchema); v != "" {
		name, ver, err := ParseSchemaHeader(v)
		if err != nil {
			return zero, err
		}
		if name != want {
			return zero, fmt.Errorf("%w: header %s %q names a %s, want %s on %s", ErrSchemaMismatch, HeaderSchema, v, name, want, subject)
		}
		if err := readable(name, ver); err != nil {
			return zero, err
		}
	}
	if carried := contract.SubjectSchema(subject); carried != "" {
		return zero, fmt.Errorf("%w: %s carries %s, want %s", ErrSchemaMismatch, subject, carried, want)
	}
	m := reflect.New(rt.Elem()).Interface().(T)
	if err := decodeInto(subject, h, data, m, Limits{}, true); err != nil {
		return zero, err
	}
	return m, nil
}

// Unmarshal decodes a msgpack payload into m within the default Limits,
// naming the offending field on a type error. It does not validate.
func Unmarshal(data []byte, m Message) error { return unmarshalLimits(data, m, Limits{}) }

// unmarshalLimits is Unmarshal within lim: the payload is pre-scanned by
// CheckMsgpack, so a payload beyond a limit is rejected with a *LimitError
// before msgpack decodes (and allocates) anything.
func unmarshalLimits(data []byte, m Message, lim Limits) error {
	if len(data) == 0 {
		return fmt.Errorf("%w: empty payload", ErrNotFailbus)
	}
	if !wire.IsMsgpackMap(data) {
		return fmt.Errorf("%w: payload is not a msgpack map (first byte 0x%02x)", ErrNotFailbus, data[0])
	}
	if err := CheckMsgpack(data, lim); err != nil {
		return err
	}
	d := decoders.Get().(*pooledDecoder)
	defer d.put(len(data))
	d.r.Reset(data)
	d.dec.Reset(&d.r)
	if err := d.dec.Decode(m); err != nil {
		if f, raw := msgpackField(data, m); f != "" {
			return &FieldError{Field: f, Problem: typeProblem(err, raw), Err: causeOf(err)}
		}
		return fmt.Errorf("%w: decode %s: %s", ErrNotFailbus, m.SchemaName(), cleanErr(err))
	}
	return nil
}

// decoders keeps msgpack decoders with their readers between Unmarshal
// calls, as wire.Marshal keeps encoders: every message a service reads is
// decoded once.
var decoders = sync.Pool{New: func() any {
	d := &pooledDecoder{}
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}}

type pooledDecoder struct {
	r   bytes.Reader
	dec *msgpack.Decoder
}

// put drops the payload (the pool must not keep it alive) and returns d,
// unless the payload was large: the decoder keeps the last strings it
// read in a buffer of its own, which must not stay grown (or hold a large
// body) in the pool.
func (d *pooledDecoder) put(payload int) {
	d.r.Reset(nil)
	d.dec.Reset(&d.r)
	if payload > wire.MaxPooledBuffer {
		return
	}
	decoders.Put(d)
}

// msgpackField finds which key of a msgpack map fails to decode into m's
// type, by decoding the keys one at a time, and returns it with its value.
// It runs only on the error path.
func msgpackField(data []byte, m Message) (string, msgpack.RawMessage) {
	var raw map[string]msgpack.RawMessage
	if err := msgpack.Unmarshal(data, &raw); err != nil {
		return "", nil
	}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		one, err := msgpack.Marshal(map[string]msgpack.RawMessage{k: raw[k]})
		if err != nil {
			continue
		}
		probe := fresh(m)
		if err := msgpack.Unmarshal(one, probe); err != nil {
			return k, raw[k]
		}
	}
	return "", nil
}

// typeProblem words a field's decode error for the person who sent it:
// msgpack's "invalid code=a5 decoding int64" is "want an integer, got a
// string" (the kind the field takes, the kind of the value sent). Any
// other error keeps its own words.
func typeProblem(err error, value []byte) string {
	s := cleanErr(err)
	_, hint, found := strings.Cut(s, " decoding ")
	if !found || !strings.Contains(s, "code=") || len(value) == 0 {
		return s
	}
	want := map[string]string{
		"int64": "an integer", "uint64": "an integer", "float32": "a number", "float64": "a number",
		"bool": "true or false", "string/bytes length": "a string", "array length": "a list",
		"map length": "a map", "nil": "nothing",
	}[hint]
	got := msgpackKind(value[0])
	if want == "" || got == "" {
		return s
	}
	return "want " + want + ", got " + got
}

// msgpackKind names the kind of msgpack value whose first byte is b.
func msgpackKind(b byte) string {
	switch {
	case b <= 0x7f || b >= 0xe0 || b >= 0xcc && b <= 0xd3:
		return "an integer"
	case b <= 0x8f || b == 0xde || b == 0xdf:
		return "a map"
	case b <= 0x9f || b == 0xdc || b == 0xdd:
		return "a list"
	case b <= 0xbf || b >= 0xd9 && b <= 0xdb:
		return "a string"
	case b == 0xc0:
		return "nil"
	case b == 0xc2 || b == 0xc3:
		return "a boolean"
	case b == 0xca || b == 0xcb:
		return "a number with a fraction"
	case b >= 0xc4 && b <= 0xc6:
		return "binary data"
	}
	return "an extension value" // 0xc7–0xc9, 0xd4–0xd8 (a timestamp, say)
}

// UnmarshalJSON decodes one JSON object into m (offline commands), naming the
// offending field on a type error. It does not validate.
func UnmarshalJSON(data []byte, m Message) error {
	if err := json.Unmarshal(data, m); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return &FieldError{Field: te.Field, Problem: fmt.Sprintf("cannot be a JSON %s", te.Value)}
		}
		var raw map[string]json.RawMessage
		if json.Unmarshal(data, &raw) == nil {
			keys := make([]string, 0, len(raw))
			for k := range raw {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				one, _ := json.Marshal(map[string]json.RawMessage{k: raw[k]})
				if e := json.Unmarshal(one, fresh(m)); e != nil {
					return &FieldError{Field: k, Problem: cleanErr(e)}
				}
			}
		}
		return fmt.Errorf("decode %s JSON: %w", m.SchemaName(), err)
	}
	return nil
}

// causeOf returns the failbus sentinel inside err, if any, so a field error
// still answers errors.Is(err, errTimeRange).
func causeOf(err error) error {
	for _, s := range []error{errTimeRange, errNumberRange} {
		if errors.Is(err, s) {
			return s
		}
	}
	return nil
}

func cleanErr(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "msgpack: ")
	s = strings.TrimPrefix(s, "json: ")
	return s
}

// ToJSON renders a bus message on subject as one JSON object: typed
// messages (by their header or their subject) with their own keys, anything
// else decoded generically. Operators use it to tail and audit.
func ToJSON(subject string, h nats.Header, data []byte) ([]byte, error) {
	return contract.ToJSON(subject, h, data)
}

// ToJSON is the package's ToJSON with the types of t.
func (t *Types) ToJSON(subject string, h nats.Header, data []byte) ([]byte, error) {
	if h.Get(HeaderSchema) != "" || t.SubjectSchema(subject) != "" {
		if m, err := t.Decode(subject, h, data); err == nil {
			return json.Marshal(m)
		}
	}
	b, err := MsgpackToJSON(data)
	if err != nil {
		if json.Valid(data) {
			return data, nil
		}
		if le := (*limitError)(nil); errors.As(err, &le) {
			return nil, err // it names the limit
		}
		return nil, fmt.Errorf("%w: neither msgpack nor JSON", ErrNotFailbus)
	}
	return b, nil
}

// MsgpackToJSON renders any msgpack value as JSON (map keys become
// strings). The whole payload must be one msgpack value: text such as
// "this is not msgpack" is not read as the number its first byte encodes.
func MsgpackToJSON(data []byte) ([]byte, error) {
	if err := CheckMsgpack(data, Limits{}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotFailbus, err)
	}
	r := bytes.NewReader(data)
	var v any
	if err := msgpack.NewDecoder(r).Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: not msgpack: %w", ErrNotFailbus, err)
	}
	if r.Len() > 0 {
		return nil, fmt.Errorf("%w: not msgpack: %d bytes after the first value", ErrNotFailbus, r.Len())
	}
	b, err := json.Marshal(jsonable(v))
	if err != nil {
		return nil, fmt.Errorf("render as JSON: %w", err)
	}
	return b, nil
}

// jsonable converts generic msgpack values (maps with interface keys) into
// something encoding/json accepts.
func jsonable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = jsonable(e)
		}
		return x
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = jsonable(e)
		}
		return out
	case []any:
		for i, e := range x {
			x[i] = jsonable(e)
		}
		return x
	}
	return v
}

// fresh is a new zero value of m's own type (a pointer), to decode one
// field into when finding which field a payload's error is in: m may be a
// type no table knows.
func fresh(m Message) any {
	t := reflect.TypeOf(m)
	if t.Kind() != reflect.Pointer {
		return reflect.New(t).Interface()
	}
	return reflect.New(t.Elem()).Interface()
}
