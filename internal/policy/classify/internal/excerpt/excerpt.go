// Package excerpt quotes provider text in classification evidence: short,
// whitespace collapsed, JSON escapes undone, credentials masked.
package excerpt

import (
	"strings"
	"unsafe"

	"github.com/failbus/failbus/pkg/redact"
)

// Max bounds the provider text quoted in evidence, in bytes.
const Max = 200

// Make returns prefix + s cut to Max bytes (on a rune boundary),
// whitespace collapsed, JSON escapes undone when escaped, and redacted when
// redact. A short s with nothing to clean (no escape, no whitespace but
// single spaces) is kept as is, without "…" even at Max bytes. The
// text is built in a stack buffer, in one pass; only the returned string
// is allocated.
//
// Redaction runs before the cut, on up to redactMargin more bytes: a key
// that straddles the cut is recognised whole and masked, instead of being
// cut to a stub too short to look like a key (and shown).
func Make(prefix, s string, escaped, mask bool) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	limit := Max
	if mask {
		limit += redactMargin
	}
	var buf [excerptBuf]byte
	b := append(buf[:0], prefix...)
	cleaned := len(s) > Max
	cut := false
	// The leading bytes up to the first backslash, control whitespace or
	// double space are copied as they are; finding them with the
	// vectorised strings functions is much cheaper than the loop below.
	plain := plainPrefix(s[:min(len(s), limit)])
	b = append(b, s[:plain]...)
	space := plain > 0 && s[plain-1] == ' '
	written := plain
	for i := plain; i < len(s); i++ {
		ch := s[i]
		if written >= limit && (ch < 0x80 || ch >= 0xC0) {
			cut = true
			break // cut only between runes
		}
		if excerptSpecial[ch] {
			if ch == '\\' {
				cleaned = true
				if escaped && i+1 < len(s) {
					i++
					switch s[i] {
					case 'n', 't', 'r':
						ch = ' '
					default:
						ch = s[i]
					}
				}
			} else if ch != ' ' {
				cleaned = true
			}
			if ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r' {
				if space {
					cleaned = true
					continue
				}
				space = true
				ch = ' '
			} else {
				space = false
			}
		} else {
			space = false
		}
		b = append(b, ch)
		written++
	}
	if mask {
		// Redact without its trigger pre-check: the caller saw a trigger
		// in the text, and findSecret alone gives the same answer.
		var rbuf [excerptBuf]byte
		text := b[len(prefix):]
		if r, masked := redact.Append(append(rbuf[:0], prefix...), unsafe.String(unsafe.SliceData(text), len(text))); masked {
			b = r
		}
		// Now cut to Max bytes of text, between runes.
		if end := len(prefix) + Max; len(b) > end {
			for end > len(prefix) && b[end] >= 0x80 && b[end] < 0xC0 {
				end--
			}
			b, cut = b[:end], true
		}
	}
	if cleaned && cut {
		for len(b) > 0 && b[len(b)-1] == ' ' {
			b = b[:len(b)-1]
		}
		b = append(b, "…"...)
	}
	return string(b)
}

// redactMargin is how far past the cut excerpt reads for redaction: enough
// for the longest key prefix and its minimum length, and for a sensitive
// name (at most 64 bytes) and the start of its value.
const redactMargin = 128

// excerptBuf holds an excerpt of any well-formed text: the longest prefix,
// Max+redactMargin bytes, the rest of a cut rune and "…". A longer
// one (a run of stray UTF-8 continuation bytes at the cut) spills to the
// heap.
const excerptBuf = 384

// excerptSpecial marks the bytes excerpt may change: a backslash and
// whitespace.
var excerptSpecial = [256]bool{'\\': true, ' ': true, '\n': true, '\t': true, '\r': true}

// plainPrefix returns how many leading bytes of s excerpt copies unchanged:
// those before the first backslash, '\n', '\t', '\r' or double space.
func plainPrefix(s string) int {
	n := len(s)
	for _, c := range [...]byte{'\\', '\n', '\t', '\r'} {
		if i := strings.IndexByte(s[:n], c); i >= 0 {
			n = i
		}
	}
	// strings.Index on a haystack of at most 64 bytes is one vector
	// search; on a longer one it stops at every space.
	for lo := 0; lo+1 < n; lo += 63 {
		if i := strings.Index(s[lo:min(n, lo+64)], "  "); i >= 0 {
			return lo + i
		}
	}
	return n
}
