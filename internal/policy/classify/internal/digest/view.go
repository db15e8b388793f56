// Package digest reads one outcome once for the classification rules: the
// body's error text (lower-cased, error fields only for JSON), structured
// codes, the provider's message, retry hints in the body and the transport
// error, in pooled buffers. Nothing in it decides a class; the rules in
// package classify read a View.
package digest

import (
	"strings"
	"sync"

	"github.com/failbus/failbus/internal/ascii"

	"github.com/failbus/failbus/pkg/events"
)

// View is what the rules look at: one outcome digested once, so that no rule
// re-reads or re-lowercases the body. Its buffers come from a pool and are
// reused; nothing in a View outlives one Classify call.
//
// For a JSON body (also one wrapped in SSE "data:" or behind a text prefix
// such as "Error: 400 "), Text holds the lower-cased error fields only —
// message, type, code, status, reason, detail, raw, quota ids, … — from any
// depth, including JSON nested inside a string (OpenRouter's
// metadata.raw, the Gemini CLI's message). Prompt content a provider echoes
// elsewhere in the body is therefore not matched. For any other body, Text is
// the lower-cased body itself (HTML pages, plain text). Structured codes
// (error.type, error.code, error.status, __type, reason, x-amzn-errortype) are
// also kept apart for exact matching. Python reprs of dicts, as SDK errors
// print them ("Error code: 429 - {'error': {…}}"), are read like JSON, and so
// is an object behind a short prefix inside a string. Tabs and line breaks
// in the text are spaces, so a message wrapped across lines still matches.
type View struct {
	Status         int  // effective status (see Reset)
	StatusFromBody bool // status came from the body's error.code on a 0/2xx response
	EmptyBody      bool
	Placeholder    bool // the body is a client's "NNN status code (no body)"
	HTML           bool
	JSON           bool
	BodyError      bool // the body holds an error object (key error, errors, __type, …)
	Whole          bool // the body is one complete JSON document (no SSE, no prefix)
	HasContent     bool // the JSON holds model output: text, content, tool calls
	fromTransport  bool // the error object came from transport_error (see digestTransport)

	// Prov is the outcome's provider among the providers the classifier's
	// rules are scoped to (set by the classifier after Reset), -1 if none.
	Prov int32

	Text []byte // lower-cased error text, see above
	// Words are the words of the error names found in the error text and
	// codes (AccountOverdueError → "account overdue error"), one name a
	// line; only word patterns (Rule.Words) read them.
	Words    []byte
	Hits     []uint64 // body patterns found in text (Classifier.textHits)
	Scanned  bool
	TextFull bool     // text hit its size cap: it may not hold all the body
	THits    []uint64 // transport patterns found in trans
	WHits    []uint64 // ASCII word patterns found in text (Classifier.wordHits)
	WScanned bool
	UHits    []uint64 // non-ASCII word patterns found in text
	UScanned bool
	CHits    []uint64 // rule codes among codes
	CScanned bool
	TScanned bool
	Trans    []byte // lower-cased transport_error
	CodeBuf  []byte // lower-cased codes, back to back
	Codes    [maxCodes]Span
	NCodes   int
	tmp      []byte          // unescape scratch
	docs     [maxDocs]string // JSON documents found inside strings
	ndocs    int
	Msg      Span // the provider's own message, for evidence
	TitleLo  int  // <title> of an HTML body, offsets into body
	TitleHi  int
	body     string
	jsonCode int // first numeric error.code in 100..599

	RetryDelay    Span  // Google RetryInfo.retryDelay
	RetryAfterSec int64 // numeric retry_after (seconds)

	// TextFromTransport: the body is empty and Text is the transport
	// error's text (it holds no error object), so the message rules read
	// what the client library reported.
	TextFromTransport bool

	nidents    int  // identifiers read (noteIdents)
	sawErrCode bool // a code field with a non-success value
	sawMsg     bool // a non-empty message field
}

