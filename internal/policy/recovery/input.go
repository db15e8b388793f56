package recovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// ErrInvalid is wrapped by every error about a record the core cannot use
// (a missing field, an unparseable schedule): a service dead-letters it,
// simulate writes an error record.
var ErrInvalid = errors.New("invalid input")

// Input is one record for the core: exactly one field is set. TaskSeq is
// the task's sequence in FAILBUS_TASKS (0: the store appends it).
type Input struct {
	Health    *events.Health
	Heartbeat *events.Heartbeat
	CronSpec  *events.CronSpec
	CronRun   *events.CronRun
	Write     *events.Write
	Task      *events.Task
	TaskSeq   uint64
	// TaskStoredAt is when FAILBUS_TASKS stored the task (zero: now). Its
	// dispatch cannot be older, so a redelivery after a crash between the
	// dispatch and its ledger entry looks for it in the stream from then
	// on, once the duplicate window may have forgotten it.
	TaskStoredAt time.Time
	// Decision and Outcome are noted for the probe targets (Usage) by a
	// store that keeps them; the bus's stores have them in their streams
	// and the recovery service does not feed them.
	Decision *events.Decision
	Outcome  *events.Outcome
}

// invalid wraps a validation error.
func invalid(kind string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrInvalid, kind, err)
}

// At is the input's own time (zero when it has none).
func (in Input) At() events.Time {
	switch {
	case in.Health != nil:
		return in.Health.At
	case in.Heartbeat != nil:
		return in.Heartbeat.At
	case in.CronSpec != nil:
		return in.CronSpec.At
	case in.CronRun != nil:
		return in.CronRun.At
	case in.Write != nil:
		return in.Write.At
	case in.Task != nil:
		return in.Task.At
	case in.Decision != nil:
		return in.Decision.At
	case in.Outcome != nil:
		return in.Outcome.At
	}
	return events.Time{}
}

// Step folds one input in at now. Errors wrapping ErrInvalid are about the
// input; others about the store or publisher (retry later). Step never runs
// the checklist itself: Advance does.
func (c *Core) Step(ctx context.Context, in Input, now time.Time) error {
	switch {
	case in.Health != nil:
		h := *in.Health
		if err := h.Validate(); err != nil {
			return invalid("health", err)
		}
		if h.At.IsZero() {
			h.At = events.At(now)
		}
		_, err := c.update(ctx, h.Provider, func(r *ProviderRecord) (bool, error) { return c.applyHealth(r, h), nil })
		return err
	case in.Heartbeat != nil:
		h := *in.Heartbeat
		if err := h.Validate(); err != nil {
			return invalid("heartbeat", err)
		}
		if h.At.IsZero() {
			h.At = events.At(now)
		}
		if err := c.st.PutHeartbeat(ctx, h); err != nil {
			return err
		}
		return c.noteUser(ctx, h.Provider, h.Agent, h.At.Time)
	case in.CronSpec != nil:
		s := *in.CronSpec
		if err := s.Validate(); err != nil {
			return invalid("cron_spec", err)
		}
		if s.At.IsZero() {
			s.At = events.At(now)
		}
		if err := c.st.PutCronSpec(ctx, s); err != nil {
			return err
		}
		return c.noteUser(ctx, s.Provider, s.Agent, s.At.Time)
	case in.CronRun != nil:
		r := *in.CronRun
		if err := r.Validate(); err != nil {
			return invalid("cron_run", err)
		}
		if r.At.IsZero() {
			r.At = events.At(now)
		}
		if err := c.st.NoteCronRun(ctx, r); err != nil {
			return err
		}
		return c.noteUser(ctx, r.Provider, r.Agent, r.At.Time)
	case in.Write != nil:
		w := *in.Write
		if err := w.Validate(); err != nil {
			return invalid("write", err)
		}
		if w.At.IsZero() {
			w.At = events.At(now)
		}
		if err := c.st.NoteWrite(ctx, w); err != nil {
			return err
		}
		return c.noteUser(ctx, w.Provider, w.Agent, w.At.Time)
	case in.Decision != nil:
		if in.Decision.Agent == "" {
			return nil
		}
		return c.st.NoteDecision(ctx, *in.Decision)
	case in.Outcome != nil:
		// Stored now: the bus's store reads the time it stored the outcome.
		o := in.Outcome
		if o.Provider == "" || o.Agent == "" {
			return nil
		}
		return c.st.NoteOutcome(ctx, o.Provider, o.Agent, now)
	case in.Task != nil:
		t := *in.Task
		if err := t.Validate(); err != nil {
			return invalid("task", err)
		}
		if t.At.IsZero() {
			t.At = events.At(now)
		}
		seq := in.TaskSeq
		if seq == 0 {
			app, ok := c.st.(TaskAppender)
			if !ok {
				return errors.New("recovery: a task without its stream sequence")
			}
			var err error
			if seq, err = app.AppendTask(ctx, t, now); err != nil {
				return err
			}
		}
		stored := in.TaskStoredAt
		if stored.IsZero() || stored.After(now) {
			stored = now
		}
		return c.task(ctx, t, seq, stored, now)
	}
	return invalid("input", errors.New("empty"))
}

// applyHealth folds a health record into the provider's record (rules 1 and
// "flapping" of the package doc). It reports whether r changed.
func (c *Core) applyHealth(r *ProviderRecord, h events.Health) bool {
	if !r.HealthAt.IsZero() && h.At.Before(r.HealthAt.Time) {
		return false // older than what was applied: a late redelivery
	}
	changed := r.Health != h.State || !r.HealthAt.Equal(h.At.Time)
	r.Health, r.HealthAt = h.State, h.At
	switch h.State {
	case events.HealthOutage:
		if r.Down {
			return changed // recovery interrupted: the same outage goes on
		}
		r.Down = true
		if r.open() == nil {
			r.Episodes = append(r.Episodes, Episode{
				RecoveryID:      RunID(r.Provider, h.At.Time),
				OutageStartedAt: h.At,
			})
		}
		if !r.Queue.Holding {
			r.Queue.Holding, r.Queue.Released = true, 0
		}
		r.Queue.NextAt = events.Time{} // a release under way stops; it restarts after recovery
		r.Probe = ProbeState{NextAt: events.At(h.At.Add(c.cfg.ProbeInterval))}
		return true
	case events.HealthRecovered, events.HealthHealthy:
		if !r.Down {
			return changed
		}
		r.Down = false
		if e := r.open(); e != nil {
			at := h.At
			if at.Before(e.OutageStartedAt.Time) {
				at = e.OutageStartedAt
			}
			e.RecoveredAt = at
		}
		r.Probe.NextAt, r.Probe.Pending = events.Time{}, nil // no probing a provider that is back
		return true
	}
	return changed // degraded: recovering (while Down) or rate-limited
}
