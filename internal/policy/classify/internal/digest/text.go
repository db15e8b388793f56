package digest

import (
	"strings"
	"unicode/utf8"

	"github.com/failbus/failbus/internal/ascii"
)

// Text helpers of the walker and the view: lower-casing and unescaping
// JSON string contents without allocating, and reading a status code.

// Status3 parses a three-digit HTTP status 100..599.
func Status3(s string) (int, bool) {
	if len(s) != 3 {
		return 0, false
	}
	n := 0
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, n >= 100 && n <= 599
}

// unescapeSimple returns raw when it has no escapes (the common case for
// codes); otherwise the first escape cuts it, which is enough for a code.
func unescapeSimple(raw string) string {
	if i := strings.IndexByte(raw, '\\'); i >= 0 {
		return raw[:i]
	}
	return raw
}

// appendLower appends s lower-cased (ASCII).
func appendLower(dst []byte, s string) []byte {
	n := len(dst)
	dst = append(dst, s...)
	for i := n; i < len(dst); i++ {
		dst[i] = lowerTable[dst[i]]
	}
	return dst
}

// lowerTable lower-cases ASCII and makes tab, CR and LF a space: a message
// wrapped across lines ("This organization has been\ndisabled.") still
// matches a phrase.
var lowerTable = func() (t [256]byte) {
	for i := range t {
		t[i] = ascii.Lower(byte(i))
	}
	t['\t'], t['\r'], t['\n'] = ' ', ' ', ' '
	return t
}()

// appendLowerText appends s lower-cased, with every run of white space
// one space: error text as the rules read it, so that a phrase wrapped
// across lines or indented ("considered high\n risk") still matches.
func appendLowerText(dst []byte, s string) []byte {
	n := len(dst)
	dst = append(dst, s...)
	return squeeze(dst, n)
}

// squeeze lower-cases dst[n:] in place and folds its white space runs.
// Most text has none: the lower-casing pass notes whether it saw one, and
// the folding pass runs only then.
func squeeze(dst []byte, n int) []byte {
	var prev, runs byte
	if n > 0 && (dst[n-1] == ' ' || dst[n-1] == '\n') {
		prev = 1
	}
	for i := n; i < len(dst); i++ {
		c := lowerTable[dst[i]]
		dst[i] = c
		sp := spaceTable[c]
		runs |= sp & prev
		prev = sp
	}
	if runs == 0 {
		return dst
	}
	prevSpace := n > 0 && (dst[n-1] == ' ' || dst[n-1] == '\n')
	j := n
	for i := n; i < len(dst); i++ {
		c := dst[i]
		if c == ' ' {
			if prevSpace {
				continue
			}
			prevSpace = true
		} else {
			prevSpace = false
		}
		dst[j] = c
		j++
	}
	return dst[:j]
}

// spaceTable is 1 for the space lowerTable makes of white space.
var spaceTable = func() (t [256]byte) {
	t[' '] = 1
	return t
}()

// appendLowerUnescaped appends a raw JSON string's contents, unescaped,
// lower-cased and with white space folded (appendLowerText).
func appendLowerUnescaped(dst []byte, raw string) []byte {
	if strings.IndexByte(raw, '\\') < 0 {
		return appendLowerText(dst, raw)
	}
	start := len(dst)
	dst = AppendUnescaped(dst, raw)
	return squeeze(dst, start)
}

// AppendUnescaped appends the unescaped contents of a raw JSON string.
// Invalid escapes are copied through; it never fails.
func AppendUnescaped(dst []byte, raw string) []byte {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' || i+1 >= len(raw) {
			dst = append(dst, c)
			continue
		}
		i++
		switch raw[i] {
		case 'n':
			dst = append(dst, '\n')
		case 't':
			dst = append(dst, '\t')
		case 'r':
			dst = append(dst, '\r')
		case 'b', 'f':
			dst = append(dst, ' ')
		case 'u':
			if i+4 < len(raw) {
				if r, ok := hex4(raw[i+1 : i+5]); ok {
					dst = utf8.AppendRune(dst, r)
					i += 4
					continue
				}
			}
			dst = append(dst, 'u')
		default: // \" \\ \/ and anything else
			dst = append(dst, raw[i])
		}
	}
	return dst
}

func hex4(s string) (rune, bool) {
	var r rune
	for i := 0; i < 4; i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
