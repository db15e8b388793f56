package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/durable"
	"github.com/failbus/failbus/internal/requeue"
	"github.com/failbus/failbus/internal/retrymark"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Decisions returns the decisions the bus makes for this agent
// (failbus.decision.<agent> on FAILBUS_DECISIONS), in order, from the moment
// New was called (or, with WithDurable, from where this agent name last
// stopped reading). The channel is unbuffered and a decision counts as
// delivered (acknowledged) when it is received from it, so a process that
// dies between receiving and acting loses it: an agent that must act on
// every decision across crashes uses HandleDecisions, which acknowledges
// after acting. The channel closes when ctx ends or the connection closes.
func (a *Agent) Decisions(ctx context.Context) (<-chan events.Decision, error) {
	it, err := a.open(ctx, topology.StreamDecisions, events.DecisionSubject(a.name), "decisions")
	if err != nil {
		return nil, err
	}
	out := make(chan events.Decision)
	go pump(ctx, a, it, out, func(m jetstream.Msg) (events.Decision, error) {
		d, err := events.DecodeAs[*events.Decision](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return events.Decision{}, err
		}
		return *d, nil
	})
	return out, nil
}

// DueRetries returns the retries of this agent that came due
// (failbus.retry.due.<agent> on FAILBUS_RETRIES). JetStream's scheduler
// writes them at their due time, durably: a retry scheduled before a crash
// of every failbus process still arrives. Delivery is as for Decisions.
// After acting on one, call Started (or Cancel when the agent gives up on
// it).
func (a *Agent) DueRetries(ctx context.Context) (<-chan events.RetryDue, error) {
	it, err := a.open(ctx, topology.StreamRetries, events.RetryDueSubject(a.name), "retries")
	if err != nil {
		return nil, err
	}
	out := make(chan events.RetryDue)
	go pump(ctx, a, it, out, func(m jetstream.Msg) (events.RetryDue, error) {
		r, err := events.DecodeAs[*events.RetryDue](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return events.RetryDue{}, err
		}
		return *r, nil
	})
	return out, nil
}

// reader is what pump needs of a consumer: the next message and a way to
// stop. Both ordered and durable consumers give a MessagesContext.
type reader struct {
	msgs jetstream.MessagesContext
	ack  bool
	// ordered is set for an ephemeral ordered consumer, deleted on stop.
	ordered jetstream.Consumer
	stream  string
	kind    string // "decisions", "retries", "dispatch" or "control", for errors
}

// stop ends reading; an ephemeral consumer is deleted at once rather than
// left to expire.
//
// A durable consumer is kept, so the next process of this agent reads on
// from here; stop makes sure nothing is left leased to this reader: it
// hands back (Nak) what the server had already sent but nobody received,
// and waits until the server has processed the unsubscription. Otherwise
// the reader's outstanding pull request stays on the server a little
// longer than the reader, a decision published in that moment is delivered
// into it, and the next reader sees it only after durableAckWait.
func (r *reader) stop(js jetstream.JetStream) {
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	if r.ordered != nil {
		r.msgs.Stop()
		if info := r.ordered.CachedInfo(); info != nil {
			_ = js.DeleteConsumer(ctx, r.stream, info.Name)
		}
		return
	}
	// Drain unsubscribes and waits for the server to confirm it (a
	// round trip) before Next reports the iterator closed; what arrived
	// before that is still returned by Next.
	r.msgs.Drain()
	for {
		m, err := r.msgs.Next(jetstream.NextContext(ctx))
		if err != nil {
			break // ErrMsgIteratorClosed once drained, or the deadline
		}
		_ = m.Nak()
	}
	_ = js.Conn().FlushWithContext(ctx) // the naks reached the server
}

