package classify

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/failbus/failbus/internal/ascii"
	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/internal/policy/classify/internal/pattern"
	"github.com/failbus/failbus/pkg/events"
)

// Matching: a Rule compiled once into the form that matches an outcome
// without allocating, and the outcome features tested in bulk before it.

// statusSet is a bitset of statuses 0..1023.
type statusSet [16]uint64

func (s *statusSet) add(lo, hi int) {
	for n := lo; n <= hi && n < 1024; n++ {
		s[n>>6] |= 1 << (n & 63)
	}
}

func (s *statusSet) has(n int) bool {
	return n >= 0 && n < 1024 && s[n>>6]&(1<<(n&63)) != 0
}

// rule is a compiled Rule: patterns lower-cased once, evidence strings built
// once, so matching allocates nothing.
type rule struct {
	id        string
	class     string
	info      events.ClassInfo
	providers []string // lower case; empty = all
	provIDs   []int32  // the providers' ids (Classifier.providerID)
	// emptyOverflow: providers come from Config.EmptyOverflowProviders.
	emptyOverflow bool
	anyStatus     bool
	status        statusSet
	codes         [][]byte
	codeIDs       []int32 // ids in the Classifier's code table
	codeEv        []string
	body          [][]byte // lower-case patterns; matched through bodyIDs
	bodyIDs       []int32  // ids in the Classifier's pattern.Set
	bodyEv        []string
	bodyMask      []uint64 // bodyIDs as a hit-set mask (pattern.Any)
	notBody       [][]byte
	notBodyIDs    []int32
	notBodyMask   []uint64
	words         [][]byte // lower-case word patterns; matched through wordIDs and uwordIDs
	wordIDs       []int32  // ids of the ASCII words in the Classifier's wpats (AddWord)
	wordMask      []uint64
	uwordIDs      []int32 // ids of the other words in upats
	uwordMask     []uint64
	wordEv        []string
	notWords      [][]byte
	notWordIDs    []int32
	notWordMask   []uint64
	notUwordIDs   []int32
	notUwordMask  []uint64
	transport     [][]byte
	transIDs      []int32 // ids in the Classifier's transport pattern.Set
	transMask     []uint64
	transEv       []string
	headers       []headerCond
	upstream      []string
	upEv          []string
	stop          []string
	stopEv        []string
	empty         int8 // 1 empty body, -1 non-empty, 0 either
	html          int8 // 1 HTML body, -1 not HTML, 0 either
	// transportStage rules read transport_error; they yield when the body
	// carries an error object (a 200 stream that ended on an error event).
	transportStage bool
	// heuristic marks a claim evidence may overrule (upstream_code hints).
	heuristic bool
	// stated marks the provider's own overflow statement (a stop reason):
	// the evidence ratio does not overrule it.
	stated bool
	// when is an extra condition of a built-in rule, with note as evidence.
	when func(o *events.Outcome, v *digest.View) bool
	note string
	// need and forbid are the outcome features (feat*) the rule requires
	// and excludes: a rule fails when need&^have != 0 or forbid&have != 0,
	// which Classify tests before calling match. See setFeatures.
	need, forbid uint16
}

// Outcome features, tested in bulk before a rule's own match.
const (
	featOK        uint16 = 1 << iota // the agent marked the call ok
	featCodes                        // the body or headers carry structured codes
	featTransport                    // a transport error
	featUpstream                     // an upstream_code
	featStop                         // a stop_reason
	featHeaders                      // any header
	featEmpty                        // the body is empty
	featHTML                         // the body is an HTML page
	featBodyError                    // the body holds an error object
)

// features returns the feature bits of an outcome and its view.
func features(o *events.Outcome, v *digest.View) uint16 {
	var f uint16
	if o.OK {
		f |= featOK
	}
	if v.NCodes > 0 {
		f |= featCodes
	}
	if len(v.Trans) > 0 {
		f |= featTransport
	}
	if o.UpstreamCode != "" {
		f |= featUpstream
	}
	if o.StopReason != "" {
		f |= featStop
	}
	if len(o.Headers) > 0 {
		f |= featHeaders
	}
	if v.EmptyBody {
		f |= featEmpty
	}
	if v.HTML {
		f |= featHTML
	}
	if v.BodyError {
		f |= featBodyError
	}
	return f
}

