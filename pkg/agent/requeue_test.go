package agent_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/requeue"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// TestAgentSkipsADecisionRequeuedForAService: a dead letter of a failbus
// service requeued onto a decision subject (failbus dlq requeue) is for
// that service; the agent had the original and does not get it twice.
func TestAgentSkipsADecisionRequeuedForAService(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ag, err := agent.New(b.nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	ch, err := ag.Decisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, hdr, err := events.Encode(&events.Decision{OutcomeID: "o-copy", Agent: "bot", Action: events.ActionGiveUp})
	if err != nil {
		t.Fatal(err)
	}
	hdr.Set(requeue.HeaderFor, "recovery-decisions")
	hdr.Set(requeue.HeaderFrom, "FAILBUS_DLQ:3")
	if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: events.DecisionSubject("bot"), Header: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
	b.publishDecision(t, events.Decision{OutcomeID: "o-1", Agent: "bot", Action: events.ActionRetry})
	if d := receive(t, ch); d.OutcomeID != "o-1" {
		t.Errorf("first decision received: %+v, want o-1 (the requeued copy skipped)", d)
	}
}
