package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/policy/recovery/simulate"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/pkg/events"
)

// Input is one record for Step. Exactly one field is set; none is a tick
// (time passes, whatever fell due comes due).
//
// To add an input type: add its field here, a case to Step that calls its
// stage, and its JSON form to the simulate records (internal/engine/sim), as
// recovery's heartbeats, cron specs and runs, writes and tasks did.
type Input struct {
	Outcome  *events.Outcome
	Boundary *events.Boundary
	Route    *events.RouteRequest
	// Recovery's inputs (the recovery stage).
	Heartbeat *events.Heartbeat
	CronSpec  *events.CronSpec
	CronRun   *events.CronRun
	Write     *events.Write
	Task      *events.Task
}

// Effects is everything one Step caused, in the order it happened.
type Effects struct {
	// Due are the retries that came due before the input was handled, in
	// due order.
	Due []retry.Record
	// Classification is the outcome's classification.
	Classification *events.Classification
	// Health are the provider's health changes.
	Health []events.Health
	// Decision is what the agent is told (none for a success).
	Decision *events.Decision
	// Retry is the retry the decision scheduled (persisted in the Ledger,
	// added to the Timers); nil for any other decision.
	Retry *retry.Record
	// Refusal is the refusal-state change of a content refusal.
	Refusal *refusal.Event
	// Requests are the notification requests the input made, before
	// admission.
	Requests []events.Notification
	// Sent are the notifications admission let through (the budget digest
	// among them when it was asked for), in order.
	Sent []events.Notification
	// Admissions are the verdicts on Requests, one each, in order.
	Admissions []notification.Admission
	// Route answers a route request.
	Route *events.RouteRecord
	// Retired are the refusal-state keys a boundary retired.
	Retired []string
	// RecoveryDue are what the recovery stage did before the input, as it
	// fell due (probes, checklist steps, releases), in time order.
	RecoveryDue []simulate.Output
	// Recovery are what the recovery stage did because of the input
	// (dispatches, control commands, step records); its notifications are
	// among Requests.
	Recovery []simulate.Output
}

// InputError is an input Step cannot use: it names what is wrong; the
// effects Step returns with it (retries that came due) still happened.
type InputError struct {
	Problem string
}

func (e *InputError) Error() string { return e.Problem }

// StepOptions tune Step.
type StepOptions struct {
	// DedupeLifetime is notification admission's dedupe lifetime.
	// Defaults to notification.DefaultDedupeLifetime.
	DedupeLifetime time.Duration
}

// Step handles one input at now through every stage, as the bus would:
// due retries, then for an outcome classification (Classify), fault scope
// (Observe), the refusal tiers (Refuse) or the retry chain (Decide), the
// retry's timer, and admission of every notification request (Admit); for
// a boundary the refusal state it retires (Boundary); for a route request
// the answer (Route). It needs every store; simulate and shadow run it on
// Memory. An *InputError reports input the stages cannot use.
func (e *Engine) Step(ctx context.Context, in Input, now time.Time, opts StepOptions) (Effects, error) {
	var fx Effects
	if e.stores.Timers != nil {
		due, err := e.stores.Timers.Due(ctx, now)
		if err != nil {
			return fx, err
		}
		fx.Due = due
	}
	due, err := e.RecoverDue(ctx, now)
	fx.RecoveryDue = splitRecovery(due, &fx)
	if err == nil {
		err = e.stepInput(ctx, in, now, &fx)
	}
	// Every notification request of the step — the outcome's, the
	// recovery stage's — goes through admission, as on the bus.
	if aerr := e.admitRequests(ctx, now, opts, &fx); aerr != nil && err == nil {
		err = aerr
	}
	return fx, err
}

// stepInput runs the stages of one input.
func (e *Engine) stepInput(ctx context.Context, in Input, now time.Time, fx *Effects) error {
	if rin, ok := in.recoveryInput(); ok {
		out, err := e.Recover(ctx, rin, now)
		fx.Recovery = splitRecovery(out, fx)
		return err
	}
	switch {
	case in.Outcome != nil:
		if err := e.stepOutcome(ctx, in.Outcome, now, fx); err != nil {
			return err
		}
		return e.recoverFromOutcome(ctx, in.Outcome, fx, now)
	case in.Boundary != nil:
		if err := in.Boundary.Validate(); err != nil {
			return &InputError{Problem: "boundary: " + err.Error()}
		}
		bd := *in.Boundary
		bd.At = events.At(now)
		retired, err := e.Boundary(ctx, bd, now)
		fx.Retired = retired
		return err
	case in.Route != nil:
		r, err := e.Route(ctx, *in.Route, now, RouteOptions{})
		if err != nil {
			return err
		}
		fx.Route = &r.RouteRecord
	}
	return nil
}

// admitRequests admits every request of the step, in order.
func (e *Engine) admitRequests(ctx context.Context, now time.Time, opts StepOptions, fx *Effects) error {
	for _, n := range fx.Requests {
		if err := e.admitStep(ctx, n, now, opts, fx); err != nil {
			return err
		}
	}
	return nil
}

func (e *Engine) stepOutcome(ctx context.Context, o *events.Outcome, now time.Time, fx *Effects) error {
	if err := o.Validate(); err != nil {
		return &InputError{Problem: "outcome: " + err.Error()}
	}
	if o.At.IsZero() {
		o.At = events.At(now)
	}
	c := e.Classify(o)
	fx.Classification = &c

	obs, err := e.Observe(ctx, c, now)
	if err != nil {
		return err
	}
	fx.Health = obs.Health
	fx.Requests = append(fx.Requests, obs.Notify...)
	if err := e.Settle(ctx, c.Provider, obs.Seq); err != nil {
		return err
	}
	switch c.Class {
	case events.ClassOK:
		if err := e.Succeeded(ctx, c, obs.Now); err != nil {
			return err
		}
	case events.ClassContentRefusal:
		r, err := e.Refuse(ctx, c, now)
		if err != nil {
			return err
		}
		if r.Decision.Action != "" {
			fx.Decision = &r.Decision
		}
		fx.Refusal = &r.Event
		if r.Notification != nil {
			fx.Requests = append(fx.Requests, *r.Notification)
		}
	default:
		d, err := e.Decide(ctx, c, obs.Verdict, obs.Now)
		if err != nil {
			return err
		}
		fx.Decision = &d.Decision
		if d.Record != nil && !d.Replayed {
			fx.Retry = d.Record
			if e.stores.Timers != nil {
				if err := e.stores.Timers.Schedule(ctx, d.Record); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// admitStep admits n and, when it was the first held back that day, the
// day's digest right after it.
func (e *Engine) admitStep(ctx context.Context, n events.Notification, now time.Time, opts StepOptions, fx *Effects) error {
	if e.stores.Admissions == nil {
		return errors.New("engine: step: no admission store")
	}
	a, err := e.Admit(ctx, n, now, opts.DedupeLifetime)
	if err != nil {
		return err
	}
	fx.Admissions = append(fx.Admissions, a.Admission)
	if a.Sent != nil {
		fx.Sent = append(fx.Sent, *a.Sent)
	}
	if a.Digest != nil {
		d, err := e.Admit(ctx, *a.Digest, now, opts.DedupeLifetime)
		if err != nil {
			return fmt.Errorf("engine: digest: %w", err)
		}
		if d.Sent != nil {
			fx.Sent = append(fx.Sent, *d.Sent)
		}
	}
	return nil
}
