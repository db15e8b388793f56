package digest

import (
	"strings"

	"github.com/failbus/failbus/internal/policy/classify/internal/delay"
)

// Reading a JSON error body without decoding it: a forgiving walker over
// the fields that say what went wrong, plus the lower-casing and unescaping
// it needs. Prompt text a provider echoes elsewhere is never read.

// Field roles in a JSON error body.
const (
	roleNone = iota
	roleText
	roleCode
	roleBoth // quota ids, finish reasons: matched as code and as text
)

func fieldRole(key string) int {
	var buf [32]byte
	key = lowerKey(key, &buf)
	switch key {
	case "message", "msg", "detail", "details", "error", "error_description", "title", "description", "raw",
		"errormessage", "error_message", "errormsg", "error_msg", "err_msg", "errmsg", "status_msg", "statusmessage",
		"status_message", "quota_metric", "quotametric", "displaymsg", "err":
		return roleText
	case "type", "code", "status", "__type", "reason", "error_code", "error_type", "errortype",
		"errorcode", "error_name", "object", "errcode", "err_code", "status_code", "statuscode", "http_code",
		"sub_code", "subcode":
		return roleCode
	case "quotaid", "quota_id", "quota_limit", "quotalimit", "blockreason", "block_reason",
		"finishreason", "finish_reason", "stop_reason", "stopreason", "limit_source":
		return roleBoth
	case "id", "request_id", "requestid", "trace_id", "traceid", "param", "url", "doc_url", "help", "sid", "model":
		return roleNone
	}
	// Other spellings of the same fields: "$error", "lastError",
	// "errorDetail", "errType".
	switch {
	case strings.HasSuffix(key, "code") || strings.HasSuffix(key, "_type") || strings.HasSuffix(key, "errtype"):
		return roleCode
	case strings.Contains(key, "message") || strings.Contains(key, "msg") || strings.Contains(key, "error") ||
		strings.Contains(key, "detail"):
		return roleText
	}
	return roleNone
}

// walker is a forgiving, allocation-free JSON reader that visits the fields
// of an error body. On malformed input it stops and keeps what it found.
// It also reads a Python dict's repr, as SDK errors print it ("Error code:
// 429 - {'error': {'code': 'insufficient_quota', …}}"): single-quoted
// strings, and None/True/False as scalars.
type walker struct {
	s      string
	i      int
	v      *View
	src    int8 // span source of s: 0 body, i+1 docs[i]
	level  int  // JSON-in-string nesting level of s
	fields int
}

func (w *walker) ws() {
	for w.i < len(w.s) {
		switch w.s[w.i] {
		case ' ', '\t', '\r', '\n':
			w.i++
		default:
			return
		}
	}
}

// str reads a string at w.i (which must be '"', or '\” in a Python repr)
// and returns its raw, still-escaped contents.
func (w *walker) str() (lo, hi int, ok bool) {
	q := w.s[w.i]
	w.i++
	lo = w.i
	for w.i < len(w.s) {
		j := strings.IndexByte(w.s[w.i:], q)
		if j < 0 {
			break
		}
		q := w.i + j
		// The quote ends the string unless an odd run of backslashes
		// escapes it.
		n := 0
		for k := q - 1; k >= lo && w.s[k] == '\\'; k-- {
			n++
		}
		w.i = q + 1
		if n%2 == 0 {
			return lo, q, true
		}
	}
	w.i = len(w.s)
	return 0, 0, false
}

