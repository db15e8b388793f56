package policy

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/failbus/failbus/pkg/events"
)

// Classification (seeds 001 and 002): every decision downstream is only as
// good as the class it starts from. A classifier can lose information
// (status and code flattened into a sentence) or, worse, fabricate it (a
// Cerebras-only rule labels a generic gateway's empty 400 a context
// overflow; the overflow is not retryable; a long task dies on a transient
// hiccup). This file keeps the raw evidence, names the rule that decided,
// and lets harder evidence overrule a heuristic.

// Defaults of ClassifyConfig.
const (
	// DefaultOverflowEvidenceRatio: an overflow claim is overruled when the
	// request is known to use less than 90% of the model's context window.
	// Token counts are estimates on both sides (tokenizers differ, tool
	// schemas and images count), so a request close to the window may
	// really overflow; one at 16% of it (seed 001: 41k of 256k) does not.
	DefaultOverflowEvidenceRatio = 0.9
	// DefaultQuotaAfter: a rate limit whose provider hint asks to wait longer
	// than an hour is reported as quota_exhausted — it will not clear soon
	// (Azure "retry after 86400 seconds", Gemini "reset after 8h44m7s").
	DefaultQuotaAfter = time.Hour
)

// DefaultEmptyOverflowProviders are the providers known to report a context
// overflow as a 400/413 with an empty body (Cerebras). For everyone else an
// empty 4xx is unexplained, and so a retryable server_error.
func DefaultEmptyOverflowProviders() []string { return []string{"cerebras"} }

// ClassifyConfig is the `classify:` section of the policy file.
//
//	classify:
//	  rules: []                          # user rules, tried before the built-in ones
//	  empty_overflow_providers: [cerebras]
//	  overflow_evidence_ratio: 0.9
//	  quota_after: 1h
//
// Every key is optional; the zero value is the default policy.
type ClassifyConfig struct {
	// Rules are user rules, tried in order before every built-in rule. The
	// first rule that matches decides (subject to the overflow evidence
	// check). See Rule for the format.
	Rules []Rule `yaml:"rules,omitempty" json:"rules,omitempty"`
	// EmptyOverflowProviders are the providers for which an empty-body 400
	// or 413 means "context overflow" (rule cerebras.empty_400_overflow).
	// Absent: DefaultEmptyOverflowProviders ([cerebras]). An explicit empty
	// list turns the rule off.
	EmptyOverflowProviders []string `yaml:"empty_overflow_providers,omitempty" json:"empty_overflow_providers,omitempty"`
	// OverflowEvidenceRatio: when an outcome carries request_tokens and
	// context_window and request_tokens/context_window is below this ratio,
	// any context_overflow claim — by a pattern, a provider heuristic or
	// upstream_code — is overruled: the classification records `overruled:
	// context_overflow` with the token evidence, and the next rule decides.
	// Must be in (0, 1]; 0 means DefaultOverflowEvidenceRatio (0.9).
	OverflowEvidenceRatio float64 `yaml:"overflow_evidence_ratio,omitempty" json:"overflow_evidence_ratio,omitempty"`
	// QuotaAfter: a rate_limit whose retry hint is longer than this becomes
	// quota_exhausted (`overruled: rate_limit`). 0 means DefaultQuotaAfter
	// (1h); negative turns the promotion off.
	QuotaAfter time.Duration `yaml:"quota_after,omitempty" json:"quota_after,omitempty"`
}

