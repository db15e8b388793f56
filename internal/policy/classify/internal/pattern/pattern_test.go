package pattern

import (
	"strings"
	"testing"
)

// TestAddWord: word patterns match on ASCII word boundaries, a trailing
// '*' makes a prefix, and non-ASCII ends need no boundary.
func TestAddWord(t *testing.T) {
	t.Parallel()
	var p Set
	quota := p.AddWord("quota")
	rpm := p.AddWord("rpm")
	throttl := p.AddWord("throttl*")
	phrase := p.AddWord("rate limit")
	cn := p.AddWord("余额不足")
	sub := p.Add("quota") // the same text as a plain substring is another pattern
	long := p.AddWord("context length exceeded")
	p.Build()
	if p.AddWord("quota") != quota {
		t.Fatal("AddWord of a known word gave a new id")
	}
	for _, tt := range []struct {
		text string
		id   int32
		want bool
	}{
		{"quota exceeded", quota, true},
		{"insufficient_quota", quota, true},
		{"(quota)", quota, true},
		{"quota", quota, true},
		{"quotas left", quota, false},
		{"myquota", quota, false},
		{"quotas left", sub, true},
		{"10 rpm", rpm, true},
		{"rpms", rpm, false},
		{"tpm/rpm", rpm, true},
		{"throttled by upstream", throttl, true},
		{"request throttling", throttl, true},
		{"unthrottled", throttl, false},
		{"rate limit reached", phrase, true},
		{"rate limited", phrase, false},
		{"pirate limit", phrase, false},
		{"账户余额不足，请充值", cn, true},
		{"余额不足", cn, true},
		{"the context length exceeded the model's window", long, true},
		{"context length exceededx", long, false},
		// A first occurrence that fails its boundary does not hide a later
		// one that holds.
		{"quotas and then quota", quota, true},
		{"rpms rpm", rpm, true},
	} {
		hits := make([]uint64, p.Words())
		p.Scan([]byte(tt.text), hits)
		if got := Hit(hits, tt.id); got != tt.want {
			t.Errorf("%q: pattern %q hit %v, want %v", tt.text, p.pb[tt.id], got, tt.want)
		}
	}
}

// TestAddWordLongText: boundaries hold at the ends of the text and across
// the automaton's prefix length.
func TestAddWordLongText(t *testing.T) {
	t.Parallel()
	var p Set
	id := p.AddWord("insufficient balance")
	p.Build()
	text := strings.Repeat("x ", 100) + "insufficient balance"
	hits := make([]uint64, p.Words())
	p.Scan([]byte(text), hits)
	if !Hit(hits, id) {
		t.Fatal("word at the end of the text not found")
	}
	hits = make([]uint64, p.Words())
	p.Scan([]byte(text+"s"), hits)
	if Hit(hits, id) {
		t.Fatal("word continuing into the next byte found")
	}
}

// TestFoldSeparators: in a folding set '-', '_' and ' ' are one character,
// in short and long patterns alike, and boundaries still hold.
func TestFoldSeparators(t *testing.T) {
	t.Parallel()
	var p Set
	p.FoldSeparators()
	short := p.AddWord("rate limit")
	long := p.AddWord("insufficient balance")
	under := p.AddWord("max_tokens")
	if p.AddWord("rate-limit") != short || p.AddWord("rate_limit") != short {
		t.Fatal("separator spellings of one word gave new ids")
	}
	p.Build()
	for _, tt := range []struct {
		text string
		id   int32
		want bool
	}{
		{"rate limit exceeded", short, true},
		{"rate-limit exceeded", short, true},
		{"rate_limit_exceeded", short, true},
		{"ratelimit", short, false},
		{"rate limits", short, false},
		{"insufficient_balance", long, true},
		{"insufficient-balance error", long, true},
		{"insufficient balancex", long, false},
		{"max tokens too large", under, true},
		{"max_tokens too large", under, true},
	} {
		hits := make([]uint64, p.Words())
		p.Scan([]byte(tt.text), hits)
		if got := Hit(hits, tt.id); got != tt.want {
			t.Errorf("%q: pattern %q hit %v, want %v", tt.text, p.pb[tt.id], got, tt.want)
		}
	}
}
