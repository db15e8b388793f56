package classify_test

import (
	"fmt"
	"strings"

	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/pkg/events"
	"go.yaml.in/yaml/v3"
)

// A gateway answers 400 with {"error":"upstream pool full"} when its own
// pool is full. Out of the box that is a bad_request (the provider stated a
// reason no family knows, not retryable); one user rule in the policy's
// classify section makes it an overloaded provider, which is retried. User
// rules run before the built-in ones.
func Example_userRule() {
	const section = `
rules:
  - id: my-gateway.upstream_busy
    class: overloaded
    providers: [my-gateway]
    status: [400]
    body: ["upstream pool full"]
`
	var cfg classify.Config
	dec := yaml.NewDecoder(strings.NewReader(section))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		fmt.Println(err)
		return
	}
	c, err := classify.New(cfg)
	if err != nil {
		fmt.Println(err) // names the bad rule, e.g. classify.rules[0] (id "…"): class: …
		return
	}
	o := &events.Outcome{ID: "o-1", Agent: "a", Provider: "my-gateway", Status: 400, Body: `{"error":"upstream pool full"}`}

	before := classify.Classify(o)
	after := c.Classify(o)
	fmt.Println(before.Class, before.Retryable, before.Rule)
	fmt.Println(after.Class, after.Retryable, after.Rule)
	fmt.Println(after.Evidence)
	// Output:
	// bad_request false status.4xx
	// overloaded true my-gateway.upstream_busy
	// [status 400 error text has "upstream pool full" message: upstream pool full]
}
