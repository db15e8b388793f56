package policy_test

import (
	"fmt"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// A gateway answers 400 with {"error":"upstream pool full"} when its own
// pool is full. Out of the box that is a bad_request (the provider stated a
// reason no family knows, not retryable); one user rule in the policy
// file's classify section makes it an overloaded provider, which is
// retried. User rules run before the built-in ones.
func ExamplePolicy_Classifier() {
	p, err := policy.Parse([]byte(`
classify:
  rules:
    - id: my-gateway.upstream_busy
      class: overloaded
      providers: [my-gateway]
      status: [400]
      body: ["upstream pool full"]
`))
	if err != nil {
		fmt.Println(err) // names the bad key or rule and its line
		return
	}
	c, err := p.Classifier()
	if err != nil {
		fmt.Println(err)
		return
	}
	o := &events.Outcome{ID: "o-1", Agent: "a", Provider: "my-gateway", Status: 400, Body: `{"error":"upstream pool full"}`}

	before := policy.Classify(o)
	after := c.Classify(o)
	fmt.Println(before.Class, before.Retryable, before.Rule)
	fmt.Println(after.Class, after.Retryable, after.Rule)
	// Output:
	// bad_request false status.4xx
	// overloaded true my-gateway.upstream_busy
}

// The retry section resolved for one provider: the global values with that
// provider's override on top, and the classes it retries.
func ExamplePolicy_RetryFor() {
	p, err := policy.Parse([]byte(`
retry:
  max_retries: 5
  providers:
    anthropic: {max_retries: 2}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, provider := range []string{"openai", "anthropic"} {
		rp := p.RetryFor(provider)
		fmt.Println(provider, rp.MaxRetries, rp.IsRetryable(events.ClassRateLimit), rp.IsRetryable(events.ClassBadRequest))
	}
	// Output:
	// openai 5 true false
	// anthropic 2 true false
}