// open starts a consumer on stream filtered on subject.
func (a *Agent) open(ctx context.Context, stream, subject, kind string) (*reader, error) {
	start := a.created
	if !a.opts.durable {
		c, err := a.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{subject},
			DeliverPolicy:  jetstream.DeliverByStartTimePolicy,
			OptStartTime:   &start,
		})
		if err != nil {
			return nil, fmt.Errorf("agent %s: open %s consumer on %s: %w", a.name, kind, stream, err)
		}
		it, err := c.Messages()
		if err != nil {
			return nil, fmt.Errorf("agent %s: read %s: %w", a.name, kind, err)
		}
		return &reader{msgs: it, ordered: c, stream: stream, kind: kind}, nil
	}
	name := durable.Name(a.name, kind)
	c, err := a.js.Consumer(ctx, stream, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		c, err = a.js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{
			Durable:           name,
			Description:       "failbus agent " + a.name + ": " + kind,
			FilterSubject:     subject,
			DeliverPolicy:     jetstream.DeliverByStartTimePolicy,
			OptStartTime:      &start,
			AckPolicy:         jetstream.AckExplicitPolicy,
			AckWait:           durableAckWait,
			MaxAckPending:     1,
			InactiveThreshold: durableInactiveThreshold,
		})
		if errors.Is(err, jetstream.ErrConsumerExists) {
			c, err = a.js.Consumer(ctx, stream, name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("agent %s: open durable consumer %s on %s: %w", a.name, name, stream, err)
	}
	it, err := c.Messages()
	if err != nil {
		return nil, fmt.Errorf("agent %s: read %s: %w", a.name, kind, err)
	}
	return &reader{msgs: it, ack: true, kind: kind}, nil
}

// pump moves decoded messages from r to out until ctx ends or the consumer
// stops, then closes out. A message is acknowledged (durable mode) once out
// accepted it, and the acknowledgement is confirmed before the next message
// is read or out is closed; one that does not decode is terminated and
// reported.
func pump[T any](ctx context.Context, a *Agent, r *reader, out chan<- T, decode func(jetstream.Msg) (T, error)) {
	defer close(out)
	defer r.stop(a.js)
	err := each(ctx, a, r, decode, func(m jetstream.Msg, v T) bool {
		select {
		case out <- v:
			return true
		case <-ctx.Done():
			// Not handed over: a durable consumer redelivers it to the
			// next reader at once.
			if r.ack {
				_ = m.Nak()
			}
			return false
		}
	})
	if err != nil {
		a.opts.onError(err)
	}
}

// each reads r until ctx ends (nil), the iterator closes (nil) or the
// connection closes (an error), and hands every record that decodes to
// deliver; a record deliver took is then acknowledged (durable mode),
// confirmed, even when ctx has just ended. A requeued dead letter of a
// service is skipped, one that does not decode is terminated and reported.
// deliver returns false when it did not take the record: each stops.
func each[T any](ctx context.Context, a *Agent, r *reader, decode func(jetstream.Msg) (T, error), deliver func(jetstream.Msg, T) bool) error {
	for {
		m, err := r.msgs.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if a.js.Conn().IsClosed() || errors.Is(err, jetstream.ErrConnectionClosed) {
				return fmt.Errorf("agent %s: read %s: %w", a.name, r.kind, jetstream.ErrConnectionClosed)
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			a.opts.onError(fmt.Errorf("agent %s: read %s: %w", a.name, r.kind, err))
			continue
		}
		if m.Headers().Get(requeue.HeaderFor) != "" {
			// A dead letter of a failbus service requeued for it (failbus
			// dlq requeue): this agent had the original already.
			if r.ack {
				_ = m.Ack()
			}
			continue
		}
		v, err := decode(m)
		if err != nil {
			a.opts.onError(fmt.Errorf("agent %s: undecodable message on %s: %w", a.name, m.Subject(), err))
			if r.ack {
				_ = m.Term()
			}
			continue
		}
		if !deliver(m, v) {
			return nil
		}
		if r.ack {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
			err := m.DoubleAck(actx)
			cancel()
			if err != nil {
				a.opts.onError(fmt.Errorf("agent %s: ack %s: %w", a.name, m.Subject(), err))
			}
		}
	}
}

// ackTimeout bounds the wait for the server to confirm an acknowledgement.
const ackTimeout = 5 * time.Second

func marshalMark(m retrymark.Mark) ([]byte, error) {
	b, err := msgpack.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return b, nil
}
