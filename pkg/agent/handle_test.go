package agent_test

import (
	"context"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/durable"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// A durable agent that dies while it acts on a decision has not
// acknowledged it: the server still holds it as pending, to redeliver it to
// the next process of the agent. One whose handler returned has.
func TestAgentHandleDecisionsAcknowledgesOnceActedOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ackState := func(name string) (pending int, floor, delivered uint64) {
		t.Helper()
		c, err := b.js.Consumer(b.ctx, topology.StreamDecisions, durable.Name(name, "decisions"))
		if err != nil {
			t.Fatal(err)
		}
		info := c.CachedInfo()
		return info.NumAckPending, info.AckFloor.Stream, info.Delivered.Stream
	}

	// A process that dies inside its handler.
	nc, err := b.srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	dying, err := agent.New(nc, "bot-dies", agent.WithDurable())
	if err != nil {
		t.Fatal(err)
	}
	got, release := make(chan events.Decision, 1), make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		ended <- dying.HandleDecisions(b.ctx, func(_ context.Context, d events.Decision) error {
			got <- d
			<-release
			return nil
		})
	}()
	b.publishDecision(t, events.Decision{OutcomeID: "o-1", Agent: "bot-dies", Action: events.ActionRetry})
	if d := receive(t, got); d.OutcomeID != "o-1" {
		t.Fatalf("handler got %s, want o-1", d.OutcomeID)
	}
	nc.Close() // the process dies with the handler still running
	if pending, floor, delivered := ackState("bot-dies"); pending != 1 || floor >= delivered {
		t.Errorf("after dying in the handler: ack pending %d, ack floor %d, delivered %d; want the decision pending, not acknowledged", pending, floor, delivered)
	}
	close(release) // what was left of the process ends
	select {
	case err := <-ended:
		if err == nil {
			t.Error("HandleDecisions returned nil when its connection had closed")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("HandleDecisions still running after its connection closed")
	}
	if pending, floor, delivered := ackState("bot-dies"); pending != 1 || floor >= delivered {
		t.Errorf("after the dead process's handler returned: ack pending %d, ack floor %d, delivered %d; want the decision still pending", pending, floor, delivered)
	}

	// A process whose handler returns: acknowledged.
	ok, err := agent.New(b.nc, "bot-acts", agent.WithDurable())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	acted := make(chan events.Decision, 1)
	go func() {
		_ = ok.HandleDecisions(ctx, func(_ context.Context, d events.Decision) error { acted <- d; return nil })
	}()
	b.publishDecision(t, events.Decision{OutcomeID: "o-2", Agent: "bot-acts", Action: events.ActionGiveUp})
	if d := receive(t, acted); d.OutcomeID != "o-2" {
		t.Fatalf("handler got %s, want o-2", d.OutcomeID)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		pending, floor, delivered := ackState("bot-acts")
		if pending == 0 && floor == delivered && delivered > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("handler returned, but ack pending %d, ack floor %d, delivered %d", pending, floor, delivered)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
