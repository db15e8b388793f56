package failbustest_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/failbus/failbus/failbustest"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// A test of an agent's own: start a bus (in a test, failbustest.Start(t)
// stops it with the test), report what the agent's calls did, and read
// what the real services decided. Here openai is taken down first, so a
// failed call is told to wait for it instead of retrying.
func Example() {
	bus, err := failbustest.New(failbustest.WithPolicy(`
retry:
  max_retries: 2
`))
	if err != nil {
		log.Fatal(err)
	}
	defer bus.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ag, err := agent.New(bus.Conn(), "my-agent")
	if err != nil {
		log.Fatal(err)
	}

	o := &events.Outcome{Provider: "anthropic", Status: 529, Body: `{"type":"error","error":{"type":"overloaded_error"}}`}
	if err := ag.Report(ctx, o); err != nil {
		log.Fatal(err)
	}
	d, err := bus.Decision(ctx, o.ID) // in a test: bus.WaitDecision(t, o.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Class, d.Action, "number", d.Retry)

	if err := bus.TakeDown(ctx, "openai"); err != nil { // in a test: bus.ProviderDown(t, "openai")
		log.Fatal(err)
	}
	o = &events.Outcome{Provider: "openai", TransportError: "dial tcp: connect: connection refused"}
	if err := ag.Report(ctx, o); err != nil {
		log.Fatal(err)
	}
	if d, err = bus.Decision(ctx, o.ID); err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Class, d.Action, d.Provider)
	// Output:
	// overloaded retry number 1
	// transport wait_provider openai
}
