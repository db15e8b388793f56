package engine

import (
	"context"
	"errors"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/simulate"
	"github.com/failbus/failbus/pkg/events"
)

// The recovery stage (the post-outage checklist): the core of
// internal/policy/recovery on the engine's Recovery store. Its inputs are the
// agents' heartbeats, cron specs and runs, writes and tasks, and what the
// other stages produced (outcomes, provider health, decisions); its outputs are
// dispatches, control commands, step records and one notification per
// recovery (admitted like every notification). Step drives it on the
// virtual clock: before an input, whatever of it fell due (probes,
// checklist steps, releases at the drain rate) happens at its own time.
//
// The recovery service runs the same core on its own bus stores
// (internal/service/recoverer); the engine runs it for simulate and shadow.

// recoveryCore is the policy's recovery core, nil without a Recovery store.
func (e *Engine) recoveryCore() *recovery.Core { return e.cur.Load().rec }

// RecoverDue does what fell due by now in the recovery stage and returns
// what it sent, in time order.
func (e *Engine) RecoverDue(ctx context.Context, now time.Time) ([]simulate.Output, error) {
	c := e.recoveryCore()
	if c == nil {
		return nil, nil
	}
	var out []simulate.Output
	e.clockMu.Lock()
	defer e.clockMu.Unlock()
	err := e.clock.AdvanceTo(simulate.Collect(ctx, &out), c, now)
	return out, err
}

// Recover folds one input into the recovery stage at now and does what it
// made due at once. An input it cannot use is an *InputError.
func (e *Engine) Recover(ctx context.Context, in recovery.Input, now time.Time) ([]simulate.Output, error) {
	c := e.recoveryCore()
	if c == nil {
		return nil, nil
	}
	var out []simulate.Output
	cctx := simulate.Collect(ctx, &out)
	if err := c.Step(cctx, in, now); err != nil {
		if errors.Is(err, recovery.ErrInvalid) {
			return out, &InputError{Problem: err.Error()}
		}
		return out, err
	}
	e.clockMu.Lock()
	defer e.clockMu.Unlock()
	err := e.clock.AdvanceTo(cctx, c, now)
	return out, err
}

// recoverFromOutcome feeds the recovery stage the outcome and what its
// stages produced: the outcome and the decision say who uses and holds on
// which provider (the probe targets; the recovery service reads them from
// the streams when a probe is due), health changes open and close
// episodes.
func (e *Engine) recoverFromOutcome(ctx context.Context, o *events.Outcome, fx *Effects, now time.Time) error {
	if e.recoveryCore() == nil {
		return nil
	}
	out, err := e.Recover(ctx, recovery.Input{Outcome: o}, now)
	fx.Recovery = append(fx.Recovery, splitRecovery(out, fx)...)
	if err != nil {
		return err
	}
	for i := range fx.Health {
		out, err := e.Recover(ctx, recovery.Input{Health: &fx.Health[i]}, now)
		fx.Recovery = append(fx.Recovery, splitRecovery(out, fx)...)
		if err != nil {
			return err
		}
	}
	if fx.Decision != nil {
		d := *fx.Decision
		out, err := e.Recover(ctx, recovery.Input{Decision: &d}, now)
		fx.Recovery = append(fx.Recovery, splitRecovery(out, fx)...)
		if err != nil {
			return err
		}
	}
	return nil
}

// recoveryInput is the recovery input of in, if it is one.
func (in Input) recoveryInput() (recovery.Input, bool) {
	switch {
	case in.Heartbeat != nil:
		return recovery.Input{Heartbeat: in.Heartbeat}, true
	case in.CronSpec != nil:
		return recovery.Input{CronSpec: in.CronSpec}, true
	case in.CronRun != nil:
		return recovery.Input{CronRun: in.CronRun}, true
	case in.Write != nil:
		return recovery.Input{Write: in.Write}, true
	case in.Task != nil:
		return recovery.Input{Task: in.Task}, true
	}
	return recovery.Input{}, false
}

// splitRecovery moves the recovery stage's notifications to the requests
// (admitted like every other) and keeps its other outputs.
func splitRecovery(out []simulate.Output, fx *Effects) []simulate.Output {
	kept := out[:0:0]
	for _, o := range out {
		if n, ok := o.Msg.(*events.Notification); ok {
			fx.Requests = append(fx.Requests, *n)
			continue
		}
		kept = append(kept, o)
	}
	return kept
}
