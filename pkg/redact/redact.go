// Package redact masks credentials in text before it leaves the process:
// classification evidence, logs, notifications (secrets found in error
// bodies are redacted before a notification or a log line leaves the
// process).
package redact

import (
	"strings"

	"github.com/failbus/failbus/internal/ascii"
)

// String masks credentials in s: provider API keys (sk-…, sk-ant-…, sk-or-…,
// AIza…, gsk_…, xai-…, csk-…, AKIA…, hf_…, ghp_…, glpat-…, JWTs), the token
// after "Bearer " or "Basic ", and the value of any key=…, key: … or
// "key": "…" whose name ends in key, token, secret, password, signature,
// credential or authorization (so api_key=, ?key=, x-api-key:,
// X-Amz-Signature= and "access_token": are all covered).
//
// Error bodies echo keys back ("Incorrect API key provided: sk-proj-…") and
// URLs carry them in query strings, so everything failbus shows a human —
// classification evidence, logs, notifications — goes through String. Raw
// bodies stay only in the outcome stream.
//
// A recognised secret keeps a short prefix so the reader can tell which kind
// of credential it was ("sk-ant-***", "Bearer ***", "key=***"). String does
// not allocate when there is nothing to mask. It is not a guarantee: a secret
// in a shape it does not know passes through.
func String(s string) string {
	if !mayHoldSecret(s) {
		return s
	}
	start, end, keep, ok := findSecret(s, 0)
	if !ok {
		return s
	}
	b := make([]byte, 0, len(s))
	last := 0 // s[last:] not yet copied to b
	for ok {
		b = append(b, s[last:start+keep]...)
		b = append(b, "***"...)
		last = end
		start, end, keep, ok = findSecret(s, end)
	}
	b = append(b, s[last:]...)
	return string(b)
}

// Append appends String(s) to dst and reports whether anything was
// masked; when nothing was, dst is returned unchanged. It lets a caller
// redact text held in its own buffer without copying it to a string first.
// The masked text is never longer than s.
//
// It skips String's mayHoldSecret pre-check, which only saves time: every
// secret findSecret finds contains a redaction trigger.
func Append(dst []byte, s string) ([]byte, bool) {
	start, end, keep, ok := findSecret(s, 0)
	if !ok {
		return dst, false
	}
	last := 0
	for ok {
		dst = append(dst, s[last:start+keep]...)
		dst = append(dst, "***"...)
		last = end
		start, end, keep, ok = findSecret(s, end)
	}
	return append(dst, s[last:]...), true
}

// findSecret returns the first secret secretAt finds at s[i] or after: the
// span [start,end) to mask and how many leading bytes of it to keep. Only a
// token boundary can start a secret, and most words cannot start one (no
// key prefix starts them, they are no auth scheme, and no '=', ':' or '"'
// follows them), so such a word is skipped whole, without secretAt.
func findSecret(s string, i int) (start, end, keep int, ok bool) {
	for i < len(s) {
		if i > 0 && tokenBytes[s[i-1]] {
			i++ // secrets start on a token boundary
			continue
		}
		c := s[i]
		if !tokenBytes[c] {
			i++ // no key prefix, auth scheme or name starts with c
			continue
		}
		j := i + 1
		for j < len(s) && tokenBytes[s[j]] {
			j++
		}
		if !maySecretWord(s, i, j) {
			i = j // nor can s[i+1:j+1] start one: a token byte precedes them
			continue
		}
		if start, end, keep = secretAt(s, i); end > start {
			return start, end, keep, true
		}
		i++
	}
	return 0, 0, 0, false
}

// maySecretWord reports whether secretAt can find a secret at the word
// s[i:j] (a maximal run of token bytes): a key prefix starts it, it is an
// auth scheme followed by a blank, or '=', ':' or '"' follows it.
func maySecretWord(s string, i, j int) bool {
	if j < len(s) {
		switch s[j] {
		case '=', ':', '"':
			return true
		case ' ', '\t':
			if n := j - i; (n == len("bearer") || n == len("basic")) && ascii.Lower(s[i]) == 'b' {
				return true
			}
		}
	}
	if j-i < 2 {
		return false // every key prefix is longer than one byte
	}
	if c1 := s[i+1]; prefixPairs[s[i]][c1>>6]&(1<<(c1&63)) == 0 {
		return false
	}
	for _, k := range prefixesByByte[s[i]] {
		if strings.HasPrefix(s[i:], keyPrefixes[k].prefix) {
			return true
		}
	}
	return false
}

// prefixPairs holds the first two bytes of every key prefix, so that most
// words are ruled out without comparing prefixes.
var prefixPairs = func() (t [256][4]uint64) {
	for _, kp := range keyPrefixes {
		a, b := kp.prefix[0], kp.prefix[1]
		t[a][b>>6] |= 1 << (b & 63)
	}
	return t
}()

