package agent_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/service/recoverer"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// An agent submits tasks through the bus: while their provider is up they
// come straight back as dispatches; while it is down they wait in
// FAILBUS_TASKS and come back, in order, after it recovered. Here a
// stand-in publishes the health records the scheduler would.
func Example_tasksHeldDuringAnOutage() {
	srv, err := embedded.Start(embedded.Options{}) // or nats.Connect(url) to `failbus dev`
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	if err := topology.Apply(ctx, js, topology.Options{}); err != nil { // `failbus dev` does this
		log.Fatal(err)
	}
	// The recovery service (`failbus dev` runs it).
	svc, err := recoverer.New(ctx, js, recoverer.Options{})
	if err != nil {
		log.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = svc.Run(sctx) }()

	ag, err := agent.New(nc, "coordinator")
	if err != nil {
		log.Fatal(err)
	}
	dispatches, err := ag.Dispatches(ctx)
	if err != nil {
		log.Fatal(err)
	}
	// Kill, run_cron, check_write and probe commands go to handlers.
	go func() {
		_ = ag.HandleControls(ctx, agent.ControlHandlers{
			Probe: func(ctx context.Context, c events.Control) error {
				// Make one real call to c.Provider and Report its outcome.
				return nil
			},
		})
	}()

	submit := func(id string) {
		if err := ag.SubmitTask(ctx, &events.Task{ID: id, Provider: "openai", Kind: "summarise"}); err != nil {
			log.Fatal(err)
		}
	}
	health := func(state string) { // stand-in for the scheduler's fault scope
		data, h, _ := events.Encode(&events.Health{At: events.At(time.Now()), Provider: "openai", State: state})
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.HealthSubject("openai"), Header: h, Data: data}); err != nil {
			log.Fatal(err)
		}
	}

	submit("report-1")
	d := <-dispatches
	fmt.Println("dispatched", d.TaskID, "attempt", d.Attempt)

	health(events.HealthOutage) // stored: from now on openai's tasks wait
	submit("report-2")
	submit("report-3")
	fmt.Println("openai down: report-2 and report-3 held")

	health(events.HealthRecovered)
	for range 2 {
		d := <-dispatches
		fmt.Println("released", d.TaskID, "attempt", d.Attempt)
	}
	// Output:
	// dispatched report-1 attempt 1
	// openai down: report-2 and report-3 held
	// released report-2 attempt 1
	// released report-3 attempt 1
}