// setFeatures derives need and forbid from r's conditions. Each bit
// restates a check of match that fails without looking further, so testing
// the bits first changes no result: ok outcomes meet only stop_reason
// rules; codes, transport, upstream_code, stop_reason and header
// conditions cannot hold on an outcome without any; and empty_body, html
// and the transport stage's yield are plain flags.
func (r *rule) setFeatures() {
	r.need, r.forbid = 0, 0
	if len(r.stop) == 0 {
		r.forbid |= featOK
	} else {
		r.need |= featStop
	}
	if len(r.codeIDs) > 0 {
		r.need |= featCodes
	}
	if len(r.transIDs) > 0 {
		r.need |= featTransport
	}
	if len(r.upstream) > 0 {
		r.need |= featUpstream
	}
	if len(r.headers) > 0 {
		r.need |= featHeaders
	}
	switch r.empty {
	case 1:
		r.need |= featEmpty
	case -1:
		r.forbid |= featEmpty
	}
	switch r.html {
	case 1:
		r.need |= featHTML
	case -1:
		r.forbid |= featHTML
	}
	if r.transportStage {
		r.forbid |= featBodyError
	}
}

type headerCond struct {
	name, value string // value lower case; "" = present
	ev          string
}

// evidence collects a match's evidence without allocating.
type evidence struct {
	a [8]string
	n int
}

func (e *evidence) add(s string) {
	if s != "" && e.n < len(e.a) {
		e.a[e.n] = s
		e.n++
	}
}

func (e *evidence) list() []string {
	out := make([]string, e.n)
	copy(out, e.a[:e.n])
	return out
}

func lowerAll(in []string) [][]byte {
	out := make([][]byte, 0, len(in))
	for _, s := range in {
		out = append(out, []byte(strings.ToLower(strings.TrimSpace(s))))
	}
	return out
}

func quoteEv(prefix string, in []string) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = prefix + strconv.Quote(strings.ToLower(strings.TrimSpace(s)))
	}
	return out
}

// compile turns a validated Rule into its matching form.
func compileRule(r Rule) *rule {
	info, _ := events.LookupClass(r.Class)
	c := &rule{id: r.ID, class: r.Class, info: info}
	for _, p := range r.Providers {
		c.providers = append(c.providers, strings.ToLower(strings.TrimSpace(p)))
	}
	c.anyStatus = len(r.Status) == 0
	for _, s := range r.Status {
		lo, hi, _ := parseStatusSpec(s)
		c.status.add(lo, hi)
	}
	c.codes, c.codeEv = lowerAll(r.Codes), quoteEv("error code ", r.Codes)
	c.body, c.bodyEv = lowerAll(r.Body), quoteEv("error text has ", r.Body)
	c.notBody = lowerAll(r.NotBody)
	c.words, c.wordEv = lowerAll(r.Words), quoteEv("error text has the words ", r.Words)
	c.notWords = lowerAll(r.NotWords)
	c.transport, c.transEv = lowerAll(r.Transport), quoteEv("transport error has ", r.Transport)
	names := make([]string, 0, len(r.Headers))
	for n := range r.Headers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		v := strings.ToLower(r.Headers[n])
		ev := "header " + n
		if v != "" {
			ev += " has " + strconv.Quote(v)
		}
		c.headers = append(c.headers, headerCond{name: n, value: v, ev: ev})
	}
	for _, u := range r.UpstreamCodes {
		c.upstream = append(c.upstream, strings.TrimSpace(u))
		c.upEv = append(c.upEv, "upstream_code "+strings.TrimSpace(u))
	}
	for _, s := range r.StopReasons {
		c.stop = append(c.stop, strings.ToLower(strings.TrimSpace(s)))
		c.stopEv = append(c.stopEv, "stop_reason "+strings.ToLower(strings.TrimSpace(s)))
	}
	if r.EmptyBody != nil {
		if *r.EmptyBody {
			c.empty = 1
		} else {
			c.empty = -1
		}
	}
	return c
}

