package scheduler

// Durable delayed messages with JetStream's own message scheduler
// (measured with nats-server 2.15.2; docs/ARCHITECTURE.md § 3): one schedule per
// schedule subject, `Nats-Schedule: @at <time>` fires once at that time
// (never before; the server checks on a 250 ms timer), the fired message is
// stored on the target subject with `Nats-Scheduler: <schedule subject>`
// and the schedule message is purged in the same step; a schedule that fell
// due while the server was down fires at once when it is back.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/jspub"
	"github.com/failbus/failbus/internal/streamread"
	"github.com/failbus/failbus/internal/tracing"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Message-scheduling headers (nats-server 2.12+). nats.go's WithScheduleAt
// formats the time without its fraction of a second, so the scheduler sets
// the headers itself.
const (
	// HeaderSchedule holds "@at <RFC3339Nano>": fire once at that time.
	HeaderSchedule = "Nats-Schedule"
	// HeaderScheduleTarget is the subject (in the same stream) the fired
	// message is stored on: failbus.retry.due.<agent>.
	HeaderScheduleTarget = "Nats-Schedule-Target"
	// HeaderScheduler is set by the server on a fired message: the
	// schedule subject it came from.
	HeaderScheduler = "Nats-Scheduler"
	// HeaderTTL is the per-message TTL; "never" exempts the schedule from
	// the stream's MaxAge, which would otherwise remove a schedule older
	// than MaxAge before it fires. The fired message does not inherit it.
	HeaderTTL = "Nats-TTL"
)

// ScheduleHeader is the Nats-Schedule value that fires once at t, with full
// (nanosecond) precision.
func ScheduleHeader(t time.Time) string { return "@at " + t.UTC().Format(time.RFC3339Nano) }

// SetSchedule makes a message stored with h a schedule that fires once at
// at onto target (a subject of the same stream), and that the stream's
// MaxAge never removes before it fires: the headers of every retry's
// schedule (and of the bench's raw `@at` baselines, so both are alike).
func SetSchedule(h nats.Header, at time.Time, target string) {
	h.Set(HeaderSchedule, ScheduleHeader(at))
	h.Set(HeaderScheduleTarget, target)
	h.Set(HeaderTTL, "never")
}

// schedule publishes the due message of e on its schedule subject. A
// re-publish within the duplicate window is dropped by its Nats-Msg-Id.
func (s *Service) schedule(ctx context.Context, e *LedgerEntry) error {
	m, err := s.scheduleMsg(e)
	if err != nil {
		return err
	}
	tracing.Inject(ctx, m.Header)
	if _, err := s.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("publish schedule %s: %w", m.Subject, err)
	}
	return nil
}

// scheduleMsg is the schedule message of e: its due message on its
// schedule subject with the scheduling headers and Nats-Msg-Id
// "scheduler:<retry id>:schedule".
func (s *Service) scheduleMsg(e *LedgerEntry) (*nats.Msg, error) {
	due := e.Due()
	extra := nats.Header{}
	SetSchedule(extra, e.DueAt.Time, events.RetryDueSubject(e.Agent))
	m, err := jspub.NewMsg(events.RetryScheduleSubject(e.Agent, e.RetryID), &due, Name+":"+e.RetryID+":schedule", extra)
	if err != nil {
		return nil, fmt.Errorf("schedule of %s: %w", e.RetryID, err)
	}
	return m, nil
}

// schedulePending reports whether e's schedule is stored and has not fired.
func (s *Service) schedulePending(ctx context.Context, e *LedgerEntry) (bool, error) {
	subj := events.RetryScheduleSubject(e.Agent, e.RetryID)
	_, err := s.retriesMsg(ctx, streamread.MsgQuery{LastFor: subj})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("read schedule %s: %w", subj, err)
	}
	return true, nil
}

// fired reports whether e's schedule has fired: a message on the agent's
// due subject, stored since e was written, carries Nats-Scheduler with e's
// schedule subject. It reads headers only, with an ordered consumer; a
// current read of a replicated stream (current.go) reads the due messages
// one by one from the stream's leader instead (firedOnLeader), since an
// ordered consumer may be placed on a replica that has not stored the
// fired message yet, and "not fired" would schedule the retry again.
func (s *Service) fired(ctx context.Context, e *LedgerEntry) (bool, error) {
	sched := events.RetryScheduleSubject(e.Agent, e.RetryID)
	start := e.At.Add(-time.Second)
	if s.replicated && isCurrent(ctx) {
		return s.firedOnLeader(ctx, events.RetryDueSubject(e.Agent), sched, start)
	}
	err := readStream(ctx, s.js, topology.StreamRetries, events.RetryDueSubject(e.Agent), &start, true, func(m jetstream.Msg) error {
		if m.Headers().Get(HeaderScheduler) == sched {
			return errFound
		}
		return nil
	})
	switch {
	case errors.Is(err, errFound):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("look for fired %s: %w", sched, err)
	}
	return false, nil
}

// firedOnLeader is fired on a replicated stream: the due messages stored
// since start, read from the leader one at a time.
func (s *Service) firedOnLeader(ctx context.Context, due, sched string, start time.Time) (bool, error) {
	q := streamread.MsgQuery{NextFor: due, StartTime: &start}
	for {
		m, err := s.retriesMsg(ctx, q)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("look for fired %s: %w", sched, err)
		case m.Header.Get(HeaderScheduler) == sched:
			return true, nil
		}
		q = streamread.MsgQuery{Seq: m.Sequence + 1, NextFor: due}
	}
}

// errFound stops a stream read early.
var errFound = errors.New("found")

// purge removes a pending schedule, so it never fires.
func (s *Service) purge(ctx context.Context, agent, retryID string) error {
	subj := events.RetryScheduleSubject(agent, retryID)
	if err := s.retries.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		return fmt.Errorf("purge schedule %s: %w", subj, err)
	}
	return nil
}

// restore makes sure the retry of a replayed entry comes due exactly once:
// nothing to do when it was cancelled or started, or when its schedule is
// pending or has fired; otherwise (the previous delivery stopped between
// the ledger and the schedule) it is scheduled now, at its recorded due
// time. A cancel that raced the restore is honoured by purging again.
func (s *Service) restore(ctx context.Context, r *ledgerRead) error {
	e := &r.entry
	if e.Cancelled() || e.Started() {
		return nil
	}
	if ok, err := s.schedulePending(ctx, e); err != nil || ok {
		return err
	}
	if ok, err := s.fired(ctx, e); err != nil || ok {
		return err
	}
	if err := s.schedule(ctx, e); err != nil {
		return err
	}
	s.m.restored.Inc()
	s.log.Info().Str("retry_id", e.RetryID).Str("due_at", e.DueAt.Format(events.JSONTimeLayout)).Msg("schedule restored from the ledger")
	last, err := s.ledgerLast(ctx, e.Budget().Token())
	if err != nil {
		return err
	}
	if last != nil && last.entry.RetryID == e.RetryID && last.entry.Cancelled() {
		return s.purge(ctx, e.Agent, e.RetryID)
	}
	return nil
}
