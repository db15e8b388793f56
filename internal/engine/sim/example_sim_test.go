package sim_test

import (
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/engine/sim"
)

// The simulate engine, driven line by line as `failbus simulate` drives it.
func ExampleSim() {
	engine, _ := sim.New(sim.Config{Seed: 1})
	for i, line := range []string{
		`{"type":"outcome","id":"o1","at":"2025-03-01T12:00:00Z","agent":"a1","provider":"openai","status":429,"headers":{"retry-after":"2"}}`,
		`{"type":"tick","at":"2025-03-01T12:00:05Z"}`,
	} {
		for _, out := range engine.StepLine([]byte(line), i+1) {
			switch out.Type {
			case sim.OutputDecision:
				fmt.Println(out.Type, out.Decision.Action, out.Decision.DelayMS)
			case sim.OutputRetryDue:
				fmt.Println(out.Type, out.RetryDue.At.Format(time.RFC3339))
			default:
				fmt.Println(out.Type)
			}
		}
	}
	// Output:
	// classification
	// decision retry 2000
	// retry_due 2025-03-01T12:00:02Z
}
