package retry_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"testing"

	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
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
	if t1, t2 := base.Token(), base.Token(); t1 != t2 || base.RetryID(3) != t1+"-3" {
		t.Fatalf("token or retry id not deterministic: %s %s", base.Token(), base.RetryID(3))
	}
	for _, v := range variants {
		if v.Token() == base.Token() {
			t.Errorf("%+v has the same token as %+v", v, base)
		}
	}
}

// TestPolicyKeyIsPinned: policy keys are persisted on the bus (ledger
// records, budget tokens), so the key of a policy never changes — also not
// when it is remembered (asked twice, and for an equal policy resolved
// again).
func TestPolicyKeyIsPinned(t *testing.T) {
	t.Parallel()
	tests := []struct{ doc, key string }{
		{"", "pk65e8a5ef34e6e705"},
		{"retry: {max_retries: 1}", "pkc965388b8f214ea9"},
		{"retry: {mode: always, retryable_add: [context_overflow], jitter_ratio: 0.25, initial_delay: 1500us}", "pk36bda3582a65c413"},
	}
	for _, tt := range tests {
		p, err := policy.Parse([]byte(tt.doc))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if got := p.RetryFor("openai").Key(); got != tt.key {
				t.Errorf("%q: key %s (call %d), want %s", tt.doc, got, i+1, tt.key)
			}
		}
	}
	var off *retry.Policy
	if got := off.Key(); got != "pk0cc7ce77b7c25469" {
		t.Errorf("key of no policy %s, want pk0cc7ce77b7c25469", got)
	}
	// Equal but for one field, one after the other: the memo tells them
	// apart.
	a := retry.Policy{Mode: "normal", MaxRetries: 3, InitialDelay: 1, MaxDelay: 2, JitterRatio: 0.5, Retryable: []string{"ab", "c"}}
	b := a
	b.Retryable = []string{"a", "bc"}
	c := a
	c.JitterRatio = 0.25
	if ka, kb, kc := a.Key(), b.Key(), c.Key(); ka == kb || ka == kc {
		t.Errorf("different policies share a key: %s %s %s", ka, kb, kc)
	}
}

// TestBudgetTokenIsPinned: budget tokens name ledger subjects and retry
// ids on the bus; they never change.
func TestBudgetTokenIsPinned(t *testing.T) {
	t.Parallel()
	tests := []struct {
		k    retry.BudgetKey
		want string
	}{
		{retry.BudgetKey{Agent: "a", Session: "s", Turn: 1, Step: 2, Provider: "p", PolicyKey: "pk1"}, "bbaa8334724cea5421243fd61"},
		{retry.BudgetKey{Agent: "agent-7", Provider: "openai", PolicyKey: "pk0123456789abcdef"}, "bee6f1939aa760b46a9a72d9b"},
		{retry.BudgetKey{Agent: "ä<b>&\"q\"\\", Session: "s\n\t\x01\u2028", Turn: -3, Step: 1 << 40, Provider: "bad\xffutf8", PolicyKey: "pk"}, "bc3e9292763dffb107128b5f0"},
	}
	for _, tt := range tests {
		if got := tt.k.Token(); got != tt.want {
			t.Errorf("%+v: token %s, want %s", tt.k, got, tt.want)
		}
	}
}

// TestBudgetTokenBytesAreJSON: Token hashes exactly json.Marshal of the
// fields as an array, whatever the names hold.
func TestBudgetTokenBytesAreJSON(t *testing.T) {
	t.Parallel()
	names := []string{"", "a", "openai", "a.b c", "<>&", `"`, `\`, "\x00", "\x1f", "\x7f", "é", "\u2028\u2029", "\xff", "\xed\xa0\x80", "日本", "a\tb", "💥"}
	turns := []int{0, 1, -1, 1 << 62}
	for i, a := range names {
		for j, s := range names {
			k := retry.BudgetKey{Agent: a, Session: s, Turn: turns[(i+j)%len(turns)], Step: turns[i%len(turns)], Provider: names[(i*7+j)%len(names)], PolicyKey: names[(i+3*j)%len(names)]}
			b, _ := json.Marshal([]any{k.Agent, k.Session, k.Turn, k.Step, k.Provider, k.PolicyKey})
			sum := sha256.Sum256(b)
			if want := "b" + hex.EncodeToString(sum[:12]); k.Token() != want {
				t.Errorf("%+v: token %s, want %s (of %s)", k, k.Token(), want, b)
			}
		}
	}
}

// TestResolveRetryableSet: the effective retryable set is the contract's
// retryable classes, plus the global adds, minus the global removes, plus
// the provider's adds, minus its removes — sorted, each once — for random
// lists (the set is built without a map; this holds it to one).
func TestResolveRetryableSet(t *testing.T) {
	t.Parallel()
	names := []string{"x-unknown"}
	for _, c := range events.Classes {
		names = append(names, c.Name)
	}
	r := rand.New(rand.NewPCG(1, 2))
	pick := func() []string {
		var out []string
		for range r.IntN(4) {
			out = append(out, names[r.IntN(len(names))])
		}
		return out
	}
	for range 500 {
		g := retry.Default()
		g.RetryableAdd, g.RetryableRemove = pick(), pick()
		o := retry.Override{RetryableAdd: pick(), RetryableRemove: pick()}
		g.Providers = map[string]retry.Override{"p": o}
		set := map[string]bool{}
		for _, c := range events.Classes {
			if c.Retryable {
				set[c.Name] = true
			}
		}
		for i, lv := range [][2][]string{{g.RetryableAdd, g.RetryableRemove}, {o.RetryableAdd, o.RetryableRemove}} {
			for _, c := range lv[0] {
				set[c] = true
			}
			for _, c := range lv[1] {
				delete(set, c)
			}
			want := make([]string, 0, len(set))
			for c := range set {
				want = append(want, c)
			}
			sort.Strings(want)
			p := []string{"q", "p"}[i] // q has no override
			if got := g.Resolve(p).Retryable; !slices.Equal(got, want) {
				t.Fatalf("global +%v -%v, provider p +%v -%v: %s resolves %v, want %v", g.RetryableAdd, g.RetryableRemove, o.RetryableAdd, o.RetryableRemove, p, got, want)
			}
		}
	}
}
