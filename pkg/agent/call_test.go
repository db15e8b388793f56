package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/servicemain"
	"github.com/failbus/failbus/internal/services"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// callPolicy compresses the bus's clocks so a test sees retries, an outage,
// probes and the recovery in seconds.
const callPolicy = `
retry:
  initial_delay: 100ms
  max_delay: 2s
  jitter_ratio: 0
scope:
  recovery_min_successes: 3
  recovery_min_time: 1s
recovery:
  probe_interval: 300ms
  drain_rate: 50
`

// callBus is every service on an embedded server (specs nil: all).
func callBus(t *testing.T, specs ...servicemain.Spec) *devbus.Bus {
	t.Helper()
	pol, err := policy.Parse([]byte(callPolicy))
	if err != nil {
		t.Fatal(err)
	}
	b, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}, Policy: pol, Specs: specs, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	return b
}

func callAgent(t *testing.T, b *devbus.Bus, name string) *agent.Agent {
	t.Helper()
	nc, err := b.Srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	errs := make(chan error, 16)
	a, err := agent.New(nc, name, agent.WithErrorHandler(func(err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case err := <-errs:
			t.Errorf("agent error: %v", err)
		default:
		}
	})
	return a
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func storedCount(t *testing.T, b *devbus.Bus, stream, subject string) int {
	t.Helper()
	s, err := b.JS.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background(), jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	return n
}

// Without a scheduler a failure gets no decision: Call says so in time.
func TestCallWithoutASchedulerSaysSo(t *testing.T) {
	b := callBus(t, services.Classifier())
	a := callAgent(t, b, "alone")
	_, _, err := agent.Call(callCtx(t), a, agent.Request{Provider: "openai", DecisionTimeout: 500 * time.Millisecond},
		func(ctx context.Context, at *agent.Attempt) (string, error) {
			return "", &agent.HTTPError{Status: 503}
		})
	if !errors.Is(err, agent.ErrNoDecision) || !strings.Contains(err.Error(), "scheduler") {
		t.Fatalf("err %v, want ErrNoDecision naming the scheduler", err)
	}
}

// A call cancelled while it waits for a retry cancels the retry: no
// started record, a cancel record, the context's error.
func TestCallCancelledWhileWaitingCancelsTheRetry(t *testing.T) {
	b := callBus(t)
	a := callAgent(t, b, "quitter")
	ctx, cancel := context.WithCancel(callCtx(t))
	_, trail, err := agent.Call(ctx, a, agent.Request{Provider: "openai", Turn: 1, Step: 1},
		func(ctx context.Context, at *agent.Attempt) (string, error) {
			go func() {
				for storedCount(t, b, topology.StreamDecisions, events.DecisionSubject("quitter")) == 0 {
					time.Sleep(10 * time.Millisecond)
				}
				cancel()
			}()
			return "", &agent.HTTPError{Status: 429, Headers: map[string]string{"retry-after": "2"}}
		})
	if !errors.Is(err, context.Canceled) || len(trail) != 1 {
		t.Fatalf("err %v, trail %d; want the cancellation after one attempt", err, len(trail))
	}
	deadline := time.Now().Add(10 * time.Second)
	for storedCount(t, b, topology.StreamRetries, events.RetryCancelSubject("quitter")) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("no cancel record")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := storedCount(t, b, topology.StreamRetries, events.RetryStartedSubject("quitter")); n != 0 {
		t.Errorf("%d started records", n)
	}
}
