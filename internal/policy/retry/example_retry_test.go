package retry_test

import (
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// A scheduler's use of the pure core: resolve the provider's policy, read
// the budget's latest ledger record, fold the outcome into the provider's
// fault-scope state, decide, and persist the record before scheduling.
func ExampleDecide() {
	pol, _ := policy.Parse([]byte("retry: {jitter_ratio: 0}"))
	ledger := map[string]*retry.Record{} // a JetStream stream, last message per subject
	health := &scope.ProviderState{}     // a KV entry per provider
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

	for i := 1; i <= 3; i++ {
		c := events.Classification{OutcomeID: fmt.Sprintf("o%d", i), Agent: "a1", Turn: 1, Step: 1,
			Provider: "openai", Profile: "p1", Class: events.ClassServerError}
		rp := pol.RetryFor(c.Provider)
		budget := retry.BudgetFor(c, rp)
		obs := health.Observe(pol.Scope, c, now)
		v := retry.Decide(retry.Input{
			Classification: c, Policy: rp, Scope: obs.Verdict,
			Prior: ledger[budget.Token()], Now: now, U: 0.5,
		})
		if v.Record != nil && !v.Replayed {
			ledger[budget.Token()] = v.Record // persist before scheduling
		}
		fmt.Println(v.Decision.Action, v.Decision.Retry, v.Decision.DelayMS, v.Decision.DueAt.Format(time.TimeOnly))
		now = v.Record.DueAt.Time
	}
	// Output:
	// retry 1 1000 12:00:01
	// retry 2 2000 12:00:03
	// retry 3 4000 12:00:07
}
