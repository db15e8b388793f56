package classify

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/failbus/failbus/pkg/events"
)

// Rule is one classification rule, as written in the `classify.rules` list of
// the policy file. A rule matches an outcome when every condition it sets
// holds; within one list, any entry may match. Unset conditions are ignored,
// but a rule must set at least one.
//
//	classify:
//	  rules:
//	    - id: my-gateway.busy            # stable id, reported as `rule`
//	      class: overloaded              # a CONTRACT.md class
//	      providers: [my-gateway]        # only outcomes of these providers
//	      status: [503, 4xx, 520-530]    # HTTP status: code, Nxx or a range; 0 = no response
//	      codes: [gateway_busy]          # structured error.type/code/status/__type/reason, exact
//	      body: ["server is busy"]       # substrings of the error text, case-insensitive
//	      not_body: ["rate limit"]       # none of these substrings
//	      words: ["busy", "繁忙"]         # whole words or phrases of the error text ("throttl*": any ending)
//	      not_words: ["rpm"]             # none of these words
//	      transport: [econnreset]        # substrings of transport_error, case-insensitive
//	      headers: {x-gateway: "busy"}   # header contains the value ("" = is present)
//	      upstream_codes: [BUSY]         # upstream_code, case-insensitive
//	      stop_reasons: [content_filter] # stop_reason, case-insensitive
//	      empty_body: true               # body is empty (also "{}", "null", "400 status code (no body)")
//
// The error text is what the extractor finds of the error itself,
// lower-cased with white space folded: the error fields of a JSON body
// under any usual key spelling and at any depth (message, msg, detail,
// type, code, error_code, status, reason, …), not the whole body, so
// prompt text a provider echoes back does not match; the same of a Python
// or JavaScript object an SDK printed, of the last error event of an SSE
// stream, of a transport error; for any other body, the body itself.
// Words match on word boundaries, with '-', '_' and a space as one
// character, and also see the words of error names (AccountOverdueError
// reads "account overdue error"); an entry that is not ASCII matches
// anywhere. Codes are the code-like fields, numbers
// included, and codes a message states ("[1301]", "code: X"). Status is the HTTP status, except that a 0 or 2xx response
// whose body carries an error.code of 4xx/5xx (a streamed error) uses that
// code.
//
// User rules run before every built-in rule (see Classifier for the order)
// and apply to failed outcomes only, except rules on stop_reasons, which also
// see outcomes the agent marked ok.
type Rule struct {
	ID            string            `yaml:"id" json:"id"`
	Class         string            `yaml:"class" json:"class"`
	Providers     []string          `yaml:"providers,omitempty" json:"providers,omitempty"`
	Status        []string          `yaml:"status,omitempty" json:"status,omitempty"`
	Codes         []string          `yaml:"codes,omitempty" json:"codes,omitempty"`
	Body          []string          `yaml:"body,omitempty" json:"body,omitempty"`
	NotBody       []string          `yaml:"not_body,omitempty" json:"not_body,omitempty"`
	Words         []string          `yaml:"words,omitempty" json:"words,omitempty"`
	NotWords      []string          `yaml:"not_words,omitempty" json:"not_words,omitempty"`
	Transport     []string          `yaml:"transport,omitempty" json:"transport,omitempty"`
	Headers       map[string]string `yaml:"headers,omitempty" json:"headers,omitempty"`
	UpstreamCodes []string          `yaml:"upstream_codes,omitempty" json:"upstream_codes,omitempty"`
	StopReasons   []string          `yaml:"stop_reasons,omitempty" json:"stop_reasons,omitempty"`
	EmptyBody     *bool             `yaml:"empty_body,omitempty" json:"empty_body,omitempty"`
}

// RuleError says which rule of the policy is unusable and why, so an
// operator can fix the policy file without guessing.
type RuleError struct {
	Index   int    // position in classify.rules
	ID      string // the rule's id, may be empty
	Field   string // offending key, e.g. "class"
	Problem string
}

