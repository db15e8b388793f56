package consumer_test

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/failbustest"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// A consumer of your own: a cost tracker that adds up request tokens per
// provider from every outcome on the bus. It gets its own durable consumer
// (created by the runner from ConsumerConfig), decoded messages (Decode), and
// everything else — acks, retries, dead letters for junk, metrics, drain —
// from the runner.
func Example_costTracker() {
	js, shutdown := exampleBus() // a bus with three outcomes on it
	defer shutdown()
	ctx, stop := context.WithCancel(context.Background())

	var mu sync.Mutex
	tokens := map[string]int{}
	seen := 0
	track := func(_ context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
		o := m.Value.(*events.Outcome)
		mu.Lock()
		defer mu.Unlock()
		tokens[o.Provider] += o.RequestTokens
		if seen++; seen == 3 {
			stop() // a real service runs until SIGTERM
		}
		return nil
	}
	r, err := consumer.New(js, consumer.Config{
		Service: "costs",
		Stream:  topology.StreamOutcomes,
		ConsumerConfig: &jetstream.ConsumerConfig{
			FilterSubject: events.OutcomePrefix + ".>",
			AckPolicy:     jetstream.AckExplicitPolicy,
		},
		Decode: true,
	}, track)
	if err != nil {
		panic(err)
	}
	if err := r.Run(ctx); err != nil { // blocks; drains and returns nil on cancel
		panic(err)
	}

	providers := make([]string, 0, len(tokens))
	for p := range tokens {
		providers = append(providers, p)
	}
	sort.Strings(providers)
	for _, p := range providers {
		fmt.Printf("%s: %d tokens\n", p, tokens[p])
	}
	// Output:
	// anthropic: 1500 tokens
	// openai: 700 tokens
}

// exampleBus starts a whole bus in the process (failbustest) and reports
// three outcomes on it, the way agents do.
func exampleBus() (jetstream.JetStream, func()) {
	bus, err := failbustest.New()
	if err != nil {
		panic(err)
	}
	ag, err := agent.New(bus.Conn(), "agent-1")
	if err != nil {
		panic(err)
	}
	for i, o := range []events.Outcome{
		{Provider: "openai", RequestTokens: 700},
		{Provider: "anthropic", RequestTokens: 1000},
		{Provider: "anthropic", RequestTokens: 500},
	} {
		o.ID, o.OK, o.Status = fmt.Sprintf("call-%d", i), true, 200
		if err := ag.Report(context.Background(), &o); err != nil {
			panic(err)
		}
	}
	return bus.JetStream(), func() { _ = bus.Close() }
}