// Validate checks the section and names the offending rule or key.
func (c ClassifyConfig) Validate() error {
	if c.OverflowEvidenceRatio < 0 || c.OverflowEvidenceRatio > 1 {
		return fmt.Errorf("classify.overflow_evidence_ratio: %v is outside (0, 1]", c.OverflowEvidenceRatio)
	}
	for i, p := range c.EmptyOverflowProviders {
		if strings.TrimSpace(p) == "" {
			return fmt.Errorf("classify.empty_overflow_providers[%d]: empty provider name", i)
		}
	}
	builtinIDs := make(map[string]bool, len(builtinRules))
	for _, b := range builtinRules {
		builtinIDs[b.ID] = true
	}
	seen := make(map[string]int, len(c.Rules))
	for i := range c.Rules {
		r := &c.Rules[i]
		if err := r.validate(i, builtinIDs); err != nil {
			return err
		}
		if j, dup := seen[r.ID]; dup {
			return &RuleError{Index: i, ID: r.ID, Field: "id", Problem: fmt.Sprintf("duplicate of classify.rules[%d]", j)}
		}
		seen[r.ID] = i
	}
	return nil
}

// Classifier turns outcomes into classifications. Build one with
// NewClassifier (rules are compiled once); it is safe for concurrent use and
// does no I/O.
//
// # Rule precedence
//
// Rules are tried in this order; the first that matches decides:
//
//  0. User rules from ClassifyConfig.Rules, in file order.
//  1. stop_reason refusals (stop.refusal); then an outcome the agent marked
//     ok is `ok`.
//  2. Transport, when no HTTP error arrived (status 0 or 2xx): stream
//     invariant, DNS, TLS-handshake timeout, connection cut during TLS, TLS
//     and certificates, timeouts, connection errors, any other transport
//     error. Node/undici/Bun, Go net/http and Python spellings.
//  3. Structured error codes (error.type / error.code / error.status /
//     __type / reason / x-amzn-errortype), most specific first: quota before
//     rate limit (insufficient_quota is a 429), Google per-day quotas before
//     RESOURCE_EXHAUSTED, per-day limits of rate-limit errors, overloaded,
//     server errors, overflow codes, refusals, auth, model, parameters.
//  4. Provider-scoped heuristics: an empty 400/413 is an overflow only for
//     EmptyOverflowProviders (cerebras.empty_400_overflow).
//  5. What the provider's message says: overflow, model, parameter, auth,
//     refusal, quota, overloaded and rate-limit phrases. Rate-limit phrases
//     count only on a 429/503 or a streamed error: a 400 whose body echoes
//     "429" or "rate limit" is not a rate limit.
//  6. Gateway pages: Cloudflare 52x, Envoy upstream errors, a proxy's 413,
//     HTML 5xx and 4xx pages from ALB/nginx.
//  7. upstream_code, another library's verdict: a hint, used only when
//     nothing above decided.
//  8. Hard evidence: request_tokens >= context_window on a 400/413/422 is an
//     overflow.
//  9. The status alone: an unexplained empty-body 4xx is server_error
//     (gateway.empty_4xx); 401/403/407 auth, 402 quota, 404 model (when the
//     body mentions one), 408 timeout, 422 unsupported_param, 429 rate
//     limit, 529 overloaded, 5xx server error, other 4xx bad_request, an
//     empty 2xx empty_response.
//  10. Nothing matched: `unknown` (rule "none").
//
// Two checks can overrule the first match; the classification then carries
// the claimed class in Overruled, the reason in Evidence, and the final rule
// in Rule:
//
//   - Overflow evidence: a context_overflow claim (any rule) is rejected
//     when request_tokens/context_window < OverflowEvidenceRatio, or — for an
//     upstream_code claim on an empty body — when the provider is not one of
//     EmptyOverflowProviders (the code can only have come from a heuristic).
//     Matching then resumes after the claiming rule, skipping every other
//     overflow rule.
//   - Long waits: a rate_limit whose retry hint exceeds QuotaAfter is
//     quota_exhausted (rule hint.quota_after).
//
// Retryable is the contract default of the final class; the scheduler
// applies the policy's retryable set.
type Classifier struct {
	rules      []*rule
	pats       patternSet       // every body pattern and hint phrase, one automaton
	tpats      patternSet       // every transport pattern
	codeIDs    map[string]int32 // every structured code a rule names
	hintIDs    [len(hintPhrases)]int32
	redactIDs  []int32 // redactTriggers in pats
	tredactIDs []int32 // redactTriggers in tpats
	// byStatus lists, for each status 0..999, the rules (indexes into
	// rules, in order) whose status condition can hold; other statuses use
	// anyStatus.
	byStatus      [1000][]uint16
	anyStatus     []uint16
	emptyOverflow []string
	ratio         float64
	quotaAfterMS  int64 // <0: off
}

