package engine_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/pkg/events"
)

// TestAnAgentIsNeverSentToAnotherAgentsProfile: the newcomer's outcome
// (provider openai, no profile, a 429) while another agent's key-1 works
// is a retry after the cooldown — with its due retry scheduled, so an
// agent waiting for it is not left waiting — never switch_profile to
// key-1; and an agent holding two profiles of its own switches between
// them.
func TestAnAgentIsNeverSentToAnotherAgentsProfile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	eng, _ := newEngine(t, "")
	step := func(o events.Outcome, at time.Time) events.Decision {
		t.Helper()
		o.At = events.At(at)
		fx, err := eng.Step(ctx, engine.Input{Outcome: &o}, at, engine.StepOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if fx.Decision == nil {
			return events.Decision{}
		}
		return *fx.Decision
	}
	step(events.Outcome{ID: "k1", Agent: "fleet-7", Provider: "openai", Model: "gpt-4o", Profile: "key-1", OK: true, Status: 200}, t0)
	d := step(events.Outcome{ID: "c1", Agent: "bot", Provider: "openai", Model: "gpt-4o", Status: 429}, t0.Add(time.Second))
	if d.Action != events.ActionRetry || d.RetryID == "" || d.Profile != "" {
		t.Fatalf("bot without a profile: %+v; want a retry with its due retry scheduled, no profile named", d)
	}
	if strings.Contains(d.Reason, "key-1") {
		t.Errorf("the reason names another agent's profile: %q", d.Reason)
	}

	step(events.Outcome{ID: "b1", Agent: "bot2", Provider: "openai", Model: "gpt-4o", Profile: "key-2", OK: true, Status: 200}, t0.Add(2*time.Second))
	d = step(events.Outcome{ID: "b2", Agent: "bot2", Provider: "openai", Model: "gpt-4o", Profile: "key-3", Status: 429}, t0.Add(3*time.Second))
	if d.Action != events.ActionSwitchProfile || d.Profile != "key-2" {
		t.Fatalf("bot2 with key-2 of its own working: %+v; want switch_profile to key-2", d)
	}
}
