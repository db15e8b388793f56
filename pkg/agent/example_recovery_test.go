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

// An agent submits tasks through the bus: while their provider is up they
// come straight back as dispatches; while it is down they wait in
// FAILBUS_TASKS and come back, in order, after it recovered. Here the test
// bus takes the provider down and brings it back the way real calls do:
// network failures until the scheduler declares the outage, successes
// until it declares the recovery.
func Example_tasksHeldDuringAnOutage() {
	bus, err := failbustest.New()
	if err != nil {
		log.Fatal(err)
	}
	defer bus.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	ag, err := agent.New(bus.Conn(), "coordinator")
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

	submit("report-1")
	d := <-dispatches
	fmt.Println("dispatched", d.TaskID, "attempt", d.Attempt)

	if err := bus.TakeDown(ctx, "openai"); err != nil { // from now on openai's tasks wait
		log.Fatal(err)
	}
	submit("report-2")
	submit("report-3")
	fmt.Println("openai down: report-2 and report-3 held")

	if err := bus.BringUp(ctx, "openai"); err != nil {
		log.Fatal(err)
	}
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
