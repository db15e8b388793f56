package agent_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// An agent reports the outcome of each LLM call and acts on the decisions
// the bus sends back. Here a stand-in publishes the decision the scheduler
// service would.
func Example() {
	srv, err := embedded.Start(embedded.Options{}) // or nats.Connect(url) to a real bus
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	if err := topology.Apply(ctx, js, topology.Options{}); err != nil { // `failbus dev` does this
		log.Fatal(err)
	}

	ag, err := agent.New(nc, "support-bot-1")
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

	// Stand-in for the scheduler service.
	data, hdr, _ := events.Encode(&events.Decision{OutcomeID: o.ID, Agent: o.Agent, Action: events.ActionRetry, DelayMS: 2000})
	_, _ = js.PublishMsg(ctx, &nats.Msg{Subject: events.DecisionSubject(o.Agent), Header: hdr, Data: data})

	d := <-decisions
	fmt.Printf("%s: %s after %dms\n", d.OutcomeID, d.Action, d.DelayMS)
	// Output: call-42: retry after 2000ms
}
