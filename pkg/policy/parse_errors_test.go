package policy

import (
	"fmt"
	"strings"
	"testing"
)

// A value of the wrong type names its key path and line, like an unknown
// key, instead of yaml's "line 2: cannot unmarshal !!str `3` into int".
func TestParseTypeErrorsNameTheKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{"a quoted number", "retry:\n  max_retries: \"3\"", `policy: retry.max_retries: want a whole number, got the quoted string "3" (drop the quotes) (line 2)`},
		{"a word for a number", "retry: {max_retries: many}", `policy: retry.max_retries: want a whole number, got "many" (line 1)`},
		{"a fraction for a whole number", "notify: {daily_budget: 2.5}", `policy: notify.daily_budget: want a whole number, got "2.5" (line 1)`},
		{"a word for a fraction", "retry: {jitter_ratio: high}", `policy: retry.jitter_ratio: want a number, got "high" (line 1)`},
		{"a list for a number", "retry:\n  providers:\n    gw: {max_retries: [1]}", `policy: retry.providers.gw.max_retries: want a whole number, got a list (line 3)`},
		{"a word for a bool", "notify:\n  sinks:\n    - {name: a, type: webhook, url: http://x, idempotent: yes}", `policy: notify.sinks[0].idempotent: want true or false, got "yes" (line 3)`},
		{"a scalar for a list", "scope:\n  failover:\n    openai: anthropic", `policy: scope.failover.openai: want a list, got "anthropic" (line 3)`},
		{"a mapping for a string", "retry: {mode: {fast: true}}", `policy: retry.mode: want a string, got a mapping (line 1)`},
		{"a scalar for a list of durations", "refusal: {reprobe_delays: 15m}", `policy: refusal.reprobe_delays: want a list, got "15m" (line 1)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) = %v\nwant an error containing %q", tt.doc, err, tt.want)
			}
		})
	}
}

// Every problem of a document is reported at once, one per line, in
// document order: unknown keys, wrong types and bad durations first, then
// what validation finds in the rest.
func TestParseReportsEveryProblemAtOnce(t *testing.T) {
	t.Parallel()
	doc := `retry:
  max_retry: 3
  max_retries: "3"
  initial_delay: 1 second
  retryable_add: [foo]
notify:
  daily_budget: -1
scope: {windw: 1m}
`
	_, err := Parse([]byte(doc))
	if err == nil {
		t.Fatal("no error")
	}
	want := []string{
		`policy: unknown key "retry.max_retry" (line 2)`,
		`policy: retry.max_retries: want a whole number, got the quoted string "3" (drop the quotes) (line 3)`,
		`policy: retry.initial_delay: "1 second" is not a Go duration (like 1500ms, 15m, 6h) (line 4)`,
		`policy: unknown key "scope.windw" (line 8)`,
		`policy: retry.retryable_add: "foo" is not a class`,
		`policy: notify.daily_budget: must be >= 0`,
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d:\n %s\nwant it to start with\n %s", i+1, lines[i], w)
		}
	}
}

// A policy file is one YAML document: a second one would be ignored, so it
// is an error.
func TestParseRefusesASecondDocument(t *testing.T) {
	t.Parallel()
	_, err := Parse([]byte("retry: {max_retries: 3}\n---\nretry: {max_retries: 5}\n"))
	if err == nil || !strings.HasPrefix(err.Error(), "policy: line 3: a second YAML document") {
		t.Errorf("Parse of two documents = %v, want an error naming the second document's line", err)
	}
	// Reported after the first document's own problems, in line order.
	_, err = Parse([]byte("retry: {max_retries: x}\n---\nretry: {}\n"))
	if lines := strings.Split(fmt.Sprint(err), "\n"); len(lines) != 2 || !strings.Contains(lines[0], "retry.max_retries") || !strings.Contains(lines[1], "line 3: a second YAML document") {
		t.Errorf("Parse = %v, want the first document's problem, then the second document", err)
	}
	for _, doc := range []string{"retry: {max_retries: 3}\n---\n", "---\nretry: {max_retries: 3}\n", "retry: {max_retries: 3}\n...\n"} {
		p, err := Parse([]byte(doc))
		if err != nil || p.Retry.MaxRetries != 3 {
			t.Errorf("Parse(%q) = %v; an empty document marker is not a second document", doc, err)
		}
	}
}
