package classify

import (
	"bytes"
	"strings"
	"sync"

	"github.com/failbus/failbus/pkg/events"
)

// view is what the rules look at: one outcome digested once, so that no rule
// re-reads or re-lowercases the body. Its buffers come from a pool and are
// reused; nothing in a view outlives one Classify call.
//
// For a JSON body (also one wrapped in SSE "data:" or behind a text prefix
// such as "Error: 400 "), text holds the lower-cased error fields only —
// message, type, code, status, reason, detail, raw, quota ids, … — from any
// depth, including JSON nested inside a string (OpenRouter's
// metadata.raw, the Gemini CLI's message). Prompt content a provider echoes
// elsewhere in the body is therefore not matched. For any other body, text is
// the lower-cased body itself (HTML pages, plain text). Structured codes
// (error.type, error.code, error.status, __type, reason, x-amzn-errortype) are
// also kept apart for exact matching. Python reprs of dicts, as SDK errors
// print them ("Error code: 429 - {'error': {…}}"), are read like JSON, and so
// is an object behind a short prefix inside a string. Tabs and line breaks
// in the text are spaces, so a message wrapped across lines still matches.
type view struct {
	status         int  // effective status (see effectiveStatus)
	statusFromBody bool // status came from the body's error.code on a 0/2xx response
	emptyBody      bool
	placeholder    bool // the body is a client's "NNN status code (no body)"
	html           bool
	json           bool
	bodyError      bool // the body holds an error object (key error, errors, __type, …)
	whole          bool // the body is one complete JSON document (no SSE, no prefix)
	hasContent     bool // the JSON holds model output: text, content, tool calls
	fromTransport  bool // the error object came from transport_error (see digestTransport)

	text     []byte   // lower-cased error text, see above
	hits     []uint64 // body patterns found in text (Classifier.textHits)
	scanned  bool
	textFull bool     // text hit its size cap: it may not hold all the body
	thits    []uint64 // transport patterns found in trans
	chits    []uint64 // rule codes among codes
	cscanned bool
	tscanned bool
	trans    []byte // lower-cased transport_error
	codeBuf  []byte // lower-cased codes, back to back
	codes    [maxCodes]span
	ncodes   int
	tmp      []byte          // unescape scratch
	docs     [maxDocs]string // JSON documents found inside strings
	ndocs    int
	msg      span // the provider's own message, for evidence
	titleLo  int  // <title> of an HTML body, offsets into body
	titleHi  int
	body     string
	jsonCode int // first numeric error.code in 100..599

	retryDelay    span  // Google RetryInfo.retryDelay
	retryAfterSec int64 // numeric retry_after (seconds)
}

const (
	maxCodes     = 24
	maxEmbed     = 2        // levels of JSON inside a JSON string
	maxDocs      = 4        // embedded documents kept per outcome
	maxTextBytes = 16 << 10 // error text examined per outcome
	maxPageBytes = 8 << 10  // of a non-JSON body (HTML pages, text)
	maxTransport = 4 << 10
	maxJSONDepth = 24
)

// span locates bytes in the body (src 0) or in an embedded JSON document
// (src i+1 for docs[i]); src -1 means unset.
type span struct {
	src    int8
	lo, hi int32
}

func (s span) ok() bool { return s.src >= 0 && s.hi > s.lo }

var noSpan = span{src: -1}

var viewPool = sync.Pool{New: func() any {
	return &view{text: make([]byte, 0, 1024), trans: make([]byte, 0, 256), codeBuf: make([]byte, 0, 256)}
}}

func getView() *view { return viewPool.Get().(*view) }

func putView(v *view) {
	if cap(v.text) > 4*maxTextBytes || cap(v.trans) > 4*maxTransport {
		return // let an outsized buffer go
	}
	v.body = ""
	viewPool.Put(v)
}

// reset prepares v for o.
func (v *view) reset(o *events.Outcome) {
	v.text = v.text[:0]
	v.scanned, v.tscanned, v.cscanned, v.textFull = false, false, false, false
	v.trans = v.trans[:0]
	v.codeBuf = v.codeBuf[:0]
	v.ncodes = 0
	for i := 0; i < v.ndocs; i++ {
		v.docs[i] = ""
	}
	v.ndocs = 0
	v.msg = noSpan
	v.retryDelay = noSpan
	v.retryAfterSec = 0
	v.titleLo, v.titleHi = 0, 0
	v.jsonCode = 0
	v.json, v.html, v.statusFromBody, v.bodyError = false, false, false, false
	v.whole, v.hasContent, v.fromTransport = false, false, false
	v.body = o.Body

	body := strings.TrimSpace(o.Body)
	v.placeholder = false
	switch body {
	case "", "{}", "[]", "null", `""`:
		v.emptyBody = true
	default:
		v.placeholder = isNoBodyPlaceholder(body)
		v.emptyBody = v.placeholder
	}
	if !v.emptyBody {
		v.digestBody(o.Body)
	}
	if o.TransportError != "" {
		t := o.TransportError
		if len(t) > maxTransport {
			t = t[:maxTransport]
		}
		v.trans = appendLower(v.trans, t)
		if v.emptyBody {
			v.digestTransport(o.TransportError)
		}
	}
	if s, ok := o.Headers["x-amzn-errortype"]; ok {
		v.addCode(s, 0)
	}
	v.status = o.Status
	if (o.Status == 0 || o.Status >= 200 && o.Status < 300) && v.jsonCode >= 400 {
		v.status = v.jsonCode
		v.statusFromBody = true
	}
}

