package refusals

// Keys of the refusal bucket (FAILBUS_REFUSALS): one per (segment, provider).

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/failbus/failbus/internal/kvkey"
)

// Key is the KV key of the state of provider in segment
// (`<session>#<n>`). KV keys allow only [-/_=.a-zA-Z0-9] and '.' separates
// tokens, so the key is three tokens `<session>.<n>.<provider>`, each escaped
// injectively: bytes outside [A-Za-z0-9_-] become `=XX` (upper-case hex),
// and an empty name is a lone `=`. Common ids stay readable in `nats kv ls`
// ("s-1.0.openai"), distinct names never share a key, and one session's
// states can be listed or watched with SessionFilter. A segment
// string that is not `<session>#<n>` with a canonical integer n is kept
// whole in the first token, with `=` as the second.
func Key(segment, provider string) string {
	session, n := segment, "="
	if i := strings.LastIndexByte(segment, '#'); i >= 0 {
		if v, err := strconv.Atoi(segment[i+1:]); err == nil && strconv.Itoa(v) == segment[i+1:] {
			session, n = segment[:i], segment[i+1:]
		}
	}
	return kvkey.Escape(session) + "." + n + "." + kvkey.Escape(provider)
}

// ParseKey inverts Key, so a service listing keys (to retire a
// session's earlier segments on a boundary) knows what each key holds.
func ParseKey(key string) (segment, provider string, err error) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 {
		return "", "", fmt.Errorf("refusal key %q: want 3 dot-separated tokens", key)
	}
	session, err := kvkey.Unescape(parts[0])
	if err != nil {
		return "", "", fmt.Errorf("refusal key %q: session: %w", key, err)
	}
	provider, err = kvkey.Unescape(parts[2])
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

// SessionFilter is the KV key filter (`<session>.>`) matching every
// refusal state of one session, whatever the segment and provider: what a
// boundary must look at.
func SessionFilter(session string) string { return kvkey.Escape(session) + ".>" }

// SegmentFilter is the KV key filter (`<session>.<n>.*`) matching
// every provider's state in one segment: what the notification dedupe key's
// provider list (refusal.Peers) is computed from.
func SegmentFilter(segment string) string {
	k := Key(segment, "")
	return k[:len(k)-1] + "*"
}
