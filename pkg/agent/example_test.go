package agent_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/failbus/failbus/failbustest"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// An agent reports the outcome of each LLM call and acts on the decisions
// the bus sends back. The bus here is a whole one in the process
// (failbustest: server, topology and every service); against a deployed
// bus or `failbus dev`, connect with nats.Connect(url) instead.
func Example() {
	bus, err := failbustest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer bus.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ag, err := agent.New(bus.Conn(), "support-bot-1")
	if err != nil {
		log.Fatal(err)
	}
	decisions, err := ag.Decisions(ctx) // open before reporting: nothing is missed
	if err != nil {
		log.Fatal(err)
	}

	// The raw evidence of one failed call, exactly as received.
	o := &events.Outcome{
		ID:       "call-42",
		Provider: "openai",
		Model:    "gpt-4.1",
		Status:   429,
		Headers:  map[string]string{"retry-after": "2"},
	}
	if err := ag.Report(ctx, o); err != nil {
		log.Fatal(err)
	}

	// The classifier filed it as a rate limit, the scheduler decided.
	d := <-decisions
	fmt.Printf("%s: %s (%s) after %dms\n", d.OutcomeID, d.Action, d.Class, d.DelayMS)
	// Output: call-42: retry (rate_limit) after 2000ms
}