func (e *RuleError) Error() string {
	if e.ID != "" {
		return fmt.Sprintf("classify.rules[%d] (id %q): %s: %s", e.Index, e.ID, e.Field, e.Problem)
	}
	return fmt.Sprintf("classify.rules[%d]: %s: %s", e.Index, e.Field, e.Problem)
}

var ruleIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// validate checks one user rule; builtin reports clashes with built-in ids.
func (r *Rule) validate(i int, builtin map[string]bool) error {
	bad := func(field, problem string, args ...any) error {
		return &RuleError{Index: i, ID: r.ID, Field: field, Problem: fmt.Sprintf(problem, args...)}
	}
	switch {
	case r.ID == "":
		return bad("id", "missing")
	case !ruleIDPattern.MatchString(r.ID):
		return bad("id", "%q must be lower-case letters, digits, '.', '_' or '-'", r.ID)
	case builtin[r.ID]:
		return bad("id", "%q is a built-in rule id; choose another", r.ID)
	}
	if _, ok := events.LookupClass(r.Class); !ok {
		return bad("class", "%q is not a contract class (want one of %s)", r.Class, classNames())
	}
	for _, s := range r.Status {
		if _, _, err := parseStatusSpec(s); err != nil {
			return bad("status", "%v", err)
		}
	}
	lists := []struct {
		field string
		vals  []string
	}{
		{"providers", r.Providers}, {"codes", r.Codes}, {"body", r.Body}, {"not_body", r.NotBody},
		{"words", r.Words}, {"not_words", r.NotWords},
		{"transport", r.Transport}, {"upstream_codes", r.UpstreamCodes}, {"stop_reasons", r.StopReasons},
	}
	for _, l := range lists {
		for _, v := range l.vals {
			if strings.TrimSpace(v) == "" {
				return bad(l.field, "empty entry")
			}
		}
	}
	for name := range r.Headers {
		if name == "" || name != strings.ToLower(name) {
			return bad("headers", "header name %q must be non-empty lower case", name)
		}
	}
	for _, w := range append(slices.Clip(r.Words), r.NotWords...) {
		if strings.Trim(w, "* ") == "" {
			return bad("words", "%q has no letters", w)
		}
	}
	if len(r.Status)+len(r.Codes)+len(r.Body)+len(r.Words)+len(r.Transport)+len(r.Headers)+len(r.UpstreamCodes)+len(r.StopReasons) == 0 && r.EmptyBody == nil {
		return bad("conditions", "a rule needs at least one of status, codes, body, words, transport, headers, upstream_codes, stop_reasons, empty_body")
	}
	return nil
}

func classNames() string {
	names := make([]string, 0, len(events.Classes))
	for _, c := range events.Classes {
		names = append(names, c.Name)
	}
	return strings.Join(names, ", ")
}

// parseStatusSpec reads "429", "4xx" or "500-504" into an inclusive range.
func parseStatusSpec(s string) (lo, hi int, err error) {
	s = strings.TrimSpace(strings.ToLower(s))
	if len(s) == 3 && s[1:] == "xx" && s[0] >= '1' && s[0] <= '9' {
		d := int(s[0]-'0') * 100
		return d, d + 99, nil
	}
	if a, b, ok := strings.Cut(s, "-"); ok {
		lo, err1 := strconv.Atoi(strings.TrimSpace(a))
		hi, err2 := strconv.Atoi(strings.TrimSpace(b))
		if err1 != nil || err2 != nil || lo < 0 || hi > 999 || lo > hi {
			return 0, 0, fmt.Errorf("%q is not a status range like 500-504", s)
		}
		return lo, hi, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 999 {
		return 0, 0, fmt.Errorf("%q is not a status: want a code (429, 0 = no response), Nxx or a range", s)
	}
	return n, n, nil
}
