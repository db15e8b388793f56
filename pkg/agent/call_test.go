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

// TestCall runs the agent side of every action against one real bus.
func TestCall(t *testing.T) {
	b := callBus(t)

	t.Run("a 429 is retried when the bus's due retry arrives, and marked started", func(t *testing.T) {
		a := callAgent(t, b, "retrier")
		var calls atomic.Int32
		var second time.Time
		res, trail, err := agent.Call(callCtx(t), a, agent.Request{Provider: "openai", Model: "m", Turn: 1, Step: 1},
			func(ctx context.Context, at *agent.Attempt) (string, error) {
				if calls.Add(1) == 1 {
					return "", &agent.HTTPError{Status: 429, Body: `{"error":{"type":"rate_limit_error"}}`, Headers: map[string]string{"retry-after": "1"}}
				}
				second = time.Now()
				return "hello", nil
			})
		if err != nil || res != "hello" {
			t.Fatalf("Call = %q, %v", res, err)
		}
		if len(trail) != 2 || trail[0].Decision == nil || trail[0].Decision.Action != events.ActionRetry || trail[1].Decision != nil {
			t.Fatalf("trail %+v, want a retry then a success", trail)
		}
		if due := trail[0].Decision.DueAt.Time; second.Before(due) {
			t.Errorf("second attempt at %v, before the retry was due (%v): a local timer, not the bus's due retry", second, due)
		}
		if n := storedCount(t, b, topology.StreamRetries, events.RetryStartedSubject("retrier")); n != 1 {
			t.Errorf("%d started records, want 1", n)
		}
		if !trail[1].Outcome.OK || trail[1].Outcome.Turn != 1 || trail[1].Outcome.Step != 1 {
			t.Errorf("the success reported as %+v", trail[1].Outcome)
		}
	})

	t.Run("what only the caller can do comes back as a DecisionError with class and rule", func(t *testing.T) {
		a := callAgent(t, b, "giver")
		_, trail, err := agent.Call(callCtx(t), a, agent.Request{Provider: "openai", Model: "m"},
			func(ctx context.Context, at *agent.Attempt) (string, error) {
				return "", &agent.HTTPError{Status: 401, Body: `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`}
			})
		var de *agent.DecisionError
		if !errors.As(err, &de) || de.Action() != events.ActionGiveUp || de.Decision.Class != events.ClassAuth || de.Decision.Rule == "" {
			t.Fatalf("err %v (%+v), want give_up on auth with its rule", err, de)
		}
		if len(trail) != 1 {
			t.Errorf("%d attempts, want 1", len(trail))
		}
	})

	t.Run("a stalled stream is ended, reported as a timeout and restarted, never spliced", func(t *testing.T) {
		a := callAgent(t, b, "staller")
		var (
			mu       sync.Mutex
			chunks   []agent.Chunk
			restarts []agent.Restart
		)
		req := agent.Request{Provider: "openai", Model: "m", Turn: 1, Step: 1, StallAfter: 300 * time.Millisecond,
			OnChunk:   func(c agent.Chunk) { mu.Lock(); chunks = append(chunks, c); mu.Unlock() },
			OnRestart: func(r agent.Restart) { mu.Lock(); restarts = append(restarts, r); mu.Unlock() },
		}
		res, trail, err := agent.Call(callCtx(t), a, req, func(ctx context.Context, at *agent.Attempt) (string, error) {
			if at.N == 1 {
				at.Emit("hel")
				<-ctx.Done() // the stream hangs
				return "", ctx.Err()
			}
			at.Emit("hello")
			return "hello", nil
		})
		if err != nil || res != "hello" {
			t.Fatalf("Call = %q, %v", res, err)
		}
		if got := trail[0].Outcome.TransportError; !strings.Contains(got, "stall_after") {
			t.Errorf("the stalled attempt reported as %q", got)
		}
		if d := trail[0].Decision; d == nil || d.Class != events.ClassTimeout || d.Action != events.ActionRetry {
			t.Errorf("the stall decided as %+v, want a retry of a timeout", d)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(restarts) != 1 || restarts[0].Attempt != 2 || restarts[0].Partial != "hel" {
			t.Errorf("restarts %+v, want one before attempt 2 with the partial output", restarts)
		}
		if len(chunks) != 2 || chunks[0] != (agent.Chunk{Attempt: 1, Text: "hel"}) || chunks[1] != (agent.Chunk{Attempt: 2, Text: "hello"}) {
			t.Errorf("chunks %+v, want each tagged with its attempt", chunks)
		}
	})

	t.Run("an outage holds the call: only probes reach the provider until it recovered", func(t *testing.T) {
		a := callAgent(t, b, "holder")
		var (
			up, waited     atomic.Bool
			probes, inHold atomic.Int32
		)
		ctx := callCtx(t)
		go func() {
			// The provider comes back once the call held and probed twice.
			for ctx.Err() == nil && !(waited.Load() && probes.Load() >= 2) {
				time.Sleep(20 * time.Millisecond)
			}
			up.Store(true)
		}()
		res, trail, err := agent.Call(ctx, a, agent.Request{Provider: "downer", Model: "m", Turn: 1, Step: 1, ResumeWindow: 200 * time.Millisecond},
			func(ctx context.Context, at *agent.Attempt) (string, error) {
				switch {
				case at.Probe:
					probes.Add(1)
					waited.Store(true)
				case waited.Load() && !up.Load():
					inHold.Add(1)
				}
				if !up.Load() {
					return "", errors.New("dial tcp 10.0.0.1:443: connect: connection refused")
				}
				return "back", nil
			})
		if err != nil || res != "back" {
			t.Fatalf("Call = %q, %v", res, err)
		}
		var held bool
		for _, s := range trail {
			if s.Decision != nil && s.Decision.Action == events.ActionWaitProvider {
				held = true
			}
		}
		if !held {
			t.Fatalf("trail %+v has no wait_provider", trail)
		}
		if inHold.Load() != 0 {
			t.Errorf("%d calls reached the provider during the outage besides probes", inHold.Load())
		}
		if probes.Load() < 2 {
			t.Errorf("%d probes answered, want at least 2", probes.Load())
		}
	})
}

// A refused segment goes to the next provider the refusal tiers allow:
// the provider that refused its history is left out before the call.
func TestCallRoutesAroundARefusingProvider(t *testing.T) {
	b := callBus(t)
	a := callAgent(t, b, "router")
	ctx := callCtx(t)
	req := agent.Request{Provider: "strict", Model: "m", Providers: []string{"strict", "lenient"}, Session: "s1", Segment: 1, Turn: 1, Step: 1}
	_, _, err := agent.Call(ctx, a, req, func(ctx context.Context, at *agent.Attempt) (string, error) {
		at.Observe(agent.Evidence{Status: 200, StopReason: "refusal", RefusalScope: "history"})
		return "", nil
	})
	var de *agent.DecisionError
	if !errors.As(err, &de) || de.Action() != events.ActionSkipProvider {
		t.Fatalf("err %v, want skip_provider", err)
	}
	req.Turn = 2
	var targets []string
	res, _, err := agent.Call(ctx, a, req, func(ctx context.Context, at *agent.Attempt) (string, error) {
		targets = append(targets, at.Provider)
		return "ok", nil
	})
	if err != nil || res != "ok" || len(targets) != 1 || targets[0] != "lenient" {
		t.Fatalf("second call: %q, %v, targets %v; want one attempt on lenient", res, err, targets)
	}
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
