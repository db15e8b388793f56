// Package classify turns an outcome into a classification: the class, its
// scope and contract retryability, the rule that decided, short redacted
// evidence, what the evidence overruled, and the provider's retry hints
// (docs/CONTRACT.md "Classification").
package classify

import (
	"fmt"
	"slices"
	"strings"

	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/internal/policy/classify/internal/pattern"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/redact"
)

// Classification: every decision downstream is only as
// good as the class it starts from. A classifier can lose information
// (status and code flattened into a sentence) or, worse, fabricate it (a
// Cerebras-only rule labels a generic gateway's empty 400 a context
// overflow; the overflow is not retryable; a long task dies on a transient
// hiccup). This file keeps the raw evidence, names the rule that decided,
// and lets harder evidence overrule a heuristic.

// Classifier turns outcomes into classifications. Build one with
// New (rules are compiled once); it is safe for concurrent use and
// does no I/O.
//
// # Rule precedence
//
// Rules are tried in this order; the first that matches decides. What the
// provider states — a stop reason, an error code, its message — comes
// before what the status code alone suggests:
//
//  0. User rules from Config.Rules, in file order.
//  1. stop_reason: refusals (stop.refusal), a window that filled up while
//     generating (stop.context_window: model_context_window_exceeded,
//     model_length), output that broke the tool grammar
//     (stop.malformed_output). Then an outcome the agent marked ok is `ok`.
//  2. Transport, when no HTTP error arrived (status 0 or 2xx) and no error
//     object did either: first what the client library says before any
//     exchange — no credentials (auth), an unusable URL (bad_request), a
//     request it counted too long for the window (overflow) — then stream
//     invariant, DNS, TLS-handshake timeout, connection cut during TLS, TLS
//     and certificates, timeouts, connection errors (any other transport
//     error waits for the families of stage 5 to read its words).
//     Node/undici/Bun, Go net/http and Python spellings. An error
//     object inside the transport error (an SDK's "received error while
//     streaming: {…}") is read as the body.
//  3. Structured error codes (error.type / error.code / error.status /
//     __type / reason / x-amzn-errortype and the other code keys the
//     extractor reads, also inside a wrapper's message or an object an SDK
//     printed): first the providers' code tables (tables/*.yaml, see
//     Tables), then most specific first: quota before rate limit
//     (insufficient_quota is a 429), Google per-day quotas before
//     RESOURCE_EXHAUSTED, per-day limits of rate-limit errors, overloaded,
//     server errors (unless the message states something else), overflow
//     codes, refusals, auth (a generic access code yields to a billing
//     statement or a model the key may not use), model, parameters.
//  4. Provider-scoped heuristics: an empty 400/413 is an overflow only for
//     EmptyOverflowProviders (cerebras.empty_400_overflow).
//  5. What the provider's message says, on any status unless noted:
//     overflow; capability gaps (no endpoint supports tools, not a chat
//     model) and model phrases; parameter phrases; auth phrases (disabled or
//     restricted organisations, expired keys); refusal phrases (moderation
//     blocks); quota phrases (credit, budget, trial caps, subscription usage
//     limits); overloaded and rate-limit phrases. Rate-limit phrases count
//     only on a 429/503 or a streamed error — a 400 whose body echoes "429"
//     or "rate limit" is not a rate limit — except an explicit "rate limit
//     exceeded" relayed in a 5xx. Each class's keyword family (family.*,
//     families.go) comes right after that class's phrases. Then timeouts,
//     server faults and transport failures stated in a 2xx body or a
//     transport error, and any other transport error (transport.other).
//  6. LiteLLM's verdicts: its exception names in the message
//     (litellm.ContentPolicyViolationError, litellm.RateLimitError, …) and
//     its proxy's auth_error type, after the provider's words.
//  7. Gateway pages: Cloudflare 52x, Envoy upstream errors, a proxy's 413,
//     HTML 5xx and 4xx pages from ALB/nginx.
//  8. upstream_code, another library's verdict: a hint, used only when
//     nothing above decided.
//  9. Hard evidence: request_tokens >= context_window on a 400/413/422 is an
//     overflow.
//  10. The status alone: an unexplained empty-body 4xx is server_error
//     (gateway.empty_4xx; 422 has a meaning of its own); 401/403/407 auth,
//     402 quota, 404 model (when the body mentions one), 408 timeout, 422
//     unsupported_param, 429 rate limit, 529 overloaded, 5xx server error,
//     other 4xx bad_request; a 2xx with an error object server_error; an
//     empty 2xx, or a whole JSON 2xx without any output, empty_response.
//  11. Nothing matched: `unknown` (rule "none").
//
// Two checks can overrule the first match; the classification then carries
// the claimed class in Overruled, the reason in Evidence, and the final rule
// in Rule:
//
//   - Overflow evidence: a context_overflow claim (any rule but a stop
//     reason, which is the provider's own count) is rejected when
//     (request_tokens + max_output_tokens)/context_window <
//     OverflowEvidenceRatio — the request counts as the provider counts it,
//     output budget included — or, for an upstream_code claim on an empty
//     body, when the provider is not one of EmptyOverflowProviders (the code
//     can only have come from a heuristic). Matching then resumes after the
//     claiming rule, skipping every other overflow rule.
//   - Long waits: a rate_limit whose retry hint exceeds QuotaAfter is
//     quota_exhausted (rule hint.quota_after).
//
// Retryable is the contract default of the final class; the scheduler
// applies the policy's retryable set.
type Classifier struct {
	rules      []*rule
	pats       pattern.Set      // every body pattern and hint phrase, one automaton
	tpats      pattern.Set      // every transport pattern
	wpats      pattern.Set      // every ASCII word pattern (Rule.Words), on word boundaries
	upats      pattern.Set      // every word pattern with non-ASCII bytes (Chinese), scanned only in such text
	codeIDs    map[string]int32 // every structured code a rule names
	provIDs    map[string]int32 // every provider a rule is scoped to (lower case)
	hintIDs    [len(hintPhrases)]int32
	redactIDs  []int32 // redact.Triggers() in pats
	tredactIDs []int32 // redact.Triggers() in tpats
	// byStatus lists, for each status 0..999, the rules (indexes into
	// rules, in order) whose status condition can hold; other statuses use
	// anyStatus.
	byStatus      [1000][]uint16
	anyStatus     []uint16
	emptyOverflow []string
	ratio         float64
	quotaAfterMS  int64 // <0: off
}

