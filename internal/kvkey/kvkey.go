// Package kvkey escapes names into JetStream KV key tokens. KV keys allow
// only [-/_=.a-zA-Z0-9] and '.' separates tokens; provider, session and
// segment names allow anything.
package kvkey

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// keyByte reports the bytes a token keeps as they are.
func keyByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// Escape makes s one KV key token, injectively: bytes outside
// [A-Za-z0-9_-] become `=XX` (upper-case hex), and an empty s is a lone
// `=`. Common names stay readable in `nats kv ls`, distinct names never
// share a token, and a token never contains the '.' that separates tokens.
func Escape(s string) string {
	if s == "" {
		return "="
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keyByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xF])
	}
	return b.String()
}

// ErrBadEscape: a token Escape cannot have made.
var ErrBadEscape = errors.New("bad escape")

// Unescape inverts Escape.
func Unescape(s string) (string, error) {
	if s == "=" {
		return "", nil
	}
	if s == "" {
		return "", fmt.Errorf("empty token: %w", ErrBadEscape)
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keyByte(c) {
			b.WriteByte(c)
			continue
		}
		if c != '=' || i+3 > len(s) {
			return "", fmt.Errorf("byte %q at %d: %w", c, i, ErrBadEscape)
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil || strings.ToUpper(s[i+1:i+3]) != s[i+1:i+3] || keyByte(byte(v)) {
			return "", fmt.Errorf("%q at %d: %w", s[i:i+3], i, ErrBadEscape)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}
