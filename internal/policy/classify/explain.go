package classify

import (
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/redact"
)

// Explaining: which outcomes the rules do not really explain,
// grouped by what the provider said, so an operator sees which rule to add
// next. An outcome is weakly explained when nothing matched (`unknown`), or
// when the decision rests on the status code alone, on another library's
// upstream_code, on a transport error no rule recognised, or on an HTML
// page: the provider's own words were not read, or said nothing a rule knows.

// Weak reports whether c rests on weak evidence (see above).
func Weak(c events.Classification) bool {
	r := c.Rule
	switch {
	case r == RuleNone, r == "transport.other", r == "gateway.empty_4xx", r == "gateway.html_4xx",
		strings.HasPrefix(r, "status."), strings.HasPrefix(r, "upstream."):
		return true
	}
	return false
}

// maxSignature bounds a signature's length in bytes.
const maxSignature = 320

// Signature is the shape of what o says went wrong: the status, the
// structured error codes and the provider's message (or the transport
// error, the page title, the start of a text body), redacted, with what
// varies between occurrences replaced — numbers by N, quoted names by '…',
// URLs by <url>, long ids by <id>. Outcomes one rule would cover share a
// signature.
func Signature(o *events.Outcome) string {
	if o == nil {
		return ""
	}
	v := digest.Get()
	defer digest.Put(v)
	v.Reset(o)
	var b strings.Builder
	switch {
	case o.Status == 0:
		b.WriteString("no response")
	default:
		b.WriteString("status ")
		b.WriteString(strconv.Itoa(o.Status))
	}
	if v.StatusFromBody {
		b.WriteString(" (code ")
		b.WriteString(strconv.Itoa(v.Status))
		b.WriteString(" in body)")
	}
	if o.StopReason != "" {
		b.WriteString(" | stop_reason ")
		b.WriteString(shape(o.StopReason, 32))
	}
	if o.UpstreamCode != "" {
		b.WriteString(" | upstream ")
		b.WriteString(shape(o.UpstreamCode, 32))
	}
	var codes []string
	for i := 0; i < v.NCodes && len(codes) < 3; i++ {
		c := string(v.CodeBuf[v.Codes[i].Lo:v.Codes[i].Hi])
		if _, num := digest.Status3(c); num || slices.Contains(codes, c) {
			continue
		}
		codes = append(codes, c)
	}
	if len(codes) > 0 {
		b.WriteString(" | ")
		b.WriteString(shape(strings.Join(codes, ","), 64))
	}
	msg := ""
	switch {
	case v.Msg.OK():
		msg = string(digest.AppendUnescaped(nil, v.Str(v.Msg)))
	case v.HTML && v.TitleHi > v.TitleLo && v.TitleHi <= len(o.Body):
		msg = "page: " + o.Body[v.TitleLo:v.TitleHi]
	case !v.EmptyBody && !v.JSON:
		msg = o.Body
	case o.TransportError != "":
		msg = o.TransportError
	case v.EmptyBody && o.Status != 0:
		msg = "(empty body)"
	}
	if msg != "" {
		if len(msg) > 512 {
			msg = msg[:512]
		}
		b.WriteString(" | ")
		b.WriteString(shape(redact.String(msg), 96))
	}
	out := b.String()
	if len(out) > maxSignature {
		out = strings.ToValidUTF8(out[:maxSignature], "")
	}
	return out
}

// shape lower-cases s, replaces what varies (see Signature), folds white
// space and cuts the result to max bytes.
func shape(s string, max int) string {
	var b strings.Builder
	words := strings.Fields(strings.ToLower(s))
	for i, w := range words {
		if b.Len() >= max {
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(shapeWord(w))
	}
	out := b.String()
	if len(out) > max {
		out = out[:max]
		for len(out) > 0 && out[len(out)-1]&0xC0 == 0x80 {
			out = out[:len(out)-1] // do not cut a UTF-8 sequence
		}
		out += "…"
	}
	return out
}

func shapeWord(w string) string {
	if strings.Contains(w, "://") {
		return "<url>"
	}
	// Quoted names: 'gpt-4o', "foo", `bar`.
	if len(w) >= 2 && strings.ContainsRune(`'"`+"`", rune(w[0])) {
		end := strings.LastIndexByte(w, w[0])
		if end > 0 {
			return string(w[0]) + "…" + string(w[0]) + w[end+1:]
		}
	}
	digits, letters := 0, 0
	for i := 0; i < len(w); i++ {
		switch c := w[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c >= 'a' && c <= 'z':
			letters++
		}
	}
	if digits == 0 {
		return w
	}
	if digits >= 4 && letters >= 4 || len(w) >= 20 {
		return "<id>"
	}
	// Numbers, with their units kept: 30s, 1.5k, 2025-01-01 → N, Ns, Nk.
	var b strings.Builder
	inNum := false
	for i := 0; i < len(w); i++ {
		c := w[i]
		isDigit := c >= '0' && c <= '9'
		if isDigit || inNum && (c == '.' || c == ',' || c == ':' || c == '-') && i+1 < len(w) && w[i+1] >= '0' && w[i+1] <= '9' {
			if !inNum {
				b.WriteByte('N')
				inNum = true
			}
			continue
		}
		inNum = false
		b.WriteByte(c)
	}
	return b.String()
}

// Group is one signature's weakly explained outcomes.
type Group struct {
	Signature string         `json:"signature"`
	Count     int            `json:"count"`
	Classes   map[string]int `json:"classes"` // class → count
	Rules     map[string]int `json:"rules"`   // deciding rule → count
	Providers []string       `json:"providers"`
	Example   string         `json:"example"` // outcome id of the first one
	Evidence  []string       `json:"evidence"`
}

// Explainer collects classifications and groups the weak ones by
// signature. The zero value is ready to use; it is not safe for
// concurrent use.
type Explainer struct {
	Total, Weak int
	groups      map[string]*Group
}

// maxProviders is how many providers a group lists.
const maxProviders = 8

// Add counts one classification and, when it is weak, its outcome's group.
func (e *Explainer) Add(o *events.Outcome, c events.Classification) {
	e.Total++
	if !Weak(c) {
		return
	}
	e.Weak++
	if e.groups == nil {
		e.groups = map[string]*Group{}
	}
	sig := Signature(o)
	g := e.groups[sig]
	if g == nil {
		g = &Group{Signature: sig, Classes: map[string]int{}, Rules: map[string]int{}, Example: o.ID, Evidence: c.Evidence}
		e.groups[sig] = g
	}
	g.Count++
	g.Classes[c.Class]++
	g.Rules[c.Rule]++
	if o.Provider != "" && len(g.Providers) < maxProviders && !slices.Contains(g.Providers, o.Provider) {
		g.Providers = append(g.Providers, o.Provider)
	}
}

// Groups returns the groups, largest first (ties by signature).
func (e *Explainer) Groups() []Group {
	out := make([]Group, 0, len(e.groups))
	for _, g := range e.groups {
		sort.Strings(g.Providers)
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Signature < out[j].Signature
	})
	return out
}