const (
	maxCodes     = 24
	maxEmbed     = 2        // levels of JSON inside a JSON string
	maxDocs      = 4        // embedded documents kept per outcome
	maxTextBytes = 16 << 10 // error text examined per outcome
	maxPageBytes = 8 << 10  // of a non-JSON body (HTML pages, text)
	MaxTransport = 4 << 10  // transport_error bytes examined
	maxJSONDepth = 24
)

// Span locates bytes in the body (src 0) or in an embedded JSON document
// (src i+1 for docs[i]); src -1 means unset.
type Span struct {
	Src    int8
	Lo, Hi int32
}

// OK reports whether the span points at something.
func (s Span) OK() bool { return s.Src >= 0 && s.Hi > s.Lo }

// NoSpan is the unset span.
var NoSpan = Span{Src: -1}

var viewPool = sync.Pool{New: func() any {
	return &View{Text: make([]byte, 0, 1024), Trans: make([]byte, 0, 256), CodeBuf: make([]byte, 0, 256),
		Words: make([]byte, 0, 256)}
}}

// Get takes a View from the pool; Put returns it.
func Get() *View { return viewPool.Get().(*View) }

// Put returns v to the pool unless its buffers grew outsized.
func Put(v *View) {
	if cap(v.Text) > 4*maxTextBytes || cap(v.Trans) > 4*MaxTransport {
		return // let an outsized buffer go
	}
	v.body = ""
	viewPool.Put(v)
}

// Reset prepares v for o.
func (v *View) Reset(o *events.Outcome) {
	v.Text = v.Text[:0]
	v.Words = v.Words[:0]
	v.Scanned, v.TScanned, v.CScanned, v.TextFull = false, false, false, false
	v.WScanned, v.UScanned = false, false
	v.Trans = v.Trans[:0]
	v.CodeBuf = v.CodeBuf[:0]
	v.NCodes = 0
	for i := 0; i < v.ndocs; i++ {
		v.docs[i] = ""
	}
	v.ndocs = 0
	v.Msg = NoSpan
	v.RetryDelay = NoSpan
	v.RetryAfterSec = 0
	v.TitleLo, v.TitleHi = 0, 0
	v.jsonCode = 0
	v.JSON, v.HTML, v.StatusFromBody, v.BodyError = false, false, false, false
	v.Whole, v.HasContent, v.fromTransport = false, false, false
	v.TextFromTransport, v.nidents, v.sawErrCode, v.sawMsg = false, 0, false, false
	v.body = o.Body

	body := strings.TrimSpace(o.Body)
	v.Placeholder = false
	switch body {
	case "", "{}", "[]", "null", `""`:
		v.EmptyBody = true
	default:
		v.Placeholder = IsNoBodyPlaceholder(body)
		v.EmptyBody = v.Placeholder
	}
	if !v.EmptyBody {
		v.digestBody(o.Body)
	}
	if o.TransportError != "" {
		t := o.TransportError
		if len(t) > MaxTransport {
			t = t[:MaxTransport]
		}
		v.Trans = appendLower(v.Trans, t)
		if v.EmptyBody {
			v.digestTransport(o.TransportError)
			if !v.JSON {
				// No error object in it: the transport error's text is the
				// error text, read like a text body.
				v.Text = appendLowerText(v.Text[:0], t)
				v.noteKeyValues(v.Text)
				v.noteText(t)
				v.TextFromTransport = true
			}
		}
	}
	if v.sawErrCode && v.sawMsg || v.sawMsg && v.Whole && !v.HasContent {
		// An object with a failing code and a message is an error object
		// whatever its keys are called: Baidu {"error_code":17,
		// "error_msg":…}, MiniMax base_resp, SiliconFlow {"code":20012,
		// "message":…}, iFlytek header.code. So is a whole JSON body with a
		// message and no output (Portkey's 200 {"html-message": "Network
		// connection lost."}).
		v.BodyError = true
	}
	if s, ok := o.Headers["x-amzn-errortype"]; ok {
		v.addCode(s, 0)
	}
	v.Status = o.Status
	if (o.Status == 0 || o.Status >= 200 && o.Status < 300) && v.jsonCode >= 400 {
		v.Status = v.jsonCode
		v.StatusFromBody = true
	}
}