// New validates cfg and compiles its rules with the built-in ones and the
// built-in code tables.
func New(cfg Config) (*Classifier, error) { return newClassifier(cfg, nil) }

// newClassifier is New without the built-in code tables named in without
// (Evaluate's leave-one-provider-out pass).
func newClassifier(cfg Config, without []string) (*Classifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Classifier{ratio: cfg.OverflowEvidenceRatio, codeIDs: map[string]int32{}, provIDs: map[string]int32{}}
	c.wpats.FoldSeparators()
	c.upats.FoldSeparators()
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
		if b.tables {
			for _, t := range tables {
				if slices.Contains(without, t.name) {
					continue
				}
				for _, tr := range t.rules {
					c.rules = append(c.rules, compileRule(tr))
				}
			}
			continue
		}
		r := compileRule(b.Rule)
		r.html, r.heuristic, r.emptyOverflow, r.when, r.note = b.html, b.heuristic, b.emptyOverflow, b.when, b.note
		r.stated = b.stated
		r.transportStage = b.transport
		c.rules = append(c.rules, r)
	}
	for _, r := range c.rules {
		r.setFeatures()
		for _, p := range r.body {
			r.bodyIDs = append(r.bodyIDs, c.pats.Add(string(p)))
		}
		for _, p := range r.notBody {
			r.notBodyIDs = append(r.notBodyIDs, c.pats.Add(string(p)))
		}
		for _, p := range r.words {
			if ascii7(p) {
				r.wordIDs = append(r.wordIDs, c.wpats.AddWord(string(p)))
			} else {
				r.uwordIDs = append(r.uwordIDs, c.upats.AddWord(string(p)))
			}
		}
		for _, p := range r.notWords {
			if ascii7(p) {
				r.notWordIDs = append(r.notWordIDs, c.wpats.AddWord(string(p)))
			} else {
				r.notUwordIDs = append(r.notUwordIDs, c.upats.AddWord(string(p)))
			}
		}
		for _, p := range r.transport {
			r.transIDs = append(r.transIDs, c.tpats.Add(string(p)))
		}
		for _, p := range r.providers {
			id, ok := c.provIDs[p]
			if !ok {
				id = int32(len(c.provIDs))
				c.provIDs[p] = id
			}
			r.provIDs = append(r.provIDs, id)
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
		c.hintIDs[i] = c.pats.Add(p)
	}
	for _, p := range redact.Triggers() {
		c.redactIDs = append(c.redactIDs, c.pats.Add(p))
		c.tredactIDs = append(c.tredactIDs, c.tpats.Add(p))
	}
	c.pats.Build()
	c.tpats.Build()
	c.wpats.Build()
	c.upats.Build()
	for _, r := range c.rules {
		r.bodyMask, r.notBodyMask = c.pats.Mask(r.bodyIDs), c.pats.Mask(r.notBodyIDs)
		r.wordMask, r.notWordMask = c.wpats.Mask(r.wordIDs), c.wpats.Mask(r.notWordIDs)
		r.uwordMask, r.notUwordMask = c.upats.Mask(r.uwordIDs), c.upats.Mask(r.notUwordIDs)
		r.transMask = c.tpats.Mask(r.transIDs)
	}
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

// cleared is h with n zeroed words, reusing its array when it is large
// enough.
func cleared(h []uint64, n int) []uint64 {
	if cap(h) < n {
		return make([]uint64, n)
	}
	h = h[:n]
	clear(h)
	return h
}

// textHits returns which body patterns occur in v's error text, scanning
// it once per outcome, on first use.
func (c *Classifier) textHits(v *digest.View) []uint64 {
	if !v.Scanned {
		v.Hits = cleared(v.Hits, c.pats.Words())
		c.pats.Scan(v.Text, v.Hits)
		v.Scanned = true
	}
	return v.Hits
}

// wordHits returns which ASCII word patterns occur in v's error text,
// scanned once per outcome, on first use.
func (c *Classifier) wordHits(v *digest.View) []uint64 {
	if !v.WScanned {
		v.WHits = cleared(v.WHits, c.wpats.Words())
		c.wpats.Scan(v.Text, v.WHits)
		c.wpats.Scan(v.Words, v.WHits)
		v.WScanned = true
	}
	return v.WHits
}

// uwordHits returns which non-ASCII word patterns occur in v's error text:
// none, without a scan, in a text of ASCII bytes only.
func (c *Classifier) uwordHits(v *digest.View) []uint64 {
	if !v.UScanned {
		v.UHits = cleared(v.UHits, c.upats.Words())
		if !ascii7(v.Text) {
			c.upats.Scan(v.Text, v.UHits)
		}
		v.UScanned = true
	}
	return v.UHits
}

// ascii7 reports whether b has only ASCII bytes.
func ascii7[T string | []byte](b T) bool {
	for i := 0; i < len(b); i++ {
		if b[i] >= 0x80 {
			return false
		}
	}
	return true
}

// codeHits returns which rule codes v's structured codes are, looked up
// once per outcome, on first use.
func (c *Classifier) codeHits(v *digest.View) []uint64 {
	if !v.CScanned {
		n := (len(c.codeIDs) + 63) / 64
		if cap(v.CHits) < n {
			v.CHits = make([]uint64, n)
		}
		v.CHits = v.CHits[:n]
		clear(v.CHits)
		for i := 0; i < v.NCodes; i++ {
			sp := v.Codes[i]
			if id, ok := c.codeIDs[string(v.CodeBuf[sp.Lo:sp.Hi])]; ok {
				v.CHits[id>>6] |= 1 << (id & 63)
			}
		}
		v.CScanned = true
	}
	return v.CHits
}

// transHits is textHits for the transport error.
func (c *Classifier) transHits(v *digest.View) []uint64 {
	if !v.TScanned {
		n := c.tpats.Words()
		if cap(v.THits) < n {
			v.THits = make([]uint64, n)
		}
		v.THits = v.THits[:n]
		clear(v.THits)
		c.tpats.Scan(v.Trans, v.THits)
		v.TScanned = true
	}
	return v.THits
}

var defaultClassifier = func() *Classifier {
	c, err := New(Config{})
	if err != nil {
		panic("policy: built-in classification rules are invalid: " + err.Error())
	}
	return c
}()

// Default returns the classifier of the default policy.
func Default() *Classifier { return defaultClassifier }

// Classify classifies o with the default policy. See Classifier.
func Classify(o *events.Outcome) events.Classification { return defaultClassifier.Classify(o) }

func (c *Classifier) emptyOverflowProvider(p string) bool { return hasFold(c.emptyOverflow, p) }

// providerID is the id of provider among the providers rules are scoped
// to, or -1: looked up once per outcome, so a rule's providers cost an
// integer comparison.
func (c *Classifier) providerID(provider string) int32 {
	if id, ok := c.provIDs[provider]; ok {
		return id
	}
	if plainName(provider) {
		return -1 // already lower case and trimmed: no other spelling to try
	}
	if id, ok := c.provIDs[strings.ToLower(strings.TrimSpace(provider))]; ok {
		return id
	}
	return -1
}

// plainName reports whether s is ASCII without capitals or white space.
func plainName(s string) bool {
	for i := 0; i < len(s); i++ {
		if b := s[i]; b >= 'A' && b <= 'Z' || b <= ' ' || b >= 0x80 {
			return false
		}
	}
	return true
}

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
	v := digest.Get()
	defer digest.Put(v)
	v.Reset(o)
	v.Prov = c.providerID(o.Provider)

	var ev evidence
	ev.add(statusEvidence(v, o))
	if v.Placeholder {
		ev.add(placeholderNote)
	}
	var (
		overruled  string
		overEv     string
		skipClaims bool
	)
	candidates := c.anyStatus
	if v.Status >= 0 && v.Status < len(c.byStatus) {
		candidates = c.byStatus[v.Status]
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
	// Evidence quotes the input (a stop reason, an upstream code, a header);
	// whatever a rule copied, no credential leaves in it. Excerpts of the
	// body and transport error are masked already: String has nothing to do
	// and does not allocate.
	for i, e := range ev {
		ev[i] = redact.String(e)
	}
	info, _ := events.LookupClass(class)
	out.Class, out.Retryable, out.Scope, out.Rule, out.Evidence = class, info.Retryable, info.Scope, rule, ev
}
