package shadow_test

import (
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/cli/shadow"
	"github.com/failbus/failbus/internal/engine/sim"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// Shadow as a library: replay history under two policies and look at what
// would have been decided differently.
func Example() {
	base, _ := policy.Parse([]byte("retry:\n  max_retries: 10\n"))
	next, _ := policy.Parse([]byte("retry:\n  max_retries: 1\n"))
	s, err := shadow.New(shadow.Options{Base: base, New: next})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range 3 { // one step of one turn failing three times
		at := events.At(t0.Add(time.Duration(i) * time.Minute))
		o := &events.Outcome{ID: fmt.Sprintf("o-%d", i), At: at, Agent: "bot", Provider: "openai", Status: 503, Turn: 1, Step: 1}
		if d := s.Step(sim.Input{Type: sim.InputOutcome, At: at, Outcome: o}); d != nil {
			fmt.Printf("%s: base %s %d, new %s\n", d.OutcomeID, d.Base.Action, d.Base.Retry, d.New.Action)
		}
	}
	sum := s.Summary()
	fmt.Println(sum.Outcomes, "outcomes,", sum.Differ, "differ:", sum.Changes)
	// Output:
	// o-1: base retry 2, new give_up
	// o-2: base retry 3, new give_up
	// 3 outcomes, 2 differ: map[retry→give_up:2]
}
