package digest

import (
	"strings"
	"unsafe"

	"github.com/failbus/failbus/internal/ascii"
)

// Reading the reason out of text that is not a JSON error object, and out
// of the names inside one: a transport exception's text, a log line
// ("code: Arrearage, message: …"), a message that carries its code
// ("[1301][…]", "… (1008)", "<400> InternalError.Algo.DataInspectionFailed:
// …"), an error name (AccountOverdueError, insufficient_user_quota).
//
// Error names become structured codes, so the providers' code tables read
// them wherever they appear, and their words become error text
// ("AccountOverdueError" adds "account overdue error"), so the keyword
// families read them even when no table knows the name.

const (
	maxIdents     = 12   // identifiers read per outcome
	maxWordsBytes = 2048 // of identifier words per outcome
	maxKV         = 8    // "code: X" pairs read per text
)

// noteText reads the codes and identifiers of one raw piece of error text
// (a message field, a text body, a transport error), in one pass:
//   - numeric codes in brackets or parentheses: Zhipu's "[1301][…]",
//     MiniMax's "… (1008)", DashScope's "<400> …", three to six digits;
//   - error names, CamelCase (AppIdNoAuthError,
//     InternalError.Algo.DataInspectionFailed) or snake_case
//     (data_inspection_failed): each is recorded as a code, with its last
//     dotted part as another, and its words as error text.
func (v *View) noteText(raw string) {
	if !mayNameError(raw) {
		return
	}
	for i := 0; i < len(raw); {
		k := byteKind[raw[i]]
		if k&kOpen != 0 {
			v.noteBracketCode(raw, i)
			i++
			continue
		}
		if k&kIdent == 0 {
			i++
			continue
		}
		// A run of identifier bytes; it names an error only when it starts
		// with a letter and mixes cases inside a word or joins words.
		j, mixed := i+1, false
		for j < len(raw) {
			kj := byteKind[raw[j]]
			if kj&kIdent == 0 {
				break
			}
			if kj&kUpper != 0 && byteKind[raw[j-1]]&kLower != 0 || kj&kJoin != 0 {
				mixed = true
			}
			j++
		}
		if mixed && k&kLetter != 0 && v.nidents < maxIdents {
			v.noteIdent(raw[i:j])
		}
		i = j
	}
}

// mayNameError is noteText's quick test, one branch-free pass: raw can
// hold an error name only if a capital follows a small letter or an '_'
// joins words, and a bracketed code only if a digit follows a bracket.
// Most messages are prose with neither.
func mayNameError(raw string) bool {
	var sig, prevLower, prevOpen uint8
	for i := 0; i < len(raw); i++ {
		k := byteKind[raw[i]]
		sig |= (k&kUpper>>kUpperShift)&prevLower | k&kUnder | prevOpen&(k&kDigit>>kDigitShift)
		prevLower = k & kLower >> kLowerShift
		prevOpen = k & kOpen >> kOpenShift
	}
	return sig != 0
}

// noteBracketCode records the code of a bracket at raw[i], if digits and
// the matching bracket follow.
func (v *View) noteBracketCode(raw string, i int) {
	if v.NCodes >= maxCodes {
		return
	}
	c := raw[i]
	j := i + 1
	for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
		j++
	}
	if n := j - i - 1; n < 3 || n > 6 || j >= len(raw) {
		return
	}
	if e := raw[j]; e == ']' && c == '[' || e == ')' && c == '(' || e == '>' && c == '<' {
		v.addCode(raw[i+1:j], 0)
	}
}

// noteIdent records tok, a run of identifier bytes, if it reads as an
// error name.
func (v *View) noteIdent(tok string) {
	for len(tok) > 0 {
		if e := tok[len(tok)-1]; e != '.' && e != '_' && e != '-' {
			break
		}
		tok = tok[:len(tok)-1]
	}
	if len(tok) < 6 || len(tok) > 96 || !identLike(tok) {
		return
	}
	v.nidents++
	v.addCode(tok, 0)
	if k := strings.LastIndexByte(tok, '.'); k > 0 && k < len(tok)-1 {
		v.addCode(tok[k+1:], 0)
	}
	v.addWords(tok)
}

// Byte kinds for noteText; mayNameError shifts each flag to bit 0 (the
// *Shift constants) and tests them without branches.
const (
	kLetter uint8 = 1 << iota
	kUpper
	kLower
	kIdent // letter, digit, '_', '.', '$'
	kJoin  // '_' or '.': joins the words of a name
	kOpen  // '[', '(', '<': may open a bracketed code
	kDigit
	kUnder // '_'

	kUpperShift = 1
	kLowerShift = 2
	kOpenShift  = 5
	kDigitShift = 6
)

var byteKind = func() (t [256]uint8) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = kLetter | kLower | kIdent
		t[c-'a'+'A'] = kLetter | kUpper | kIdent
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = kIdent | kDigit
	}
	t['_'], t['.'], t['$'] = kIdent|kJoin|kUnder, kIdent|kJoin, kIdent
	t['['], t['('], t['<'] = kOpen, kOpen, kOpen
	return t
}()

