package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// refusalWire is the stored form of RefusalState, in msgpack (KV) and JSON
// with the same snake_case keys. Refusals is a pointer so that a value
// without the key (written before counts existed, or by something else) is
// told apart from a count of zero: it decodes as Legacy, i.e. frozen.
type refusalWire struct {
	Segment   string      `msgpack:"segment" json:"segment"`
	Provider  string      `msgpack:"provider" json:"provider"`
	Agent     string      `msgpack:"agent,omitempty" json:"agent,omitempty"`
	Refusals  *int        `msgpack:"refusals" json:"refusals"`
	RefusedAt events.Time `msgpack:"refused_at" json:"refused_at"`
	Increment string      `msgpack:"increment,omitempty" json:"increment,omitempty"`
	Rerenders int         `msgpack:"rerenders,omitempty" json:"rerenders,omitempty"`
}

func (s RefusalState) wire() refusalWire {
	w := refusalWire{
		Segment: s.Segment, Provider: s.Provider, Agent: s.Agent,
		RefusedAt: s.RefusedAt, Increment: s.Increment, Rerenders: s.Rerenders,
	}
	if !s.Legacy {
		n := s.Refusals
		w.Refusals = &n
	}
	return w
}

func (w refusalWire) state() RefusalState {
	s := RefusalState{
		Segment: w.Segment, Provider: w.Provider, Agent: w.Agent,
		RefusedAt: w.RefusedAt, Increment: w.Increment, Rerenders: w.Rerenders,
	}
	switch {
	case w.Refusals == nil || *w.Refusals < 0:
		s.Legacy = true // no usable count: frozen until a boundary
	case *w.Refusals > 0 && w.RefusedAt.IsZero():
		s.Refusals = *w.Refusals
		s.Legacy = true // a count without a time: nothing to measure from
	default:
		s.Refusals = *w.Refusals
	}
	return s
}

var (
	_ msgpack.CustomEncoder = RefusalState{}
	_ msgpack.CustomDecoder = (*RefusalState)(nil)
	_ json.Marshaler        = RefusalState{}
	_ json.Unmarshaler      = (*RefusalState)(nil)
)

// EncodeMsgpack writes the stored form; a Legacy state is written without a
// count (nil) so it stays frozen when read back.
func (s RefusalState) EncodeMsgpack(enc *msgpack.Encoder) error {
	w := s.wire()
	return enc.Encode(&w)
}

// DecodeMsgpack reads the stored form. The refusal time may be a msgpack
// timestamp, epoch milliseconds or an RFC 3339 string (events.Time). A value
// without a refusal count decodes as Legacy (frozen).
func (s *RefusalState) DecodeMsgpack(dec *msgpack.Decoder) error {
	var w refusalWire
	if err := dec.Decode(&w); err != nil {
		return fmt.Errorf("refusal state: %w", err)
	}
	*s = w.state()
	return nil
}

// MarshalJSON writes the stored form with the same keys as msgpack.
func (s RefusalState) MarshalJSON() ([]byte, error) { return json.Marshal(s.wire()) }

// UnmarshalJSON reads the stored form; the refusal time may be an RFC 3339
// string or epoch milliseconds. A value without a refusal count decodes as
// Legacy (frozen).
func (s *RefusalState) UnmarshalJSON(b []byte) error {
	var w refusalWire
	if err := json.Unmarshal(b, &w); err != nil {
		return fmt.Errorf("refusal state: %w", err)
	}
	*s = w.state()
	return nil
}

// EncodeRefusalState is the KV value of a state: msgpack, like everything on
// the bus.
func EncodeRefusalState(s RefusalState) ([]byte, error) {
	b, err := msgpack.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode refusal state %s/%s: %w", s.Segment, s.Provider, err)
	}
	return b, nil
}