// tokenBytes is isTokenByte as a table.
var tokenBytes = func() (t [256]bool) {
	for i := range t {
		t[i] = isTokenByte(byte(i))
	}
	return t
}()

// triggers are cheap, case-insensitive markers: without one of them no
// rule below can fire, so most strings leave String after one pass. Every
// key prefix, auth scheme and sensitive name below contains one.
var triggers = []string{
	"sk-", "sk_", "aiza", "gsk_", "xai-", "csk-", "akia", "asia", "hf_", "gh", "glpat-",
	"pplx-", "nvapi-", "r8_", "eyj", "bearer", "basic", "key", "token", "secret",
	"passw", "signature", "credential", "auth", "sig", "://",
}

// Triggers returns the redaction triggers: cheap, case-insensitive markers
// without one of which String masks nothing. A caller that already scans
// text for patterns (the classifier) adds them to its scan and skips
// redaction of text that holds none.
func Triggers() []string { return append([]string(nil), triggers...) }

// triggersByByte indexes triggers by first byte, both cases, so
// mayHoldSecret reads s once.
var triggersByByte = func() (t [256][]string) {
	for _, tr := range triggers {
		c := tr[0]
		t[c] = append(t[c], tr)
		if c >= 'a' && c <= 'z' {
			t[c-'a'+'A'] = append(t[c-'a'+'A'], tr)
		}
	}
	return t
}()

// triggerPairs holds the first two bytes of every trigger (lower case), a
// cheap filter before the prefix comparisons.
var triggerPairs = func() (t [256][4]uint64) {
	for _, tr := range triggers {
		a, b := tr[0], tr[1]
		t[a][b>>6] |= 1 << (b & 63)
	}
	return t
}()

func mayHoldSecret(s string) bool {
	for i := 0; i+1 < len(s); i++ {
		a, b := ascii.Lower(s[i]), ascii.Lower(s[i+1])
		if triggerPairs[a][b>>6]&(1<<(b&63)) == 0 {
			continue
		}
		for _, t := range triggersByByte[s[i]] {
			if ascii.HasPrefixFold(s[i:], t) {
				return true
			}
		}
	}
	return false
}

// prefixesByByte indexes keyPrefixes by first byte.
var prefixesByByte = func() (t [256][]int) {
	for i, kp := range keyPrefixes {
		t[kp.prefix[0]] = append(t[kp.prefix[0]], i)
	}
	return t
}()

// keyPrefixes are credential formats recognised by their prefix. min is the
// least number of token characters after the prefix for a match, so words
// such as "sk-learn" stay readable.
var keyPrefixes = []struct {
	prefix string
	min    int
}{
	{"sk-ant-", 12}, {"sk-proj-", 12}, {"sk-or-", 12}, {"sk-", 16}, {"sk_live_", 12}, {"sk_test_", 12},
	{"AIza", 30}, {"gsk_", 16}, {"xai-", 16}, {"csk-", 16}, {"AKIA", 16}, {"ASIA", 16},
	{"hf_", 16}, {"ghp_", 16}, {"gho_", 16}, {"ghu_", 16}, {"ghs_", 16}, {"github_pat_", 16},
	{"glpat-", 16}, {"pplx-", 16}, {"nvapi-", 16}, {"r8_", 16}, {"eyJ", 20},
}