// match reports whether r fires for o, adding what it saw to ev. Cheap
// integer checks run first, substring scans last.
func (r *rule) match(c *Classifier, o *events.Outcome, v *digest.View, ev *evidence) bool {
	if o.OK && len(r.stop) == 0 {
		return false
	}
	if r.emptyOverflow {
		if !c.emptyOverflowProvider(o.Provider) {
			return false
		}
	} else if len(r.provIDs) > 0 && !slices.Contains(r.provIDs, v.Prov) {
		return false
	}
	if !r.anyStatus {
		if !r.status.has(v.Status) {
			return false
		}
	}
	if r.transportStage && v.BodyError {
		return false
	}
	if r.empty == 1 && !v.EmptyBody || r.empty == -1 && v.EmptyBody {
		return false
	}
	if r.html == 1 && !v.HTML || r.html == -1 && v.HTML {
		return false
	}
	mark := ev.n
	if len(r.upstream) > 0 {
		i := indexFoldList(r.upstream, o.UpstreamCode)
		if i < 0 {
			return false
		}
		ev.add(r.upEv[i])
	}
	if len(r.stop) > 0 {
		i := indexFoldList(r.stop, o.StopReason)
		if i < 0 {
			return false
		}
		ev.add(r.stopEv[i])
	}
	if len(r.codeIDs) > 0 {
		if v.NCodes == 0 {
			return false
		}
		hits := c.codeHits(v)
		i := -1
		for k, id := range r.codeIDs {
			if pattern.Hit(hits, id) {
				i = k
				break
			}
		}
		if i < 0 {
			ev.n = mark
			return false
		}
		ev.add(r.codeEv[i])
	}
	for _, h := range r.headers {
		hv, ok := o.Headers[h.name]
		if !ok || h.value != "" && ascii.IndexFold(hv, h.value) < 0 {
			ev.n = mark
			return false
		}
		ev.add(h.ev)
	}
	if len(r.transIDs) > 0 {
		hits := c.transHits(v)
		if !pattern.Any(hits, r.transMask) {
			ev.n = mark
			return false
		}
		i := pattern.FirstHit(hits, r.transIDs)
		if i < 0 {
			ev.n = mark
			return false
		}
		ev.add(r.transEv[i])
	}
	if len(r.bodyIDs) > 0 {
		hits := c.textHits(v)
		if !pattern.Any(hits, r.bodyMask) {
			ev.n = mark
			return false
		}
		i := pattern.FirstHit(hits, r.bodyIDs)
		if i < 0 {
			ev.n = mark
			return false
		}
		ev.add(r.bodyEv[i])
	}
	if len(r.words) > 0 {
		if w := r.firstWord(c, v); w < 0 {
			ev.n = mark
			return false
		} else {
			ev.add(r.wordEv[w])
		}
	}
	if len(r.notBodyIDs) > 0 && pattern.Any(c.textHits(v), r.notBodyMask) {
		ev.n = mark
		return false
	}
	if len(r.notWordIDs) > 0 && pattern.Any(c.wordHits(v), r.notWordMask) ||
		len(r.notUwordIDs) > 0 && pattern.Any(c.uwordHits(v), r.notUwordMask) {
		ev.n = mark
		return false
	}
	if r.when != nil && !r.when(o, v) {
		ev.n = mark
		return false
	}
	ev.add(r.note)
	if r.empty == 1 {
		ev.add("empty body")
	}
	return true
}

// firstWord returns the index in r.words of the first of r's words found in
// v's error text, or -1. The words are split between the ASCII and the
// non-ASCII automaton; the index counts them in r.words order.
func (r *rule) firstWord(c *Classifier, v *digest.View) int {
	var wh, uh []uint64
	if len(r.wordIDs) > 0 {
		if wh = c.wordHits(v); !pattern.Any(wh, r.wordMask) {
			wh = nil
		}
	}
	if len(r.uwordIDs) > 0 {
		if uh = c.uwordHits(v); !pattern.Any(uh, r.uwordMask) {
			uh = nil
		}
	}
	if wh == nil && uh == nil {
		return -1
	}
	wi, ui := 0, 0
	for k, w := range r.words {
		if ascii7(w) {
			if wh != nil && pattern.Hit(wh, r.wordIDs[wi]) {
				return k
			}
			wi++
		} else {
			if uh != nil && pattern.Hit(uh, r.uwordIDs[ui]) {
				return k
			}
			ui++
		}
	}
	return -1
}