// NewClassifier validates cfg and compiles its rules with the built-in ones.
func NewClassifier(cfg ClassifyConfig) (*Classifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Classifier{ratio: cfg.OverflowEvidenceRatio, codeIDs: map[string]int32{}}
	if c.ratio == 0 {
		c.ratio = DefaultOverflowEvidenceRatio
	}
	eo := cfg.EmptyOverflowProviders
	if eo == nil {
		eo = DefaultEmptyOverflowProviders()
	}
	for _, p := range eo {
		c.emptyOverflow = append(c.emptyOverflow, strings.ToLower(strings.TrimSpace(p)))
	}
	switch {
	case cfg.QuotaAfter == 0:
		c.quotaAfterMS = DefaultQuotaAfter.Milliseconds()
	case cfg.QuotaAfter < 0:
		c.quotaAfterMS = -1
	default:
		c.quotaAfterMS = cfg.QuotaAfter.Milliseconds()
	}
	for _, r := range cfg.Rules {
		c.rules = append(c.rules, compileRule(r))
	}
	for _, b := range builtinRules {
		r := compileRule(b.Rule)
		r.html, r.heuristic, r.emptyOverflow, r.when, r.note = b.html, b.heuristic, b.emptyOverflow, b.when, b.note
		r.transportStage = b.transport
		c.rules = append(c.rules, r)
	}
	for _, r := range c.rules {
		r.setFeatures()
		for _, p := range r.body {
			r.bodyIDs = append(r.bodyIDs, c.pats.add(string(p)))
		}
		for _, p := range r.notBody {
			r.notBodyIDs = append(r.notBodyIDs, c.pats.add(string(p)))
		}
		for _, p := range r.transport {
			r.transIDs = append(r.transIDs, c.tpats.add(string(p)))
		}
		for _, code := range r.codes {
			id, ok := c.codeIDs[string(code)]
			if !ok {
				id = int32(len(c.codeIDs))
				c.codeIDs[string(code)] = id
			}
			r.codeIDs = append(r.codeIDs, id)
		}
	}
	for i, p := range hintPhrases {
		c.hintIDs[i] = c.pats.add(p)
	}
	for _, p := range redactTriggers {
		c.redactIDs = append(c.redactIDs, c.pats.add(p))
		c.tredactIDs = append(c.tredactIDs, c.tpats.add(p))
	}
	c.pats.build()
	c.tpats.build()
	if len(c.rules) > 1<<16 {
		return nil, fmt.Errorf("classify: %d rules, at most %d", len(c.rules), 1<<16)
	}
	for i, r := range c.rules {
		if r.anyStatus {
			c.anyStatus = append(c.anyStatus, uint16(i))
		}
	}
	var prev []uint16
	for st := range c.byStatus {
		var list []uint16
		for i, r := range c.rules {
			if r.anyStatus || r.status.has(st) {
				list = append(list, uint16(i))
			}
		}
		if slices.Equal(list, prev) {
			list = prev // share identical lists
		}
		c.byStatus[st], prev = list, list
	}
	return c, nil
}

// textHits returns which body patterns occur in v's error text, scanning
// it once per outcome, on first use.
func (c *Classifier) textHits(v *view) []uint64 {
	if !v.scanned {
		n := c.pats.words()
		if cap(v.hits) < n {
			v.hits = make([]uint64, n)
		}
		v.hits = v.hits[:n]
		clear(v.hits)
		c.pats.scan(v.text, v.hits)
		v.scanned = true
	}
	return v.hits
}

