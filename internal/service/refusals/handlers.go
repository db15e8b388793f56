package refusals

import (
	"context"
	"strconv"

	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// Output keys of a refusal's outputs (msgid.Output), fixed so a
// redelivery republishes under the same ids.
const (
	outputDecision = "decision"
	outputNotify   = "notify"
)

// handleRefusal applies one content_refusal classification with the
// engine's refusal stage (compare-and-set on the (segment, provider)
// record), then publishes the decision and, at the first refusal and at
// freezing only, the notification request.
// segmentLane is the refusal runner's Key: the refusal state's key, the
// segment and the provider, so one replica handles a segment's refusals of
// a provider one after the other in delivery order (compare-and-set still
// decides between replicas) and different segments in parallel. A
// classification that does not decode goes to any lane: the handler
// dead-letters it. The decoded classification stays in m.Value for the
// handler (consumer.ValueAs).
func segmentLane(m *consumer.Msg) string {
	c, err := consumer.ValueAs[*events.Classification](m)
	if err != nil {
		return ""
	}
	return events.SegmentKey(c.Session, c.Segment) + "\x00" + c.Provider
}

func (s *Service) handleRefusal(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
	c, err := consumer.ValueAs[*events.Classification](m) // decoded once, by segmentLane
	if err != nil {
		return consumer.DeadLetter("decode classification: " + err.Error())
	}
	if c.Class != events.ClassContentRefusal {
		return nil // the consumer's filter should make this impossible; not ours
	}
	if c.Provider == "" || c.Agent == "" {
		return consumer.DeadLetter("content_refusal without provider or agent: nothing to key the refusal state by or to tell")
	}
	// A refusal is dated by its outcome's `at`, so neither a redelivery
	// nor a slow pipeline moves the re-probe schedule.
	at := c.At.Time
	if at.IsZero() {
		at = m.Timestamp
	}
	r, err := s.eng.Refuse(ctx, *c, at)
	if err != nil {
		return err // retried with backoff; nothing half-written
	}
	ev := r.Event
	if r.Replayed {
		s.m.replays.Inc()
	} else {
		s.m.refusals.WithLabelValues(ev.Action, strconv.FormatBool(ev.Frozen)).Inc()
	}
	out.Publish(events.DecisionSubject(c.Agent), &r.Decision, outputDecision)
	if n := r.Notification; n != nil {
		out.Publish(events.NotifySubject(n.Severity), n, outputNotify)
		s.m.notifications.WithLabelValues(n.Severity).Inc()
	}
	s.log.Debug().Str("segment", events.SegmentKey(c.Session, c.Segment)).Str("provider", c.Provider).
		Str("outcome_id", c.OutcomeID).Str("action", ev.Action).
		Int("refusals", ev.Refusals).Bool("frozen", ev.Frozen).Bool("notify", ev.Notify).
		Bool("replay", r.Replayed).Msg("refusal applied")
	return nil
}

// handleBoundary retires the refusal state of the session's segments before
// the boundary's new segment (the engine's boundary stage). Deleting is
// idempotent, so a redelivery does nothing new.
func (s *Service) handleBoundary(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
	b, err := events.DecodeAs[*events.Boundary](m.Subject, m.Header, m.Data)
	if err != nil {
		return consumer.DeadLetter("decode boundary: " + err.Error())
	}
	retired, err := s.eng.Boundary(ctx, *b, b.At.Time)
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