// DecodeRefusalState reads a KV value written as msgpack or as JSON (an
// operator's `nats kv put`): JSON when the first non-space byte is '{',
// which can never start a msgpack map. A value that cannot be read at all
// still yields a usable answer: a Legacy (frozen) state, together with the
// error for the log. Unknown state is never read as "no refusal".
func DecodeRefusalState(data []byte) (RefusalState, error) {
	var s RefusalState
	var err error
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		err = json.Unmarshal(t, &s)
	} else {
		err = msgpack.Unmarshal(data, &s)
	}
	if err != nil {
		return RefusalState{Legacy: true}, fmt.Errorf("decode refusal state: %w", err)
	}
	return s, nil
}

// RefusalKey is the KV key of the state of provider in segment
// (`<session>#<n>`). KV keys allow only [-/_=.a-zA-Z0-9] and '.' separates
// tokens, so the key is three tokens `<session>.<n>.<provider>`, each escaped
// injectively: bytes outside [A-Za-z0-9_-] become `=XX` (upper-case hex),
// and an empty name is a lone `=`. Common ids stay readable in `nats kv ls`
// ("s-1.0.openai"), distinct names never share a key, and one session's
// states can be listed or watched with RefusalSessionFilter. A segment
// string that is not `<session>#<n>` with a canonical integer n is kept
// whole in the first token, with `=` as the second.
func RefusalKey(segment, provider string) string {
	session, n := segment, "="
	if i := strings.LastIndexByte(segment, '#'); i >= 0 {
		if v, err := strconv.Atoi(segment[i+1:]); err == nil && strconv.Itoa(v) == segment[i+1:] {
			session, n = segment[:i], segment[i+1:]
		}
	}
	return refusalKeyEscape(session) + "." + n + "." + refusalKeyEscape(provider)
}

// ParseRefusalKey inverts RefusalKey, so a service listing keys (to retire a
// session's earlier segments on a boundary) knows what each key holds.
func ParseRefusalKey(key string) (segment, provider string, err error) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 {
		return "", "", fmt.Errorf("refusal key %q: want 3 dot-separated tokens", key)
	}
	session, err := refusalKeyUnescape(parts[0])
	if err != nil {
		return "", "", fmt.Errorf("refusal key %q: session: %w", key, err)
	}
	provider, err = refusalKeyUnescape(parts[2])
	if err != nil {
		return "", "", fmt.Errorf("refusal key %q: provider: %w", key, err)
	}
	if parts[1] == "=" {
		return session, provider, nil
	}
	if v, err := strconv.Atoi(parts[1]); err != nil || strconv.Itoa(v) != parts[1] {
		return "", "", fmt.Errorf("refusal key %q: segment %q is not an integer", key, parts[1])
	}
	return session + "#" + parts[1], provider, nil
}

// RefusalSessionFilter is the KV key filter (`<session>.>`) matching every
// refusal state of one session, whatever the segment and provider: what a
// boundary must look at.
func RefusalSessionFilter(session string) string { return refusalKeyEscape(session) + ".>" }

// RefusalSegmentFilter is the KV key filter (`<session>.<n>.*`) matching
// every provider's state in one segment: what the notification dedupe key's
// provider list (RefusalPeers) is computed from.
func RefusalSegmentFilter(segment string) string {
	k := RefusalKey(segment, "")
	return k[:len(k)-1] + "*"
}

func refusalKeyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func refusalKeyEscape(s string) string {
	if s == "" {
		return "="
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if refusalKeyByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xF])
	}
	return b.String()
}

var errRefusalKeyEscape = errors.New("bad escape")

func refusalKeyUnescape(s string) (string, error) {
	if s == "=" {
		return "", nil
	}
	if s == "" {
		return "", fmt.Errorf("empty token: %w", errRefusalKeyEscape)
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if refusalKeyByte(c) {
			b.WriteByte(c)
			continue
		}
		if c != '=' || i+3 > len(s) {
			return "", fmt.Errorf("byte %q at %d: %w", c, i, errRefusalKeyEscape)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil || strings.ToUpper(s[i+1:i+3]) != s[i+1:i+3] || refusalKeyByte(byte(v)) {
			return "", fmt.Errorf("%q at %d: %w", s[i:i+3], i, errRefusalKeyEscape)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}