// codeHits returns which rule codes v's structured codes are, looked up
// once per outcome, on first use.
func (c *Classifier) codeHits(v *view) []uint64 {
	if !v.cscanned {
		n := (len(c.codeIDs) + 63) / 64
		if cap(v.chits) < n {
			v.chits = make([]uint64, n)
		}
		v.chits = v.chits[:n]
		clear(v.chits)
		for i := 0; i < v.ncodes; i++ {
			sp := v.codes[i]
			if id, ok := c.codeIDs[string(v.codeBuf[sp.lo:sp.hi])]; ok {
				v.chits[id>>6] |= 1 << (id & 63)
			}
		}
		v.cscanned = true
	}
	return v.chits
}

// transHits is textHits for the transport error.
func (c *Classifier) transHits(v *view) []uint64 {
	if !v.tscanned {
		n := c.tpats.words()
		if cap(v.thits) < n {
			v.thits = make([]uint64, n)
		}
		v.thits = v.thits[:n]
		clear(v.thits)
		c.tpats.scan(v.trans, v.thits)
		v.tscanned = true
	}
	return v.thits
}

var defaultClassifier = func() *Classifier {
	c, err := NewClassifier(ClassifyConfig{})
	if err != nil {
		panic("policy: built-in classification rules are invalid: " + err.Error())
	}
	return c
}()

// DefaultClassifier returns the classifier of the default policy.
func DefaultClassifier() *Classifier { return defaultClassifier }

// Classify classifies o with the default policy. See Classifier.
func Classify(o *events.Outcome) events.Classification { return defaultClassifier.Classify(o) }

func (c *Classifier) emptyOverflowProvider(p string) bool { return hasFold(c.emptyOverflow, p) }

// Rule ids of the classifier's own verdicts (not in the rule table).
const (
	RuleOK         = "ok"               // the agent marked the call ok
	RuleNone       = "none"             // nothing matched: class unknown
	RuleQuotaAfter = "hint.quota_after" // a long retry hint made a rate limit a quota
)

// Classify returns the classification of o: class, contract retryability
// and scope, the deciding rule, short redacted evidence, what was
// overruled, the provider's retry hints, and o's context fields. It never
// fails: an outcome nothing explains is `unknown`.
func (c *Classifier) Classify(o *events.Outcome) events.Classification {
	if o == nil {
		return events.Classification{Class: events.ClassUnknown, Rule: RuleNone, Evidence: []string{"no outcome"}}
	}
	out := events.Classification{
		OutcomeID: o.ID, At: o.At, Agent: o.Agent, Provider: o.Provider, Model: o.Model, Profile: o.Profile,
		Session: o.Session, Segment: o.Segment, Turn: o.Turn, Step: o.Step, RefusalScope: o.RefusalScope,
	}
	if o.OK && o.StopReason == "" {
		// Fast path: most outcomes are successes.
		c.finish(&out, events.ClassOK, RuleOK, []string{"ok"})
		return out
	}
	v := getView()
	defer putView(v)
	v.reset(o)

	var ev evidence
	ev.add(statusEvidence(v, o))
	if v.placeholder {
		ev.add(placeholderNote)
	}
	var (
		overruled  string
		overEv     string
		skipClaims bool
	)
	candidates := c.anyStatus
	if v.status >= 0 && v.status < len(c.byStatus) {
		candidates = c.byStatus[v.status]
	}
	have := features(o, v)
	for _, ri := range candidates {
		r := c.rules[ri]
		if r.need&^have != 0 || r.forbid&have != 0 {
			continue // r.match would fail on these flags alone
		}
		if skipClaims && r.class == events.ClassContextOverflow {
			continue
		}
		mark := ev.n
		if !r.match(c, o, v, &ev) {
			ev.n = mark
			continue
		}
		if r.class == events.ClassContextOverflow {
			reject, why := c.checkOverflow(o, v, r)
			if reject {
				ev.n = mark
				overruled, skipClaims = events.ClassContextOverflow, true
				overEv = "overruled " + r.id + ": " + why
				continue
			}
			ev.add(why)
		}
		ev.add(overEv)
		ev.add(c.messageEvidence(o, v, r))
		out.Overruled = overruled
		out.Hints = c.retryHints(o, v, r.class)
		ruleID, class := r.id, r.class
		if class == events.ClassRateLimit && c.quotaAfterMS >= 0 && out.Hints != nil && out.Hints.AfterMS > c.quotaAfterMS {
			ev.add("provider asks to wait " + fmtMS(out.Hints.AfterMS) + ", longer than quota_after " + fmtMS(c.quotaAfterMS) + " (matched " + r.id + ")")
			if out.Overruled == "" {
				out.Overruled = events.ClassRateLimit
			}
			ruleID, class = RuleQuotaAfter, events.ClassQuotaExhausted
		}
		c.finish(&out, class, ruleID, ev.list())
		return out
	}
	if o.OK {
		c.finish(&out, events.ClassOK, RuleOK, []string{"ok", "stop_reason " + o.StopReason})
		return out
	}
	ev.add("no rule matched")
	ev.add(overEv)
	ev.add(c.messageEvidence(o, v, nil))
	out.Overruled = overruled
	out.Hints = c.retryHints(o, v, events.ClassUnknown)
	c.finish(&out, events.ClassUnknown, RuleNone, ev.list())
	return out
}

