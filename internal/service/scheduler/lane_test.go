package scheduler_test

import (
	"testing"

	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// TestBudgetLaneOrdersABudgetNotAnAgent: the failures of one retry budget
// share a lane (decided one at a time, in order); another step, turn,
// session, provider or agent is another lane, so one busy agent's steps
// on one provider are decided in parallel. A classification that does not
// decode has no lane.
func TestBudgetLaneOrdersABudgetNotAnAgent(t *testing.T) {
	msg := func(c events.Classification) *consumer.Msg {
		t.Helper()
		c.OutcomeID, c.Class = "o1", events.ClassServerError
		if c.Agent == "" {
			c.Agent = "bot"
		}
		if c.Provider == "" {
			c.Provider = "openai"
		}
		data, h, err := events.Encode(&c)
		if err != nil {
			t.Fatal(err)
		}
		return &consumer.Msg{Subject: events.ClassifiedSubject(c.Provider, c.Class), Header: h, Data: data}
	}
	step1 := events.Classification{Session: "s", Turn: 1, Step: 1}
	if a, b := scheduler.BudgetLane(msg(step1)), scheduler.BudgetLane(msg(step1)); a != b || a == "" {
		t.Errorf("one budget: lanes %q and %q, want one", a, b)
	}
	for name, c := range map[string]events.Classification{
		"another step":     {Session: "s", Turn: 1, Step: 2},
		"another turn":     {Session: "s", Turn: 2, Step: 1},
		"another session":  {Session: "t", Turn: 1, Step: 1},
		"another provider": {Provider: "anthropic", Session: "s", Turn: 1, Step: 1},
		"another agent":    {Agent: "bot-2", Session: "s", Turn: 1, Step: 1},
	} {
		if a, b := scheduler.BudgetLane(msg(step1)), scheduler.BudgetLane(msg(c)); a == b {
			t.Errorf("%s shares the lane %q", name, a)
		}
	}
	if k := scheduler.BudgetLane(&consumer.Msg{Subject: events.ClassifiedSubject("openai", "ok"), Data: []byte("junk")}); k != "" {
		t.Errorf("a classification that does not decode has lane %q", k)
	}
}
