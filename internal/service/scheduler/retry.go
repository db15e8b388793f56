package scheduler

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/jspub"
	"github.com/failbus/failbus/internal/tracing"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// handleClassified is the handler of the `scheduler` consumer: the
// engine's fault-scope stage through the provider's lane (lanes.go), its
// records published, then its retry stage and the retry's schedule and
// decision (see the package doc).
func (s *Service) handleClassified(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
	c, err := consumer.ValueAs[*events.Classification](m) // decoded once, by BudgetLane
	if err != nil {
		return consumer.DeadLetter("decode classification: " + err.Error())
	}
	if c.Agent == "" || c.Provider == "" {
		return consumer.DeadLetterf("classification of %s names no agent or provider: no decision can reach anyone", c.OutcomeID)
	}
	now := s.clockAt(s.timeOf(*c, m.Timestamp))
	// The provider's lane folds it into the fault scope at once; the
	// input is acknowledged only once the write that stores the fold is
	// (lanes.go).
	if c.Class == events.ClassOK && !s.eng.MayEndEpisode(*c) {
		// A success that ends no retry episode (a step's, or of a
		// provider without a retry policy) only feeds the fault scope.
		r := s.lanes.hand(*c, now, false)
		out.After(func(ctx context.Context) error {
			if err := r.waitStored(ctx); err != nil {
				return err
			}
			s.observed(c.Provider, r.final)
			return nil
		})
		return nil
	}
	// A success that may end an episode waits for its write: the
	// episode ends at the scope's clock. A failure waits only when its
	// fold left records to publish (an outage declared, say): an agent
	// told wait_provider can already read the outage on failbus.health.
	r := s.lanes.hand(*c, now, c.Class == events.ClassOK)
	obs, err := r.verdict(ctx)
	if err != nil {
		return err
	}
	out.After(r.waitStored)
	if obs.Verdict.Outage {
		if obs.Verdict.FailoverProvider, err = s.eng.Failover(ctx, c.Provider); err != nil {
			return err
		}
	}
	s.observed(c.Provider, obs)
	switch c.Class {
	case events.ClassOK:
		// A success feeds the fault scope, and ends the open retry
		// episode of an outcome without turn and step: a decision to
		// append nothing when the ledger shows no open episode, so read
		// current (current.go).
		return s.eng.Succeeded(s.current(ctx), *c, obs.Now)
	case events.ClassContentRefusal:
		return nil // the refusal tiers decide refusals
	}
	return s.decide(ctx, m, out, *c, obs)
}

// observed counts an observation of provider in the service's metrics.
func (s *Service) observed(provider string, obs engine.Observed) {
	s.m.outage.WithLabelValues(s.m.providers.Use(provider)).Set(boolGauge(obs.Down))
	if obs.Evicted > 0 {
		s.m.evictions.WithLabelValues("entry").Add(float64(obs.Evicted))
	}
}

// BudgetLane is the runner's Key for classifications: agent, session and
// provider. A session's classifications of one provider are observed and
// decided one at a time, in delivery order, so they reach the provider's
// fault scope in the order simulate reads them (the scope counts each at
// its own `at` whatever the order, but out of order an outage is declared
// only once every failure that satisfies the rule has arrived:
// docs/POLICY.md), and the failures of one retry budget (agent, session,
// turn, step, provider) never race each other on its ledger subject
// (compare-and-set still decides between replicas). Other sessions and
// agents run in parallel, and the provider's lane (lanes.go) folds their
// fault-scope writes together. A classification that does not decode has
// no key (any worker): the handler dead-letters it. The decoded
// classification is left in m.Value for the handler, so it is decoded
// once.
func BudgetLane(m *consumer.Msg) string {
	c, err := consumer.ValueAs[*events.Classification](m)
	if err != nil {
		return ""
	}
	return engine.SessionLane(c.Agent, c.Session, c.Provider)
}

// timeOf is the time a classification is observed and decided at: its
// `at` (the outcome's, as in simulate) where the bus believes it, else when
// the stream stored it (events.EventTime: never later than the stored
// time, so no single outcome moves the clock past the bus's own).
func (s *Service) timeOf(c events.Classification, stored time.Time) time.Time {
	t, _ := events.EventTime(c.At, stored)
	return t
}

// clockAt advances the replica's clock to t and returns it: the latest
// time the replica has seen, as simulate's clock is the latest `at` of its
// input. A classification that arrives late (the outcomes of several
// agents interleave) is decided at the clock, as simulate handles a late
// line, so a retry is never due in its past; the fault scope counts it at
// its own `at` on its provider's own clock (scope.ProviderState.Observe),
// the replica's clock only bounding that from above.
func (s *Service) clockAt(t time.Time) time.Time {
	s.clockMu.Lock()
	defer s.clockMu.Unlock()
	if t.After(s.clock) {
		s.clock = t
	}
	return s.clock
}