func (c *Classifier) finish(out *events.Classification, class, rule string, ev []string) {
	info, _ := events.LookupClass(class)
	out.Class, out.Retryable, out.Scope, out.Rule, out.Evidence = class, info.Retryable, info.Scope, rule, ev
}

// checkOverflow applies the overflow evidence check to a claim by r. It
// returns whether to reject the claim and the evidence either way.
func (c *Classifier) checkOverflow(o *events.Outcome, v *view, r *rule) (bool, string) {
	if o.RequestTokens > 0 && o.ContextWindow > 0 {
		ratio := float64(o.RequestTokens) / float64(o.ContextWindow)
		tokens := strconv.Itoa(o.RequestTokens) + " of " + strconv.Itoa(o.ContextWindow) + " tokens (" + pct(ratio) + ")"
		if ratio < c.ratio {
			return true, tokens + ", below the overflow evidence ratio " + pct(c.ratio)
		}
		return false, tokens
	}
	if r.heuristic && len(r.upstream) > 0 && v.emptyBody && !c.emptyOverflowProvider(o.Provider) {
		return true, "empty body from " + strconv.Quote(o.Provider) +
			", which is not configured to report overflow that way; the upstream code can only be a guess"
	}
	return false, ""
}

func pct(r float64) string {
	p := r * 100
	if p < 10 || p > 99 && p < 100 {
		return strconv.FormatFloat(math.Floor(p*10)/10, 'f', 1, 64) + "%"
	}
	return strconv.FormatFloat(math.Floor(p), 'f', 0, 64) + "%"
}

func fmtMS(ms int64) string {
	return (time.Duration(ms) * time.Millisecond).String()
}

// statusNote holds "status N" for every status, so evidence costs nothing.
var statusNote = func() (t [1000]string) {
	for i := range t {
		t[i] = "status " + strconv.Itoa(i)
	}
	t[0] = "no HTTP response"
	return t
}()

func statusEvidence(v *view, o *events.Outcome) string {
	if v.statusFromBody && v.status < 600 {
		if o.Status == 0 {
			return "streamed error with code " + statusNote[v.status][len("status "):]
		}
		return statusNote[o.Status] + ", error code " + statusNote[v.status][len("status "):] + " in the body"
	}
	if o.Status >= 0 && o.Status < len(statusNote) {
		return statusNote[o.Status]
	}
	return "status " + strconv.Itoa(o.Status)
}