// IsNoBodyPlaceholder reports whether body is the text a client library
// put where the response had no body: the Stainless SDKs (openai-node,
// anthropic-sdk-typescript, …) raise `${status} status code (no body)`, and
// `(no status code or body)` without a status; agents that publish the
// SDK's error message as the body send exactly that ("400 status code (no
// body)"). It carries no more than an empty body does, so it is
// classified as one: otherwise a Cerebras overflow would look explained,
// and a gateway's empty 400 would keep an upstream_code's overflow claim.
func IsNoBodyPlaceholder(body string) bool {
	const tail = " status code (no body)"
	if len(body) > len("Error: 400")+len(tail) {
		return false
	}
	if body == "(no status code or body)" {
		return true
	}
	body = strings.TrimPrefix(body, "Error: ")
	if len(body) != 3+len(tail) || body[3:] != tail {
		return false
	}
	_, ok := Status3(body[:3])
	return ok
}

// digestBody fills text, codes and msg from a non-empty body.
func (v *View) digestBody(body string) {
	trim := strings.TrimLeft(body, " \t\r\n")
	if len(trim) > 1 && trim[0] == '<' && (isLetter(trim[1]) || trim[1] == '!' || trim[1] == '?') {
		v.HTML = true // a page, not "<400> InternalError…"
	}
	start := -1
	if trim != "" && (trim[0] == '{' || trim[0] == '[') {
		start = len(body) - len(trim)
	} else if i := sseErrorEvent(trim); i >= 0 {
		// A stream that ended on an error event after some output: the
		// last error event is the error.
		start = len(body) - len(trim) + i
		v.HasContent = true
	} else if !v.HTML {
		// A JSON object behind a short prefix: "Error: 400 {…}", SSE
		// "event: error\ndata: {…}", Python's "Error code: 503 - {'error': …}".
		if i := objectStart(body, 512); i >= 0 {
			start = i
			v.Text = appendLowerText(v.Text, body[:i])
		}
	}
	if start >= 0 {
		w := walker{s: body, i: start, v: v}
		ok := w.value(0, "")
		v.JSON = w.fields > 0
		v.Whole = ok && start == len(body)-len(trim) && strings.TrimSpace(body[w.i:]) == ""
		if v.JSON && !ok {
			// A broken object (cut short, quotes mangled by a wrapper):
			// what the walk could not read is still the error's text.
			v.addText(body[start:])
			v.noteText(body[start:])
		}
		if v.JSON || v.Whole {
			return
		}
		v.Text = v.Text[:0]
	}
	t := body
	if len(t) > maxPageBytes {
		t = t[:maxPageBytes]
		v.TextFull = true
	}
	v.Text = appendLowerText(v.Text, t)
	if !v.HTML {
		v.noteKeyValues(v.Text)
		v.noteText(t)
	}
	if v.HTML {
		if i := ascii.IndexFold(t, "<title>"); i >= 0 {
			if j := ascii.IndexFold(t[i:], "</title>"); j > 0 {
				v.TitleLo, v.TitleHi = i+len("<title>"), i+j
			}
		}
	}
}

// Str returns the raw (still JSON-escaped) text a span points at.
func (v *View) Str(s Span) string {
	if !s.OK() {
		return ""
	}
	doc := v.body
	if s.Src > 0 {
		doc = v.docs[s.Src-1]
	}
	if int(s.Hi) > len(doc) {
		return ""
	}
	return doc[s.Lo:s.Hi]
}

// addCode records a structured code, normalised: lower case, the part after
// a '#' (com.amazon.coral.service#ThrottlingException) and before a ':'
// (x-amzn-errortype: ThrottlingException:http://…).
func (v *View) addCode(raw string, _ int) {
	if v.NCodes == maxCodes || raw == "" || len(raw) > 128 {
		return
	}
	if i := strings.LastIndexByte(raw, '#'); i >= 0 {
		raw = raw[i+1:]
	}
	if i := strings.IndexByte(raw, ':'); i >= 0 {
		raw = raw[:i]
	}
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return
	}
	lo := len(v.CodeBuf)
	v.CodeBuf = appendLower(v.CodeBuf, raw)
	v.Codes[v.NCodes] = Span{Lo: int32(lo), Hi: int32(len(v.CodeBuf))}
	v.NCodes++
}

