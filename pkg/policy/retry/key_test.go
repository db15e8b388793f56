package retry_test

import (
	"regexp"
	"testing"

	"github.com/failbus/failbus/pkg/policy"
	"github.com/failbus/failbus/pkg/policy/retry"
)

func TestPolicyKeyCoversEveryBehaviouralField(t *testing.T) {
	t.Parallel()
	base, err := policy.Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	baseKey := base.RetryFor("openai").Key()
	tests := []struct {
		name    string
		doc     string
		changes bool
	}{
		{"same policy written out", "retry: {mode: normal, max_retries: 10, initial_delay: 1s, max_delay: 1m, jitter_ratio: 0.2}", false},
		{"an empty add list", "retry: {retryable_add: []}", false},
		{"adding a class already in the set", "retry: {retryable_add: [timeout]}", false},
		{"an override of another provider", "retry:\n  providers:\n    other: {max_retries: 1}", false},
		{"mode", "retry: {mode: always}", true},
		{"max_retries", "retry: {max_retries: 9}", true},
		{"initial_delay", "retry: {initial_delay: 1001ms}", true},
		{"initial_delay by a microsecond", "retry: {initial_delay: 1000001us}", true},
		{"max_delay", "retry: {max_delay: 61s}", true},
		{"jitter_ratio", "retry: {jitter_ratio: 0.25}", true},
		{"a class added", "retry: {retryable_add: [context_overflow]}", true},
		{"a class removed", "retry: {retryable_remove: [rate_limit]}", true},
		{"an override of this provider", "retry:\n  providers:\n    openai: {max_retries: 1}", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := policy.Parse([]byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			key := p.RetryFor("openai").Key()
			if (key != baseKey) != tt.changes {
				t.Errorf("key %s vs default %s: changed=%v, want %v\ncanonical: %s", key, baseKey, key != baseKey, tt.changes, p.RetryFor("openai").Canonical())
			}
		})
	}
}

func TestPolicyKeyIsCanonical(t *testing.T) {
	t.Parallel()
	a, _ := policy.Parse([]byte("retry: {retryable_add: [context_overflow, bad_request]}"))
	b, _ := policy.Parse([]byte("retry: {retryable_add: [bad_request, context_overflow, bad_request]}"))
	if a.RetryFor("x").Key() != b.RetryFor("y").Key() {
		t.Errorf("order, duplicates or provider name changed the key:\n%s\n%s", a.RetryFor("x").Canonical(), b.RetryFor("y").Canonical())
	}
	if k := a.RetryFor("x").Key(); !regexp.MustCompile(`^pk[0-9a-f]{16}$`).MatchString(k) {
		t.Errorf("key %q is not pk + 16 hex digits", k)
	}
	want := `["retry/1","normal",10,["bad_request","context_overflow","empty_response","overloaded","rate_limit","server_error","timeout","transport"],1000000000,60000000000,0.2]`
	if got := a.RetryFor("x").Canonical(); got != want {
		t.Errorf("Canonical =\n%s\nwant\n%s", got, want)
	}
}

func TestBudgetKey(t *testing.T) {
	t.Parallel()
	base := retry.BudgetKey{Agent: "a", Session: "s", Turn: 1, Step: 2, Provider: "p", PolicyKey: "pk1"}
	variants := []retry.BudgetKey{
		{Agent: "b", Session: "s", Turn: 1, Step: 2, Provider: "p", PolicyKey: "pk1"},
		{Agent: "a", Session: "t", Turn: 1, Step: 2, Provider: "p", PolicyKey: "pk1"},
		{Agent: "a", Session: "s", Turn: 2, Step: 2, Provider: "p", PolicyKey: "pk1"},
		{Agent: "a", Session: "s", Turn: 1, Step: 3, Provider: "p", PolicyKey: "pk1"},
		{Agent: "a", Session: "s", Turn: 1, Step: 2, Provider: "q", PolicyKey: "pk1"},
		{Agent: "a", Session: "s", Turn: 1, Step: 2, Provider: "p", PolicyKey: "pk2"},
		// Names that would collide if fields were only joined with a dot.
		{Agent: "a.s", Session: "", Turn: 1, Step: 2, Provider: "p", PolicyKey: "pk1"},
	}
	token := regexp.MustCompile(`^b[0-9a-f]{24}$`)
	if !token.MatchString(base.Token()) {
		t.Fatalf("token %q is not subject-safe b + 24 hex", base.Token())
	}
	if base.Token() != base.Token() || base.RetryID(3) != base.Token()+"-3" {
		t.Fatalf("token or retry id not deterministic: %s %s", base.Token(), base.RetryID(3))
	}
	for _, v := range variants {
		if v.Token() == base.Token() {
			t.Errorf("%+v has the same token as %+v", v, base)
		}
	}
}
