package engine

import (
	"reflect"
	"strconv"
	"testing"

	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/pkg/policy"
)

// The retry policy the stages use per provider is the policy's own
// RetryFor, resolved once per provider and policy: a provider override,
// mode off (nil) and a provider the policy does not name all resolve as
// RetryFor does, the same value each time; a new policy resolves anew;
// past maxResolvedProviders a provider is resolved at each use.
func TestRetryForResolvesOncePerProviderAndPolicy(t *testing.T) {
	p := policy.Default()
	off, three := retry.ModeOff, 3
	p.Retry.Providers = map[string]retry.Override{
		"strict": {MaxRetries: &three, RetryableRemove: []string{"timeout"}},
		"never":  {Mode: &off},
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	c := e.cur.Load()
	for _, provider := range []string{"strict", "never", "openai", ""} {
		got, want := c.retryFor(provider), p.RetryFor(provider)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q: %+v, want %+v", provider, got, want)
		}
		if again := c.retryFor(provider); again != got {
			t.Errorf("%q: resolved again (%p, then %p)", provider, got, again)
		}
	}

	q := policy.Default()
	q.Retry.MaxRetries = 1
	if err := e.SetPolicy(q); err != nil {
		t.Fatal(err)
	}
	if got := e.cur.Load().retryFor("strict"); got.MaxRetries != 1 {
		t.Errorf("after SetPolicy: max retries %d, want the new policy's 1", got.MaxRetries)
	}

	c = e.cur.Load()
	for i := range maxResolvedProviders + 10 {
		c.retryFor("p" + strconv.Itoa(i))
	}
	if n := len(c.retry); n != maxResolvedProviders {
		t.Errorf("%d providers resolved and kept, want at most %d", n, maxResolvedProviders)
	}
	if got := c.retryFor("past-the-bound"); !reflect.DeepEqual(got, q.RetryFor("past-the-bound")) {
		t.Errorf("a provider past the bound: %+v", got)
	}
}