// isNoBodyPlaceholder reports whether body is the text a client library
// put where the response had no body: the Stainless SDKs (openai-node,
// anthropic-sdk-typescript, …) raise `${status} status code (no body)`, and
// `(no status code or body)` without a status; agents that publish the
// SDK's error message as the body send exactly that (seed 001: "400 status
// code (no body)"). It carries no more than an empty body does, so it is
// classified as one: otherwise a Cerebras overflow would look explained,
// and a gateway's empty 400 would keep an upstream_code's overflow claim.
func isNoBodyPlaceholder(body string) bool {
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
	_, ok := status3(body[:3])
	return ok
}

// digestBody fills text, codes and msg from a non-empty body.
func (v *view) digestBody(body string) {
	trim := strings.TrimLeft(body, " \t\r\n")
	if trim != "" && trim[0] == '<' {
		v.html = true
	}
	start := -1
	if trim != "" && (trim[0] == '{' || trim[0] == '[') {
		start = len(body) - len(trim)
	} else if !v.html {
		// A JSON object behind a short prefix: "Error: 400 {…}", SSE
		// "event: error\ndata: {…}", Python's "Error code: 503 - {'error': …}".
		if i := objectStart(body, 512); i >= 0 {
			start = i
			v.text = appendLower(v.text, body[:i])
		}
	}
	if start >= 0 {
		w := walker{s: body, i: start, v: v}
		ok := w.value(0, "")
		v.json = w.fields > 0
		v.whole = ok && start == len(body)-len(trim) && strings.TrimSpace(body[w.i:]) == ""
		if v.json || v.whole {
			return
		}
		v.text = v.text[:0]
	}
	t := body
	if len(t) > maxPageBytes {
		t = t[:maxPageBytes]
		v.textFull = true
	}
	v.text = appendLower(v.text, t)
	if v.html {
		if i := bytes.Index(v.text, []byte("<title>")); i >= 0 {
			if j := bytes.Index(v.text[i:], []byte("</title>")); j > 0 {
				v.titleLo, v.titleHi = i+len("<title>"), i+j
			}
		}
	}
}

// str returns the raw (still JSON-escaped) text a span points at.
func (v *view) str(s span) string {
	if !s.ok() {
		return ""
	}
	doc := v.body
	if s.src > 0 {
		doc = v.docs[s.src-1]
	}
	if int(s.hi) > len(doc) {
		return ""
	}
	return doc[s.lo:s.hi]
}

// addCode records a structured code, normalised: lower case, the part after
// a '#' (com.amazon.coral.service#ThrottlingException) and before a ':'
// (x-amzn-errortype: ThrottlingException:http://…).
func (v *view) addCode(raw string, _ int) {
	if v.ncodes == maxCodes || raw == "" || len(raw) > 128 {
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
	lo := len(v.codeBuf)
	v.codeBuf = appendLower(v.codeBuf, raw)
	v.codes[v.ncodes] = span{lo: int32(lo), hi: int32(len(v.codeBuf))}
	v.ncodes++
}

// addText appends one field's lower-cased, unescaped value to text.
func (v *view) addText(raw string) {
	if len(v.text) >= maxTextBytes {
		v.textFull = true
		return
	}
	if len(v.text) > 0 {
		v.text = append(v.text, '\n')
	}
	if len(raw) > maxTextBytes-len(v.text) {
		raw = raw[:maxTextBytes-len(v.text)]
		v.textFull = true
	}
	v.text = appendLowerUnescaped(v.text, raw)
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
		if i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\'') {
			return i
		}
	}
	return -1
}

// digestTransport reads an error object a client library put in its error
// message when the body is empty: the Anthropic SDK's "received error while
// streaming: {…overloaded_error…}", "SSE Error: {…}". It is the provider's
// own error event, so it counts as the body's: its codes and message decide,
// and transport rules yield to it as they do to an error object in a body.
func (v *view) digestTransport(t string) {
	i := objectStart(t, 512)
	if i < 0 {
		return
	}
	w := walker{s: t, i: i, v: v}
	w.value(0, "")
	if w.fields == 0 || !v.bodyError {
		// Not an error object: forget what the walk collected.
		v.text, v.codeBuf, v.ncodes, v.msg, v.jsonCode = v.text[:0], v.codeBuf[:0], 0, noSpan, 0
		v.retryDelay, v.retryAfterSec, v.bodyError, v.hasContent = noSpan, 0, false, false
		for k := 0; k < v.ndocs; k++ {
			v.docs[k] = ""
		}
		v.ndocs = 0
		return
	}
	v.body = t // spans of src 0 point into t
	v.json, v.emptyBody, v.placeholder, v.fromTransport = true, false, false, true
}
