package agent_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/servicespec"
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
func callBus(t *testing.T, specs ...daemon.Spec) *devbus.Bus {
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
	b := callBus(t, servicespec.Classifier())
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

// A call whose segment may go only to a provider the bus already knows
// is down holds without calling it: only the bus's probes reach the
// provider until it recovered, then the call is made once.
func TestCallHoldsOnASegmentWhoseProviderIsDown(t *testing.T) {
	b := callBus(t)
	a := callAgent(t, b, "patient")
	ctx := callCtx(t)
	for range 3 {
		o := &events.Outcome{Provider: "sleepy", Model: "m", Profile: "p", TransportError: "dial tcp 10.0.0.9:443: connect: connection refused"}
		if err := a.Report(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := a.Route(ctx, "s", 1, []string{"sleepy"})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Allowed) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the refusal tiers never saw sleepy down")
		}
		time.Sleep(20 * time.Millisecond)
	}
	var (
		mu     sync.Mutex
		probes []time.Time
		calls  []time.Time
	)
	res, trail, err := agent.Call(ctx, a, agent.Request{Provider: "sleepy", Model: "m", Profile: "p", Session: "s", Segment: 1, Turn: 1, Step: 1, ResumeWindow: -1},
		func(ctx context.Context, at *agent.Attempt) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			if at.Probe {
				probes = append(probes, time.Now())
				return "pong", nil
			}
			calls = append(calls, time.Now())
			return "answer", nil
		})
	if err != nil || res != "answer" || len(trail) != 1 {
		t.Fatalf("Call = %q, %d attempts, %v; want the answer of one attempt", res, len(trail), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(probes) < 3 || len(calls) != 1 || calls[0].Before(probes[len(probes)-1]) {
		t.Errorf("%d probes, then %d calls (the first at %v, the last probe at %v); want the probes that recovered it, then one call", len(probes), len(calls), calls, probes)
	}
}

// A retry scheduled before its provider's outage was declared comes due
// into the outage: the call holds instead of sending it there, answering
// probes, and resumes once the provider recovered.
func TestCallHoldsARetryThatComesDueIntoAnOutage(t *testing.T) {
	b := callBus(t)
	a := callAgent(t, b, "late")
	other := callAgent(t, b, "other")
	ctx := callCtx(t)
	tctx := ctx // the attempt's own context ends with the attempt
	var (
		up               atomic.Bool
		outage, probes   atomic.Int32
		callsDuringOuter atomic.Int32
	)
	res, trail, err := agent.Call(ctx, a, agent.Request{Provider: "flaky", Model: "m", Turn: 1, Step: 1, ResumeWindow: 100 * time.Millisecond},
		func(ctx context.Context, at *agent.Attempt) (string, error) {
			switch {
			case at.N == 1 && !at.Probe:
				// Rate-limited; while the retry waits, the provider goes
				// down for everyone (another agent's network failures).
				go func() {
					for storedCount(t, b, topology.StreamDecisions, events.DecisionSubject("late")) == 0 {
						time.Sleep(10 * time.Millisecond) // the retry is decided first
					}
					for i := 0; outage.Load() == 0; i++ {
						o := &events.Outcome{Provider: "flaky", Model: "m", TransportError: "connect: connection refused"}
						if err := other.Report(tctx, o); err != nil {
							return
						}
						if storedCount(t, b, topology.StreamHealth, events.HealthSubject("flaky")) > 0 {
							outage.Store(1)
						}
					}
				}()
				return "", &agent.HTTPError{Status: 429, Headers: map[string]string{"retry-after": "2"}}
			case at.Probe:
				if probes.Add(1) >= 2 {
					up.Store(true)
				}
			case outage.Load() == 1 && !up.Load():
				callsDuringOuter.Add(1)
			}
			if !up.Load() {
				return "", errors.New("connect: connection refused")
			}
			return "back", nil
		})
	if err != nil || res != "back" {
		t.Fatalf("Call = %q, %v (trail %+v)", res, err, trail)
	}
	if d := trail[0].Decision; d == nil || d.Action != events.ActionRetry {
		t.Fatalf("the 429 decided as %+v, want a retry scheduled before the outage", d)
	}
	if n := callsDuringOuter.Load(); n != 0 {
		t.Errorf("%d calls reached the provider during its outage besides probes", n)
	}
	if probes.Load() < 2 {
		t.Errorf("%d probes, want at least 2", probes.Load())
	}
}