func (w *walker) value(depth int, key string) bool {
	if depth > maxJSONDepth {
		return false
	}
	w.ws()
	if w.i >= len(w.s) {
		return false
	}
	switch c := w.s[w.i]; c {
	case '{':
		w.i++
		if contentContainer(key) {
			w.markContent('}')
		}
		for {
			w.ws()
			if w.i >= len(w.s) {
				return false
			}
			if w.s[w.i] == '}' {
				w.i++
				return true
			}
			var lo, hi int
			switch c := w.s[w.i]; {
			case c == '"' || c == '\'':
				var ok bool
				if lo, hi, ok = w.str(); !ok {
					return false
				}
			case isLetter(c) || c == '_' || c == '$':
				// A JavaScript object as Node prints it: { error: { message: '…' } }.
				lo = w.i
				for w.i < len(w.s) && (isIdentByte(w.s[w.i]) && w.s[w.i] != '.') {
					w.i++
				}
				hi = w.i
			default:
				return false
			}
			w.ws()
			if w.i >= len(w.s) || w.s[w.i] != ':' {
				return false
			}
			w.i++
			switch w.s[lo:hi] {
			case "error", "errors", "__type", "error_code", "errorType", "errorMessage", "error_message":
				w.v.BodyError = true
			}
			if !w.value(depth+1, w.s[lo:hi]) {
				return false
			}
			w.ws()
			if w.i < len(w.s) && w.s[w.i] == ',' {
				w.i++
				continue
			}
			if w.i < len(w.s) && w.s[w.i] == '}' {
				w.i++
				return true
			}
			return false
		}
	case '[':
		w.i++
		if contentContainer(key) {
			w.markContent(']')
		}
		for {
			w.ws()
			if w.i >= len(w.s) {
				return false
			}
			if w.s[w.i] == ']' {
				w.i++
				return true
			}
			if !w.value(depth+1, key) {
				return false
			}
			w.ws()
			if w.i < len(w.s) && w.s[w.i] == ',' {
				w.i++
				continue
			}
			if w.i < len(w.s) && w.s[w.i] == ']' {
				w.i++
				return true
			}
			return false
		}
	case '"', '\'':
		lo, hi, ok := w.str()
		if !ok {
			return false
		}
		w.leafString(key, lo, hi)
		return true
	default:
		lo := w.i
		for w.i < len(w.s) {
			c := w.s[w.i]
			if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\r' || c == '\n' {
				break
			}
			w.i++
		}
		if w.i == lo {
			return false
		}
		w.leafScalar(key, w.s[lo:w.i])
		return true
	}
}

// markContent notes model output when the container just opened (at w.i)
// is not empty.
func (w *walker) markContent(end byte) {
	w.ws()
	if w.i < len(w.s) && w.s[w.i] != end {
		w.v.HasContent = true
	}
}

// contentContainer: keys whose non-empty object or array is model output
// (tool calls: OpenAI tool_calls/function_call, Gemini functionCall,
// Bedrock toolUse, Anthropic tool_use input).
func contentContainer(key string) bool {
	switch key {
	case "tool_calls", "function_call", "functionCall", "toolUse", "tool_use", "executableCode":
		return true
	}
	return false
}

// contentKey: keys whose non-empty string is model output (OpenAI
// content/refusal/arguments, Anthropic text/thinking/partial_json, Gemini
// text, Ollama response, TGI generated_text, reasoning fields).
func contentKey(key string) bool {
	switch key {
	case "content", "text", "output_text", "reasoning_content", "reasoning", "thinking", "arguments",
		"partial_json", "refusal", "response", "generated_text", "completion":
		return true
	}
	return false
}

