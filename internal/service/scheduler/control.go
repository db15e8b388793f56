package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/retrymark"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// Control kinds, as the metrics label them.
const (
	controlCancel  = "cancel"
	controlStarted = "started"
)

// handleControl is the handler of the `scheduler-control` consumer: an
// agent's started or cancel record (retrymark.Mark) marks the budget's
// latest retry in the ledger, and a cancel purges its schedule.
func (s *Service) handleControl(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
	var kind string
	switch {
	case strings.HasPrefix(m.Subject, events.RetryPrefix+".cancel."):
		kind = controlCancel
	case strings.HasPrefix(m.Subject, events.RetryPrefix+".started."):
		kind = controlStarted
	default:
		return consumer.DeadLetterf("subject %s is neither a started nor a cancel record", m.Subject)
	}
	mark, err := decodeMark(m)
	if err != nil {
		return consumer.DeadLetter(err.Error())
	}
	token, _, ok := retry.SplitID(mark.RetryID)
	if !ok {
		return consumer.DeadLetterf("retry_id %q is not a retry id failbus issued", mark.RetryID)
	}
	at := mark.At
	if at.IsZero() {
		at = events.At(s.now())
	}
	// "Not the budget's latest retry" appends nothing: read current.
	result, err := s.mark(s.current(ctx), kind, mark, token, at)
	if err != nil {
		return err
	}
	s.m.controls.WithLabelValues(kind, result).Inc()
	return nil
}

// mark applies one started or cancel record; it returns "marked" or
// "ignored".
func (s *Service) mark(ctx context.Context, kind string, mark retrymark.Mark, token string, at events.Time) (string, error) {
	for range maxLedgerAttempts {
		last, err := s.ledgerLast(ctx, token)
		if err != nil {
			return "", err
		}
		if last == nil || last.entry.RetryID != mark.RetryID || last.entry.Agent != mark.Agent {
			// Not the budget's latest retry (an older one, already
			// superseded, or one this agent does not own): nothing to
			// mark. A cancel still makes sure no schedule of that id is
			// left under the agent's own subject.
			if kind == controlCancel {
				if err := s.purge(ctx, mark.Agent, mark.RetryID); err != nil {
					return "", err
				}
			}
			return "ignored", nil
		}
		e := last.entry
		if e.Cancelled() || e.Started() {
			// The first answer wins: a started after a cancel is ignored,
			// and so is a cancel after a start.
			if kind == controlCancel && e.Cancelled() {
				if err := s.purge(ctx, e.Agent, e.RetryID); err != nil {
					return "", err
				}
			}
			return "ignored", nil
		}
		if kind == controlCancel {
			e.CancelledAt = at
		} else {
			e.StartedAt = at
		}
		_, _, err = s.ledgerAppend(ctx, &e, last.seq, kind)
		if errors.Is(err, errLedgerConflict) {
			s.m.conflicts.Inc()
			continue
		}
		if err != nil {
			return "", err
		}
		if kind == controlCancel {
			s.crash(CrashAfterCancelMark)
			if err := s.purge(ctx, e.Agent, e.RetryID); err != nil {
				return "", err
			}
		}
		return "marked", nil
	}
	return "", fmt.Errorf("ledger of %s: %d conflicting writes in a row; redelivering", mark.RetryID, maxLedgerAttempts)
}

// decodeMark reads an agent's started or cancel record.
func decodeMark(m *consumer.Msg) (retrymark.Mark, error) {
	return retrymark.Decode(m.Subject, m.Header, m.Data)
}
