// Package sim is `failbus simulate` (CONTRACT.md "failbus simulate"): the
// decision engine (internal/engine) — classification, fault scope, the retry
// chain, refusal tiers, notification admission, health — over input
// records on a virtual clock, with its state in memory (engine.Memory). It
// runs the very stages the services run; only the stores and the clock
// differ.
//
// Time is only what the inputs' `at` say. The clock is the latest `at` seen
// and never runs backwards: a line stamped earlier than the clock (records
// from several agents interleave) is handled at the clock, as a service
// handles a late message at its own now. The fault scope is the exception:
// it counts the line at its own `at`, on its provider's clock (the latest
// `at` of that provider's lines), as the scheduler does however its lanes
// interleave providers (scope.ProviderState.Observe). Before a timed line
// is handled, every pending retry whose due time is at or before the
// line's time comes due, in due order, each as a retry_due record stamped
// with its due time.
//
// Randomness (the backoff jitter) is drawn from each outcome's id, as on
// the bus (retry.JitterU), so a run is reproducible and decides the delays
// the bus decided for the same outcomes.
//
// A classification's `retryable` is its class's membership in the
// provider's effective retryable set (false under mode off): the policy's
// answer, not the class default. Always mode may still retry a class
// outside the set, as the fallback of the chain (retry.Decide).
//
// Output records per outcome, in order: classification; health changes;
// decision (none for a success); notifications actually sent, by the
// notifier's admission rules (notification.Admit): a dedupe key once per
// dedupe lifetime (7 days by default), non-critical ones capped per UTC day
// of the virtual clock, a key held back by the budget held again the same
// day and tried again on a later one, the day's digest right after its
// first hold, critical always sent.
package sim

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/policy/recovery/simulate"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/pkg/policy"
)

// Config configures a Sim.
type Config struct {
	// Policy is the policy to run; nil runs policy.Default().
	Policy *policy.Policy
	// Seed varies the backoff jitter's draw (engine.Config.Seed): 0 draws
	// it as the bus does, from each outcome's id.
	Seed uint64
	// DedupeLifetime is how long a sent notification's dedupe key
	// suppresses the same key. Defaults to
	// notification.DefaultDedupeLifetime (7 days), the notifier's default.
	DedupeLifetime time.Duration
}

// Sim drives the engine line by line on a virtual clock. It is not safe
// for concurrent use.
type Sim struct {
	eng  *engine.Engine
	mem  *engine.Memory
	opts engine.StepOptions

	clock    time.Time
	outcomes map[string]bool
}

// New builds a simulator running cfg.Policy on fresh in-memory stores.
func New(cfg Config) (*Sim, error) {
	p := cfg.Policy
	if p == nil {
		p = policy.Default()
	}
	mem := engine.NewMemory(p.Refusal.StateTTL)
	eng, err := engine.New(engine.Config{Policy: p, Stores: mem.Stores(), Seed: cfg.Seed})
	if err != nil {
		return nil, fmt.Errorf("simulate: %w", err)
	}
	return &Sim{eng: eng, mem: mem, opts: engine.StepOptions{DedupeLifetime: cfg.DedupeLifetime}, outcomes: map[string]bool{}}, nil
}

// Now is the virtual clock: the latest `at` seen (zero before any).
func (s *Sim) Now() time.Time { return s.clock }

// Engine is the engine the simulator drives.
func (s *Sim) Engine() *engine.Engine { return s.eng }

// Memory is the engine's state, for inspection and tests.
func (s *Sim) Memory() *engine.Memory { return s.mem }

// Pending returns the retries scheduled and not yet due, in due order.
func (s *Sim) Pending() []retry.Record { return s.mem.Pending() }

// StepLine parses one input line and steps it; a line that cannot be
// parsed yields its error record.
func (s *Sim) StepLine(data []byte, lineNo int) []Output {
	in, err := ParseInput(data, lineNo)
	if err != nil {
		return []Output{ErrorOutput(lineNo, err)}
	}
	return s.Step(in)
}

