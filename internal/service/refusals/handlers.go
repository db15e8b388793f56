package refusals

import (
	"context"
	"strconv"

	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy/refusal"
)

// Output keys of a refusal's outputs (consumer.OutputMsgID), fixed so a
// redelivery republishes under the same ids.
const (
	outputDecision = "decision"
	outputNotify   = "notify"
)

// handleRefusal applies one content_refusal classification: compare-and-set
// the (segment, provider) record, then publish the decision and, at the
// first refusal and at freezing only, the notification request.
func (s *Server) handleRefusal(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
	c, err := events.DecodeAs[*events.Classification](m.Subject, m.Header, m.Data)
	if err != nil {
		return consumer.DeadLetter("decode classification: " + err.Error())
	}
	if c.Class != events.ClassContentRefusal {
		return nil // the consumer's filter should make this impossible; not ours
	}
	if c.Provider == "" || c.Agent == "" {
		return consumer.DeadLetter("content_refusal without provider or agent: nothing to key the refusal state by or to tell")
	}
	store := s.Store()
	// A refusal is dated by its outcome's `at`, so neither a redelivery
	// nor a slow pipeline moves the re-probe schedule.
	at := c.At.Time
	if at.IsZero() {
		at = m.Timestamp
	}
	segment := events.SegmentKey(c.Session, c.Segment)
	key := Key(segment, c.Provider)
	increment := refusal.Increment(c.Turn, c.Step)

	var (
		ev     refusal.Event
		peers  []string
		replay bool
	)
	conflicts, err := store.Update(ctx, key, func(ctx context.Context, cur Entry, found bool) (refusal.Record, bool, error) {
		if cur.DecodeErr != nil {
			s.m.unreadable.Inc()
			s.log.Warn().Err(cur.DecodeErr).Str("key", key).Msg("unreadable refusal state: read conservatively")
		}
		if a, ok := cur.Record.AppliedRefusal(c.OutcomeID); ok {
			ev, peers, replay = a.Event, a.Peers, true
			return refusal.Record{}, false, nil
		}
		rec := cur.Record
		if !found {
			rec = refusal.Record{State: refusal.State{Segment: segment, Provider: c.Provider}}
		}
		if rec.State.Segment == "" || rec.State.Provider == "" {
			rec.State.Segment, rec.State.Provider = segment, c.Provider
		}
		rec, ev = rec.Refused(c.Agent, c.RefusalScope, increment, at, s.cfg)
		peers = nil
		if ev.Notify {
			states, err := store.SegmentStates(ctx, segment)
			if err != nil {
				return refusal.Record{}, false, err
			}
			peers = refusal.Peers(s.cfg, ev, append(states, rec.State))
		}
		return rec.Remember(c.OutcomeID, ev, peers), true, nil
	})
	if conflicts > 0 {
		s.m.conflicts.WithLabelValues("refusal").Add(float64(conflicts))
	}
	if err != nil {
		return err // retried with backoff; nothing half-written
	}
	if replay {
		s.m.replays.Inc()
	} else {
		s.m.refusals.WithLabelValues(ev.Action, strconv.FormatBool(ev.Frozen)).Inc()
	}

	t := refusal.Notice(s.cfg, ev, peers)
	d := refusal.Decision(*c, ev, t, at)
	out.Publish(events.DecisionSubject(c.Agent), &d, outputDecision)
	if ev.Notify {
		n := t.Notification(ev, at)
		out.Publish(events.NotifySubject(n.Severity), &n, outputNotify)
		s.m.notifications.WithLabelValues(n.Severity).Inc()
	}
	s.log.Debug().Str("key", key).Str("outcome_id", c.OutcomeID).Str("action", ev.Action).
		Int("refusals", ev.Refusals).Bool("frozen", ev.Frozen).Bool("notify", ev.Notify).
		Bool("replay", replay).Int("conflicts", conflicts).Msg("refusal applied")
	return nil
}

// handleBoundary retires the refusal state of the session's segments before
// the boundary's new segment. Deleting is idempotent, so a redelivery does
// nothing new.
func (s *Server) handleBoundary(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
	b, err := events.DecodeAs[*events.Boundary](m.Subject, m.Header, m.Data)
	if err != nil {
		return consumer.DeadLetter("decode boundary: " + err.Error())
	}
	retired, err := s.Store().RetireBefore(ctx, b.Session, b.Segment)
	s.m.retired.Add(float64(len(retired)))
	if err != nil {
		return err
	}
	if len(retired) > 0 {
		s.log.Info().Str("session", b.Session).Int("segment", b.Segment).Str("agent", b.Agent).
			Str("reason", b.Reason).Strs("retired", retired).Msg("boundary retired refusal state")
	}
	return nil
}
