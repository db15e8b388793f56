package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
	"github.com/failbus/failbus/pkg/policy/retry"
	"github.com/failbus/failbus/pkg/policy/scope"
)

// handleClassified is the handler of the `scheduler` consumer: fault scope,
// then the retry decision chain (see the package doc).
func (s *Scheduler) handleClassified(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
	c, err := events.DecodeAs[*events.Classification](m.Subject, m.Header, m.Data)
	if err != nil {
		return consumer.DeadLetter("decode classification: " + err.Error())
	}
	if c.Agent == "" || c.Provider == "" {
		return consumer.DeadLetterf("classification of %s names no agent or provider: no decision can reach anyone", c.OutcomeID)
	}
	pol := s.Policy()
	obs := s.scope.observe(pol.Scope, *c, m.Timestamp)
	s.m.outage.WithLabelValues(s.m.providers.Use(c.Provider)).Set(boolGauge(s.scope.down(c.Provider)))

	// Health changes and notification requests first: an agent told to
	// wait_provider can already read the outage on failbus.health.
	for i := range obs.Health {
		h := obs.Health[i]
		if _, err := s.publish(ctx, events.HealthSubject(h.Provider), &h, consumer.OutputMsgID(Service, m.ID(), "health-"+strconv.Itoa(i)), nil); err != nil {
			return err
		}
	}
	for i := range obs.Notify {
		n := obs.Notify[i]
		if _, err := s.publish(ctx, events.NotifySubject(n.Severity), &n, consumer.OutputMsgID(Service, m.ID(), "notify-"+strconv.Itoa(i)), nil); err != nil {
			return err
		}
	}
	switch c.Class {
	case events.ClassOK:
		return nil // successes feed the fault scope only
	case events.ClassContentRefusal:
		return nil // the refusal tiers decide refusals
	}
	return s.decide(ctx, m, *c, obs.Verdict, pol)
}

// decide runs retry.Decide against the budget's ledger and carries
// out its verdict durably: ledger, schedule, decision.
func (s *Scheduler) decide(ctx context.Context, m *consumer.Msg, c events.Classification, verdict scope.Verdict, pol *policy.Policy) error {
	rp := pol.RetryFor(c.Provider)
	for range maxLedgerAttempts {
		var (
			last  *ledgerRead
			own   *ledgerRead // this outcome's own record, when it has one
			prior *retry.Record
			sv    = verdict
		)
		if rp != nil {
			token := retry.BudgetFor(c, rp).Token()
			var err error
			if last, err = s.ledgerLast(ctx, token); err != nil {
				return err
			}
			switch {
			case last == nil:
			case last.entry.OutcomeID == c.OutcomeID:
				own = last
			default:
				// A later outcome of the budget may have been decided
				// while this one waited for redelivery: look it up.
				if own, err = s.ledgerFind(ctx, token, c.OutcomeID); err != nil {
					return err
				}
			}
			switch {
			case own != nil:
				// Persisted before: the retry stands whatever the scope
				// says now; retry.Decide rebuilds it from the record.
				prior, sv = &own.entry.Record, scope.Verdict{}
			case last != nil:
				prior = &last.entry.Record
			}
		}
		v := retry.Decide(retry.Input{
			Classification: c,
			Policy:         rp,
			Scope:          sv,
			Prior:          prior,
			Now:            s.now(),
			U:              s.random(),
		})
		d := v.Decision
		if v.Record == nil {
			return s.publishDecision(ctx, &d, consumer.OutputMsgID(Service, m.ID(), "decision"))
		}
		if v.Replayed {
			if own == nil || own.entry.RetryID != v.Record.RetryID {
				return fmt.Errorf("ledger: replay of %s without its own record", c.OutcomeID)
			}
			s.m.replays.Inc()
			if err := s.restore(ctx, own); err != nil {
				return err
			}
			if err := s.publishDecision(ctx, &d, retryMsgID(d.RetryID)); err != nil {
				return err
			}
			s.crash(CrashAfterDecision)
			return nil
		}

		// Persist before waiting: the ledger first.
		entry := &LedgerEntry{Record: *v.Record}
		var expect uint64
		if last != nil {
			expect = last.seq
		}
		_, err := s.ledgerAppend(ctx, entry, expect, "ledger")
		if errors.Is(err, errLedgerConflict) {
			s.m.conflicts.Inc()
			continue
		}
		if err != nil {
			return err
		}
		s.crash(CrashAfterLedger)
		if err := s.schedule(ctx, entry); err != nil {
			return err
		}
		s.crash(CrashAfterSchedule)
		if err := s.publishDecision(ctx, &d, retryMsgID(d.RetryID)); err != nil {
			return err
		}
		s.crash(CrashAfterDecision)
		return nil
	}
	return fmt.Errorf("ledger of %s: %d conflicting writes in a row; redelivering", c.OutcomeID, maxLedgerAttempts)
}

// retryMsgID is the Nats-Msg-Id of a retry decision.
func retryMsgID(retryID string) string { return Service + ":" + retryID + ":decision" }

func (s *Scheduler) publishDecision(ctx context.Context, d *events.Decision, msgID string) error {
	if _, err := s.publish(ctx, events.DecisionSubject(d.Agent), d, msgID, nil); err != nil {
		return err
	}
	s.m.decisions.WithLabelValues(d.Action).Inc()
	return nil
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