// Step handles one input record and returns the output records it caused,
// in order.
func (s *Sim) Step(in Input) []Output {
	if in.Type == InputSync {
		return []Output{{Type: OutputSync, SyncID: in.SyncID}}
	}
	switch {
	case in.Type == InputOutcome, in.Type == InputBoundary, in.Type == InputRoute, in.Type == InputTick, in.Recovery != nil:
	default:
		return []Output{ErrorOutput(in.Line, fmt.Errorf("unknown type %q (want %s)", in.Type, inputTypeWords))}
	}
	if in.At.IsZero() && s.clock.IsZero() {
		return []Output{ErrorOutput(in.Line, fmt.Errorf(`%s: "at" is required (no time has been seen yet)`, in.Type))}
	}
	now := s.clock
	if in.At.After(now) {
		now = in.At.Time
	}
	s.clock = now
	ein := engine.Input{Outcome: in.Outcome, Boundary: in.Boundary, Route: in.Route}
	if r := in.Recovery; r != nil {
		ein.Heartbeat, ein.CronSpec, ein.CronRun, ein.Write, ein.Task = r.Heartbeat, r.CronSpec, r.CronRun, r.Write, r.Task
	}
	var reject error // the line is not handled; what is due still comes due
	switch {
	case in.Type == InputOutcome && in.Outcome == nil:
		reject = errors.New("outcome: missing")
	case in.Type == InputBoundary && in.Boundary == nil:
		reject = errors.New("boundary: missing")
	case in.Type == InputRoute && in.Route == nil:
		reject = errors.New("route: missing")
	case in.Outcome != nil && in.Outcome.Validate() == nil:
		if s.outcomes[in.Outcome.ID] {
			reject = fmt.Errorf("outcome %q: duplicate id, ignored (the bus deduplicates by Nats-Msg-Id)", in.Outcome.ID)
		}
		s.outcomes[in.Outcome.ID] = true
	}
	if reject != nil {
		ein = engine.Input{}
	}
	fx, err := s.eng.Step(context.Background(), ein, now, s.opts)
	out := s.outputs(fx, err, in.Line)
	if reject != nil {
		out = append(out, ErrorOutput(in.Line, reject))
	}
	return out
}

// outputs turns one step's effects into output records, in the order they
// happened.
func (s *Sim) outputs(fx engine.Effects, err error, line int) []Output {
	// Sized once: every input of a replay makes a few outputs.
	n := len(fx.Due) + len(fx.RecoveryDue) + len(fx.Health) + len(fx.Recovery) + len(fx.Sent) + 4
	if n == 4 && fx.Classification == nil && fx.Decision == nil && fx.Route == nil && err == nil {
		return nil
	}
	out := make([]Output, 0, n)
	recovered := func(rs []simulate.Output) {
		for i := range rs {
			out = append(out, Output{Type: rs[i].Type, Recovery: &rs[i]})
		}
	}
	for i := range fx.Due {
		r := fx.Due[i]
		out = append(out, Output{Type: OutputRetryDue, RetryDue: &DueRecord{
			RetryID: r.RetryID, OutcomeID: r.OutcomeID, Agent: r.Agent, Retry: r.Retry, At: r.DueAt,
		}})
	}
	recovered(fx.RecoveryDue)
	if fx.Classification != nil {
		out = append(out, Output{Type: OutputClassification, Classification: fx.Classification})
	}
	for i := range fx.Health {
		out = append(out, Output{Type: OutputHealth, Health: &fx.Health[i]})
	}
	if fx.Decision != nil {
		out = append(out, Output{Type: OutputDecision, Decision: fx.Decision})
	}
	recovered(fx.Recovery)
	for i := range fx.Sent {
		out = append(out, Output{Type: OutputNotification, Notification: &fx.Sent[i]})
	}
	if fx.Route != nil {
		out = append(out, Output{Type: OutputRoute, Route: fx.Route})
	}
	if err != nil {
		var ie *engine.InputError
		if !errors.As(err, &ie) {
			err = fmt.Errorf("simulate: %w", err)
		}
		out = append(out, ErrorOutput(line, err))
	}
	return out
}