func (w *walker) leafString(key string, lo, hi int) {
	raw := w.s[lo:hi]
	v := w.v
	if hi > lo && contentKey(key) {
		v.HasContent = true
	}
	if key == "retryDelay" || key == "retry_delay" {
		v.RetryDelay = Span{Src: w.src, Lo: int32(lo), Hi: int32(hi)}
		w.fields++
		return
	}
	role := fieldRole(key)
	if role == roleNone {
		return
	}
	w.fields++
	if role == roleCode || role == roleBoth {
		if key == "code" || key == "status" || key == "error_code" || key == "http_code" {
			if n, ok := Status3(raw); ok && v.jsonCode == 0 {
				v.jsonCode = n
			}
		}
		code := unescapeSimple(raw)
		v.addCode(code, 0)
		if k := strings.LastIndexByte(code, '.'); k > 0 && k < len(code)-1 && identLike(code) {
			v.addCode(code[k+1:], 0)
		}
		v.noteCodeKey(key, raw)
		v.addText(raw)
		if len(code) >= 6 && identLike(code) {
			v.addWords(code)
		}
		return
	}
	// Text. JSON inside a string (OpenRouter metadata.raw, wrapped SDK
	// errors) is walked as JSON, also behind a short prefix ("Error from
	// provider(404): {…}", LiteLLM's "litellm.RateLimitError: … - {'error':
	// …}"); the whole string stays text too. The unescaped copy is one allocation per
	// embedded document, bounded by maxEmbed and maxDocs.
	if w.level < maxEmbed && v.ndocs < maxDocs {
		at := -1
		if looksLikeJSON(raw) {
			at = 0
		} else {
			at = embeddedStart(raw)
		}
		if at >= 0 {
			v.tmp = AppendUnescaped(v.tmp[:0], raw[at:])
			v.docs[v.ndocs] = string(v.tmp)
			v.ndocs++
			inner := walker{s: v.docs[v.ndocs-1], v: v, src: int8(v.ndocs), level: w.level + 1}
			inner.value(0, "")
			if inner.fields > 0 {
				w.fields += inner.fields
				if at > 0 {
					// The whole string stays text, as before the walk: the
					// words around the object are the wrapper's (LiteLLM's
					// exception names, a fallback's own error after it).
					v.addText(raw)
					if !v.Msg.OK() && isMessageKey(key) {
						v.Msg = Span{Src: w.src, Lo: int32(lo), Hi: int32(hi)}
					}
				}
				return
			}
		}
	}
	if !v.Msg.OK() && isMessageKey(key) {
		v.Msg = Span{Src: w.src, Lo: int32(lo), Hi: int32(hi)}
	}
	if hi > lo {
		v.sawMsg = true
	}
	v.addText(raw)
	v.noteText(raw)
}

func (w *walker) leafScalar(key, tok string) {
	var buf [32]byte
	if lk := lowerKey(key, &buf); isCodeKey(lk) && isInteger(tok) && !successCode(tok) {
		// Numeric codes: Baidu error_code 17, SiliconFlow code 20012,
		// MiniMax base_resp.status_code 1008; not a success's 0 or 200.
		w.v.addCode(strings.TrimPrefix(tok, "-"), 0)
		w.v.noteCodeKey(lk, tok)
		w.fields++
	}
	switch key {
	case "code", "status", "error_code", "status_code", "raw_status_code", "statusCode":
		if n, ok := Status3(tok); ok && w.v.jsonCode == 0 {
			w.v.jsonCode = n
		}
	case "retry_after", "retryAfter":
		if ms, ok := delay.Number(tok, 1); ok && ms > 0 {
			w.v.RetryAfterSec = ms
		}
	}
}

func isMessageKey(key string) bool {
	switch key {
	case "message", "msg", "detail", "error", "errorMessage", "error_message", "raw", "error_msg", "errmsg",
		"status_msg", "Message", "details":
		return true
	}
	return false
}

// noteCodeKey notes a code field whose value is not a success: with a
// message beside it, the object is an error (see View.Reset).
func (v *View) noteCodeKey(key, val string) {
	var buf [32]byte
	if isCodeKey(lowerKey(key, &buf)) && !successCode(val) {
		v.sawErrCode = true
	}
}

func isInteger(tok string) bool {
	tok = strings.TrimPrefix(tok, "-")
	if tok == "" || len(tok) > 12 {
		return false
	}
	for k := 0; k < len(tok); k++ {
		if !isDigit(tok[k]) {
			return false
		}
	}
	return true
}

// embeddedStart returns where an error object starts inside a string's raw
// (still escaped) contents, within its first 256 bytes: `{\"` (JSON in a
// JSON string), `{'` (a Python repr) or `{"` (JSON in a repr's string).
func embeddedStart(raw string) int {
	lim := len(raw)
	if lim > 256 {
		lim = 256
	}
	for i := 0; i+1 < lim; i++ {
		j := strings.IndexByte(raw[i:lim], '{')
		if j < 0 {
			return -1
		}
		i += j
		if i+1 < len(raw) && (raw[i+1] == '"' || raw[i+1] == '\'' || raw[i+1] == '\\' && i+2 < len(raw) && raw[i+2] == '"') {
			return i
		}
	}
	return -1
}

func looksLikeJSON(raw string) bool {
	t := strings.TrimLeft(raw, " \t\r\n")
	if strings.HasPrefix(t, `\n`) {
		t = strings.TrimLeft(t[2:], " ")
	}
	return len(t) > 1 && (t[0] == '{' || t[0] == '[')
}
