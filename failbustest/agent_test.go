package failbustest_test

// An agent's own tests, written as an agent author writes them: with the
// public packages only (this file imports nothing under internal/).

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/failbustest"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newAgent is an agent on the bus whose background errors fail the test.
func newAgent(t *testing.T, bus *failbustest.Bus, name string) *agent.Agent {
	t.Helper()
	var mu sync.Mutex
	var errs []error
	ag, err := agent.New(bus.Conn(), name, agent.WithErrorHandler(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if err := errors.Join(errs...); err != nil {
			t.Errorf("agent %s: %v", name, err)
		}
	})
	return ag
}

// The agent reports a rate-limited call and gets the scheduler's own
// decision: a retry exactly when the provider said.
func TestAgentReportsAnOutcomeAndReadsItsDecision(t *testing.T) {
	bus := failbustest.Start(t)
	ctx := testCtx(t)
	ag := newAgent(t, bus, "support-bot")
	decisions, err := ag.Decisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o := &events.Outcome{Provider: "openai", Model: "gpt-4.1", Status: 429, Headers: map[string]string{"retry-after": "2"}}
	if err := ag.Report(ctx, o); err != nil {
		t.Fatal(err)
	}
	d := bus.WaitDecision(t, o.ID)
	if d.Action != events.ActionRetry || d.DelayMS != 2000 || d.Class != events.ClassRateLimit {
		t.Fatalf("decision %+v, want a rate_limit retry after 2000ms", d)
	}
	select {
	case got := <-decisions:
		if got.OutcomeID != o.ID || got.Action != d.Action {
			t.Fatalf("the agent read %+v, the bus decided %+v", got, d)
		}
	case <-ctx.Done():
		t.Fatal("the agent never read its decision")
	}
}

// A Call to a provider that is down finds out on its first attempt, then
// holds: only the bus's probes reach the provider, and the call is made
// again once the provider is back.
func TestCallHoldsThroughAProviderOutage(t *testing.T) {
	bus := failbustest.Start(t)
	ctx := testCtx(t)
	ag := newAgent(t, bus, "coordinator")

	bus.ProviderDown(t, "moonshot")

	var up atomic.Bool
	var probes, whileDown atomic.Int32
	type result struct {
		answer string
		trail  agent.Trail
		err    error
	}
	done := make(chan result, 1)
	go func() {
		answer, trail, err := agent.Call(ctx, ag, agent.Request{Provider: "moonshot", Model: "kimi-k2", ResumeWindow: -1},
			func(ctx context.Context, at *agent.Attempt) (string, error) {
				if at.Probe {
					probes.Add(1)
				} else if !up.Load() {
					whileDown.Add(1)
				}
				if !up.Load() {
					return "", errors.New("dial tcp: connect: connection refused")
				}
				return "pong", nil
			})
		done <- result{answer, trail, err}
	}()
	// Held, and probed: the recovery service asks the holding agent.
	for probes.Load() == 0 {
		select {
		case r := <-done:
			t.Fatalf("Call returned during the outage: %q, %v", r.answer, r.err)
		case <-ctx.Done():
			t.Fatal("no probe during the outage")
		case <-time.After(10 * time.Millisecond):
		}
	}
	up.Store(true)
	bus.ProviderUp(t, "moonshot")
	r := <-done
	if r.err != nil || r.answer != "pong" {
		t.Fatalf("Call = %q, %v; want the answer after the recovery", r.answer, r.err)
	}
	if n := whileDown.Load(); n != 1 {
		t.Errorf("%d calls reached moonshot while it was down besides probes, want the first only", n)
	}
	if len(r.trail) != 2 || r.trail[0].Decision == nil || r.trail[0].Decision.Action != events.ActionWaitProvider || !r.trail[1].Outcome.OK {
		t.Errorf("trail %+v, want a failure decided wait_provider, then the answer", r.trail)
	}
}

// Under WithAuth the agent runs with the credentials it is deployed with:
// a connection without them is refused, and the agent's own user may
// report and read its decisions.
func TestAgentWithItsOwnCredentials(t *testing.T) {
	bus := failbustest.Start(t, failbustest.WithAuth("billing-bot"))
	ctx := testCtx(t)
	if nc, err := nats.Connect(bus.URL()); err == nil {
		nc.Close()
		t.Fatal("a connection without credentials was accepted")
	}
	if _, err := bus.AgentConn("stranger"); err == nil {
		t.Fatal("credentials for an agent WithAuth did not name")
	}
	nc, err := bus.AgentConn("billing-bot")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ag, err := agent.New(nc, "billing-bot")
	if err != nil {
		t.Fatal(err)
	}
	decisions, err := ag.Decisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o := &events.Outcome{Provider: "openai", Status: 500, Body: `{"error":{"message":"internal error"}}`}
	if err := ag.Report(ctx, o); err != nil {
		t.Fatal(err)
	}
	want := bus.WaitDecision(t, o.ID)
	select {
	case d := <-decisions:
		if d.OutcomeID != o.ID || d.Action != want.Action {
			t.Fatalf("read %+v, the bus decided %+v", d, want)
		}
	case <-ctx.Done():
		t.Fatal("the agent never read its decision with its own credentials")
	}
}