// decide runs the engine's retry stage and carries out its verdict
// durably: the ledger entry is stored by the stage, then the schedule,
// then the decision. A decision without a retry (wait, switch, give up)
// is the handler's output: the runner stores it without the worker
// waiting for the stream's acknowledgement, and acknowledges the
// classification only once it is stored.
func (s *Service) decide(ctx context.Context, m *consumer.Msg, out *consumer.Outputs, c events.Classification, obs engine.Observed) error {
	gctx, g := withGuess(ctx)
	v, err := s.eng.Decide(gctx, c, obs.Verdict, obs.Now)
	if err == nil && (v.Record == nil || v.Replayed) && (g.used || s.replicated) {
		// Decided with no append to check it, on the index's word
		// (guess.go) or on reads a replica lagging the leader may have
		// answered (current.go): decide again from the ledger as its
		// leader holds it, and carry that decision out with current
		// reads.
		if g.used {
			s.m.guesses.WithLabelValues("unchecked").Inc()
		}
		ctx = s.current(ctx)
		v, err = s.eng.Decide(ctx, c, obs.Verdict, obs.Now)
	}
	if err != nil {
		return err
	}
	d := v.Decision
	if v.Record == nil {
		// Nats-Msg-Id msgid.Output(Name, m.ID(), "decision").
		out.Publish(events.DecisionSubject(d.Agent), &d, "decision")
		// Counted once stored, and once: not for a decision whose store
		// fails and is made again on the redelivery, nor for a redelivery
		// that finds it stored.
		action := d.Action
		out.OnStored(func(fresh bool) {
			if fresh {
				s.m.decisions.WithLabelValues(action).Inc()
			}
		})
		return nil
	}
	if v.Replayed {
		own, err := s.ledgerFind(ctx, v.Record.Budget().Token(), c.OutcomeID, v.Record.EpisodeFrom)
		if err != nil {
			return err
		}
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
	// Persisted before waiting: the stage stored the ledger entry.
	s.crash(CrashAfterLedger)
	return s.scheduleAndDecide(ctx, &LedgerEntry{Record: *v.Record}, &d)
}

// scheduleAndDecide stores the retry's schedule and its decision with two
// async publishes sent back to back, one round trip for both instead of
// one each. The schedule is sent first; the decision is stored whether or
// not the schedule was (another stream): when the schedule failed, the
// input is redelivered, replayed from its ledger record and the schedule
// restored (restore), under the same ids, so a decision never stands
// without its retry coming due.
func (s *Service) scheduleAndDecide(ctx context.Context, e *LedgerEntry, d *events.Decision) error {
	sched, err := s.scheduleMsg(e)
	if err != nil {
		return err
	}
	dec, err := jspub.NewMsg(events.DecisionSubject(d.Agent), d, retryMsgID(d.RetryID), nil)
	if err != nil {
		return fmt.Errorf("decision of %s: %w", d.OutcomeID, err)
	}
	// The call's trace goes on through the decision and, copied by the
	// server when it fires, the due retry.
	tracing.Inject(ctx, sched.Header)
	tracing.Inject(ctx, dec.Header)
	// The connection's async window is shared with every runner on it:
	// wait for room rather than fail after nats.go's default 200 ms.
	sf, err := s.js.PublishMsgAsync(sched, stallWait)
	if err != nil {
		return fmt.Errorf("publish schedule %s: %w", sched.Subject, err)
	}
	df, err := s.js.PublishMsgAsync(dec, stallWait)
	if err != nil {
		return fmt.Errorf("publish decision %s: %w", dec.Subject, err)
	}
	if err := awaitPub(ctx, sf); err != nil {
		return err
	}
	s.crash(CrashAfterSchedule)
	if err := awaitPub(ctx, df); err != nil {
		return err
	}
	s.m.decisions.WithLabelValues(d.Action).Inc()
	s.crash(CrashAfterDecision)
	return nil
}

// awaitPub waits at most publishTimeout for an async publish to be
// stored.
func awaitPub(ctx context.Context, f jetstream.PubAckFuture) error {
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	return jspub.AwaitPub(ctx, f)
}

// publishTimeout bounds the wait for an async publish's acknowledgement.
const publishTimeout = 10 * time.Second

// stallWait waits up to publishTimeout for room in the async window; made
// once (an option is a closure: one allocation per call).
var stallWait = jetstream.WithStallWait(publishTimeout)

// retryMsgID is the Nats-Msg-Id of a retry decision.
func retryMsgID(retryID string) string { return Name + ":" + retryID + ":decision" }

func (s *Service) publishDecision(ctx context.Context, d *events.Decision, msgID string) error {
	if _, err := s.publish(ctx, events.DecisionSubject(d.Agent), d, msgID, tracing.Header(ctx)); err != nil {
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