// placeholderNote is the evidence for a body that is a client library's
// "NNN status code (no body)" (see isNoBodyPlaceholder).
const placeholderNote = `body is a client's "status code (no body)" placeholder: no body`

// maxExcerpt bounds the provider text quoted in evidence.
const maxExcerpt = 200

// messageEvidence quotes what the provider (or the transport) said, short
// and redacted: the error message of a JSON body, the <title> of an HTML
// page, the start of a text body, or the transport error.
func (c *Classifier) messageEvidence(o *events.Outcome, v *view, r *rule) string {
	transportRule := r != nil && len(r.transport) > 0 || r != nil && r.class == events.ClassTransport && o.TransportError != ""
	switch {
	case transportRule && o.TransportError != "":
		return excerpt("transport: ", o.TransportError, false, c.transportMayHoldSecret(o, v))
	case v.msg.ok():
		return excerpt("message: ", v.str(v.msg), true, c.textMayHoldSecret(v))
	case v.html && v.titleHi > v.titleLo && v.titleHi <= len(o.Body):
		return excerpt("page title: ", o.Body[v.titleLo:v.titleHi], false, c.textMayHoldSecret(v))
	case !v.emptyBody && !v.json && !v.html:
		return excerpt("body: ", o.Body, false, c.textMayHoldSecret(v))
	case o.TransportError != "":
		return excerpt("transport: ", o.TransportError, false, c.transportMayHoldSecret(o, v))
	}
	return ""
}

// textMayHoldSecret reports whether an excerpt of v's body may hold a
// secret. Every excerpt is, up to whitespace and JSON escapes (which no
// redaction trigger contains), a substring of v.text; so when the text was
// already scanned whole and holds no trigger, Redact has nothing to do. In
// any other case it answers true and Redact looks for itself.
func (c *Classifier) textMayHoldSecret(v *view) bool {
	if !v.scanned || v.textFull {
		return true
	}
	for _, id := range c.redactIDs {
		if hit(v.hits, id) {
			return true
		}
	}
	return false
}

func (c *Classifier) transportMayHoldSecret(o *events.Outcome, v *view) bool {
	if !v.tscanned || len(o.TransportError) > maxTransport {
		return true
	}
	for _, id := range c.tredactIDs {
		if hit(v.thits, id) {
			return true
		}
	}
	return false
}

// excerpt returns prefix + s cut to maxExcerpt bytes (on a rune boundary),
// whitespace collapsed, JSON escapes undone when escaped, and redacted when
// redact. A short s with nothing to clean (no escape, no whitespace but
// single spaces) is kept as is, without "…" even at maxExcerpt bytes. The
// text is built in a stack buffer, in one pass; only the returned string
// is allocated.
//
// Redaction runs before the cut, on up to redactMargin more bytes: a key
// that straddles the cut is recognised whole and masked, instead of being
// cut to a stub too short to look like a key (and shown).
func excerpt(prefix, s string, escaped, redact bool) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	limit := maxExcerpt
	if redact {
		limit += redactMargin
	}
	var buf [excerptBuf]byte
	b := append(buf[:0], prefix...)
	cleaned := len(s) > maxExcerpt
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
	if redact {
		// Redact without its trigger pre-check: the caller saw a trigger
		// in the text, and findSecret alone gives the same answer.
		var rbuf [excerptBuf]byte
		text := b[len(prefix):]
		if r, masked := appendRedacted(append(rbuf[:0], prefix...), unsafe.String(unsafe.SliceData(text), len(text))); masked {
			b = r
		}
		// Now cut to maxExcerpt bytes of text, between runes.
		if end := len(prefix) + maxExcerpt; len(b) > end {
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
// maxExcerpt+redactMargin bytes, the rest of a cut rune and "…". A longer
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