// addWords appends the words of identifier tok to v.Words:
// "AccountOverdueError" → "account overdue error", "insufficient_user_quota"
// → "insufficient user quota", "APIError" → "api error". The keyword
// families read them; the phrase rules, written against providers'
// sentences, do not ("input token count" is a Gemini sentence, and the
// words of a quota metric named …_input_token_count).
func (v *View) addWords(tok string) {
	if len(v.Words) >= maxWordsBytes {
		return
	}
	v.Words = append(v.Words, '\n')
	prev := byte(' ')
	for k := 0; k < len(tok); k++ {
		c := tok[k]
		switch {
		case c == '_' || c == '.' || c == '-' || c == '$':
			c = ' '
		case c >= 'A' && c <= 'Z':
			// A capital starts a word after a lower-case letter or digit,
			// and before a lower-case letter after capitals (APIError).
			if isLower(prev) || isDigit(prev) || isUpper(prev) && k+1 < len(tok) && isLower(tok[k+1]) {
				v.Words = append(v.Words, ' ')
			}
			c += 'a' - 'A'
		}
		if c == ' ' && prev == ' ' {
			continue
		}
		v.Words = append(v.Words, c)
		prev = tok[k]
		if c == ' ' {
			prev = ' '
		}
	}
}

// identLike reports whether tok reads as an error name: it mixes cases
// inside a word (a lower-case letter before a capital) or joins words
// with '_' or '.', and it is mostly letters (no hex ids, no timestamps).
func identLike(tok string) bool {
	camel, joined, digits := false, false, 0
	for k := 0; k < len(tok); k++ {
		c := tok[k]
		switch {
		case isDigit(c):
			digits++
		case isUpper(c) && k > 0 && isLower(tok[k-1]):
			camel = true
		case (c == '_' || c == '.') && k > 0 && k+1 < len(tok) && isLetter(tok[k-1]) && isLetter(tok[k+1]):
			joined = true
		}
	}
	if digits*4 > len(tok) {
		return false
	}
	if joined && !camel && strings.IndexByte(tok, '_') < 0 {
		return false // dotted lower case: a host name or a module path
	}
	return camel || joined
}

// noteKeyValues reads "code: X", "code=X", "type: X" pairs of lower-cased
// text (a log line, an exception's text) as codes: "sync_call Failed,
// status_code: 400, code: Arrearage, message: …".
func (v *View) noteKeyValues(text []byte) {
	n := 0
	for i := 0; i+4 < len(text) && n < maxKV && v.NCodes < maxCodes; i++ {
		if !(text[i] == 'c' && string(text[i:i+4]) == "code" || text[i] == 't' && string(text[i:i+4]) == "type") {
			continue
		}
		if i > 0 && isLetter(text[i-1]) {
			continue // "errcode" is a key too, "encode" is not: letters before a key are allowed only after '_'
		}
		j := i + 4
		for j < len(text) && (text[j] == ' ' || text[j] == '"' || text[j] == '\'') {
			j++
		}
		if j >= len(text) || text[j] != ':' && text[j] != '=' {
			continue
		}
		j++
		for j < len(text) && (text[j] == ' ' || text[j] == '"' || text[j] == '\'') {
			j++
		}
		k := j
		for k < len(text) && (isIdentByte(text[k]) || text[k] == '-') {
			k++
		}
		if k > j && k-j <= 64 {
			v.addCode(strings.TrimRight(string(text[j:k]), "._-"), 0)
			n++
		}
		i = k
	}
}

func isLower(c byte) bool  { return c >= 'a' && c <= 'z' }
func isUpper(c byte) bool  { return c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
func isLetter(c byte) bool { return isLower(c) || isUpper(c) }
func isIdentByte(c byte) bool {
	return isLetter(c) || isDigit(c) || c == '_' || c == '.' || c == '$'
}

// isCodeKey reports whether a (lower-cased) key holds an error code whose
// non-success value, with a message beside it, makes an object an error
// (Baidu error_code, MiniMax base_resp.status_code, SiliconFlow code).
func isCodeKey(lower string) bool {
	switch lower {
	case "code", "error_code", "errcode", "err_code", "errorcode", "status_code", "statuscode", "sub_code", "subcode":
		return true
	}
	return false
}

// successCode reports whether a code value means success.
func successCode(s string) bool {
	switch strings.ToLower(strings.Trim(s, `"' `)) {
	case "", "0", "200", "success", "ok", "0x0", "null", "none":
		return true
	}
	return false
}

// lowerKey returns key lower-cased in buf when it has capitals (keys are
// short; a longer one is returned as is). The result aliases buf: it is
// for comparing, not for keeping.
func lowerKey(key string, buf *[32]byte) string {
	has := false
	for k := 0; k < len(key); k++ {
		if isUpper(key[k]) {
			has = true
			break
		}
	}
	if !has || len(key) > len(buf) || len(key) == 0 {
		return key
	}
	for k := 0; k < len(key); k++ {
		buf[k] = ascii.Lower(key[k])
	}
	return unsafe.String(&buf[0], len(key))
}