// secretAt reports a secret starting at s[i]: the span [start,end) to mask
// and how many leading bytes of it to keep. end <= start means none.
func secretAt(s string, i int) (start, end, keep int) {
	if i > 0 && isTokenByte(s[i-1]) {
		return 0, 0, 0 // secrets start on a token boundary
	}
	c := s[i]
	// 1. Known key prefixes.
	for _, k := range prefixesByByte[c] {
		kp := keyPrefixes[k]
		if !strings.HasPrefix(s[i:], kp.prefix) {
			continue
		}
		j := i + len(kp.prefix)
		for j < len(s) && isSecretByte(s[j]) {
			j++
		}
		j = trimDots(s, i+len(kp.prefix), j)
		if j-(i+len(kp.prefix)) >= kp.min {
			return i, j, len(kp.prefix)
		}
	}
	// 2. Authorization schemes: "Bearer <token>", "Basic <token>".
	for _, scheme := range [...]string{"bearer", "basic"} {
		if ascii.Lower(c) != 'b' {
			break
		}
		if len(s)-i > len(scheme) && ascii.HasPrefixFold(s[i:], scheme) && (s[i+len(scheme)] == ' ' || s[i+len(scheme)] == '\t') {
			j := i + len(scheme)
			for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
				j++
			}
			k := j
			for k < len(s) && isSecretByte(s[k]) {
				k++
			}
			k = trimDots(s, j, k)
			if k-j >= 8 && !alreadyMasked(s[j:k]) {
				return i, k, j - i
			}
		}
	}
	// 3. name=value, name: value, "name": "value" for sensitive names.
	if !isNameByte(c) {
		return 0, 0, 0
	}
	j := i
	for j < len(s) && isNameByte(s[j]) {
		j++
	}
	// 4. URL credentials: scheme://user:password@host keeps the user.
	if strings.HasPrefix(s[j:], "://") {
		if start, end, keep := urlPassword(s, i, j+3); end > start {
			return start, end, keep
		}
		return 0, 0, 0
	}
	k := j
	quotedName := k < len(s) && s[k] == '"' // a JSON key
	if quotedName {
		k++
	}
	if k >= len(s) || s[k] != '=' && s[k] != ':' || !sensitiveName(s[i:j]) {
		return 0, 0, 0
	}
	switch {
	case k < len(s) && s[k] == '=':
		k++
	case k < len(s) && s[k] == ':':
		k++
		for k < len(s) && (s[k] == ' ' || s[k] == '\t') {
			k++
		}
	default:
		return 0, 0, 0
	}
	quotedValue := k < len(s) && (s[k] == '"' || s[k] == '\'')
	if quotedValue {
		k++
	}
	// A JSON key's string value is quoted; "name": word is prose quoting a
	// name (`field "dedupe_key": required`), not a credential. Known key
	// formats in it are still caught by the prefixes.
	if quotedName && !quotedValue {
		return 0, 0, 0
	}
	vs := k
	// A value that is itself "Bearer xyz" is left to rule 2 on a later step.
	if ascii.HasPrefixFold(s[vs:], "bearer ") || ascii.HasPrefixFold(s[vs:], "basic ") {
		return 0, 0, 0
	}
	for k < len(s) && isValueByte(s[k]) {
		k++
	}
	v := s[vs:k]
	if len(v) < 4 || alreadyMasked(v) || allDigits(v) {
		return 0, 0, 0
	}
	return i, k, vs - i
}

// urlPassword finds the password of a URL's userinfo, the authority
// starting at s[a] of a URL whose scheme starts at s[i]: the span from i to
// the last '@' of the authority, keeping everything up to the first ':'
// of the userinfo ("postgres://svc:***@db", "redis://:***@cache"). A
// userinfo without ':' is a user name alone and stays; known token formats
// in it are caught by the key prefixes.
func urlPassword(s string, i, a int) (start, end, keep int) {
	at, colon := -1, -1
	for k := a; k < len(s); k++ {
		c := s[k]
		if c == '/' || c == '?' || c == '#' || c == ' ' || c == '\t' || c == '\r' || c == '\n' ||
			c == '"' || c == '\'' || c == '<' || c == '>' || c == '`' {
			break
		}
		switch {
		case c == '@':
			at = k
		case c == ':' && colon < 0 && at < 0:
			colon = k
		}
	}
	if at < 0 || colon < 0 || colon > at || at-colon < 2 || alreadyMasked(s[colon+1:at]) {
		return 0, 0, 0
	}
	return i, at, colon + 1 - i
}

// sensitiveName reports whether an identifier names a credential: it ends in
// key, token, secret, password, passwd, signature, sig, credential or
// authorization (case-insensitive), or is "auth" or "apikey".
func sensitiveName(name string) bool {
	if len(name) > 64 {
		return false
	}
	for _, suf := range [...]string{"key", "token", "secret", "password", "passwd", "signature", "credential", "authorization"} {
		if len(name) >= len(suf) && ascii.HasPrefixFold(name[len(name)-len(suf):], suf) {
			return true
		}
	}
	return ascii.EqualFold(name, "sig") || ascii.EqualFold(name, "auth") || ascii.EqualFold(name, "x-amz-credential")
}

// trimDots drops sentence punctuation from the end of s[lo:hi]: a key at
// the end of a sentence keeps its full stop.
func trimDots(s string, lo, hi int) int {
	for hi > lo && s[hi-1] == '.' {
		hi--
	}
	return hi
}

func alreadyMasked(v string) bool {
	return strings.HasPrefix(v, "***") || strings.HasPrefix(v, "[redacted") || strings.HasPrefix(v, "<redacted") || strings.HasPrefix(v, "REDACTED")
}

func allDigits(v string) bool {
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return false
		}
	}
	return true
}

// isTokenByte: characters that continue a word, so a secret cannot start
// right after one.
func isTokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// isSecretByte: characters of API keys, base64(url) tokens and JWTs.
func isSecretByte(c byte) bool {
	return isTokenByte(c) || c == '.' || c == '*' || c == '+' || c == '/' || c == '=' || c == '~'
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// isValueByte: a value runs until whitespace, a quote or a delimiter.
func isValueByte(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', '"', '\'', '&', ',', ';', '}', ')', ']', '<', '>', '\\':
		return false
	}
	return true
}