// addText appends one field's lower-cased, unescaped value to text.
func (v *View) addText(raw string) {
	if len(v.Text) >= maxTextBytes {
		v.TextFull = true
		return
	}
	if len(v.Text) > 0 {
		v.Text = append(v.Text, '\n')
	}
	if len(raw) > maxTextBytes-len(v.Text) {
		raw = raw[:maxTextBytes-len(v.Text)]
		v.TextFull = true
	}
	v.Text = appendLowerUnescaped(v.Text, raw)
}

// objectStart returns where a JSON object (or a Python dict's repr) starts
// in the first lim bytes of s, or -1.
func objectStart(s string, lim int) int {
	if lim > len(s) {
		lim = len(s)
	}
	for i := 0; i+1 < lim; i++ {
		j := strings.IndexByte(s[i:lim], '{')
		if j < 0 {
			return -1
		}
		i += j
		if i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\'') || jsKeyAt(s, i+1) {
			return i
		}
	}
	return -1
}

// jsKeyAt reports whether s holds, at i, a JavaScript object key as Node
// prints one: " error: " (a space, an identifier, a colon).
func jsKeyAt(s string, i int) bool {
	if i >= len(s) || s[i] != ' ' {
		return false
	}
	i++
	j := i
	for j < len(s) && (isLetter(s[j]) || s[j] == '_' || j > i && isDigit(s[j])) {
		j++
	}
	return j > i && j < len(s) && s[j] == ':'
}

// sseErrorEvent returns where the data of the last error event of an SSE
// stream starts in body, or -1: an "event: error" line's data, or a data
// line whose object has an "error" key. Only a body that starts as a
// stream ("data:" or "event:") is read so.
func sseErrorEvent(body string) int {
	if !strings.HasPrefix(body, "data:") && !strings.HasPrefix(body, "event:") {
		return -1
	}
	found, errEvent := -1, false
	for off := 0; off < len(body); {
		end := strings.IndexByte(body[off:], '\n')
		if end < 0 {
			end = len(body)
		} else {
			end += off
		}
		line := strings.TrimRight(body[off:end], "\r")
		switch {
		case strings.HasPrefix(line, "event:"):
			errEvent = strings.TrimSpace(line[len("event:"):]) == "error"
		case strings.HasPrefix(line, "data:"):
			d := strings.TrimLeft(line[len("data:"):], " ")
			if strings.HasPrefix(d, "{") && (errEvent || strings.Contains(d, `"error"`)) {
				found = off + len(line) - len(d)
			}
		case line == "":
			errEvent = false
		}
		off = end + 1
	}
	return found
}

// digestTransport reads an error object a client library put in its error
// message when the body is empty: the Anthropic SDK's "received error while
// streaming: {…overloaded_error…}", "SSE Error: {…}". It is the provider's
// own error event, so it counts as the body's: its codes and message decide,
// and transport rules yield to it as they do to an error object in a body.
func (v *View) digestTransport(t string) {
	i := objectStart(t, 512)
	if i < 0 {
		return
	}
	w := walker{s: t, i: i, v: v}
	w.value(0, "")
	if w.fields == 0 || !v.BodyError {
		// Not an error object: forget what the walk collected.
		v.Text, v.CodeBuf, v.NCodes, v.Msg, v.jsonCode = v.Text[:0], v.CodeBuf[:0], 0, NoSpan, 0
		v.Words = v.Words[:0]
		v.RetryDelay, v.RetryAfterSec, v.BodyError, v.HasContent = NoSpan, 0, false, false
		v.sawErrCode, v.sawMsg, v.nidents = false, false, 0
		for k := 0; k < v.ndocs; k++ {
			v.docs[k] = ""
		}
		v.ndocs = 0
		return
	}
	v.body = t // spans of src 0 point into t
	v.JSON, v.EmptyBody, v.Placeholder, v.fromTransport = true, false, false, true
}
