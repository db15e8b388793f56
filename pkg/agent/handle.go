package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// HandleDecisions runs fn for each decision the bus makes for this agent,
// one at a time and in order, until ctx ends (then it returns nil), the
// connection closes or the consumer cannot be opened (an error). Unlike Decisions, whose channel counts a
// decision as delivered when it is received, a decision read here is
// acknowledged only after fn returned: in durable mode (WithDurable) a
// process that dies while fn runs gets the same decision again when it
// restarts, as CONTRACT.md asks of an agent ("acknowledge a message once it
// has been acted on"). fn's error goes to the error handler; the decision
// counts as acted on and is not redelivered. While fn runs the server is
// told the message is in progress, so a slow fn is not handed it twice.
func (a *Agent) HandleDecisions(ctx context.Context, fn func(context.Context, events.Decision) error) error {
	return handle(ctx, a, topology.StreamDecisions, events.DecisionSubject(a.name), "decisions", decodeValue[events.Decision], fn)
}

// HandleDueRetries is HandleDecisions for the retries that came due
// (failbus.retry.due.<agent>): a due retry is acknowledged once fn, which
// calls Started (or Cancel) and makes the call, returned.
func (a *Agent) HandleDueRetries(ctx context.Context, fn func(context.Context, events.RetryDue) error) error {
	return handle(ctx, a, topology.StreamRetries, events.RetryDueSubject(a.name), "retries", decodeValue[events.RetryDue], fn)
}

// HandleDispatches is HandleDecisions for the tasks recovery dispatches to
// this agent (failbus.dispatch.<agent>).
func (a *Agent) HandleDispatches(ctx context.Context, fn func(context.Context, events.Dispatch) error) error {
	return handle(ctx, a, topology.StreamDispatch, events.DispatchSubject(a.name), "dispatch", decodeValue[events.Dispatch], fn)
}

// handle reads subject on stream and runs fn for each record before
// acknowledging it (durable mode). A record that does not decode is
// terminated and reported; a requeued dead letter of a service is skipped.
func handle[T any](ctx context.Context, a *Agent, stream, subject, kind string, decode func(jetstream.Msg) (T, error), fn func(context.Context, T) error) error {
	r, err := a.open(ctx, stream, subject, kind)
	if err != nil {
		return err
	}
	defer r.stop(a.js)
	return each(ctx, a, r, decode, func(m jetstream.Msg, v T) bool {
		if err := actOn(ctx, a, r, m, v, fn); err != nil {
			a.opts.onError(fmt.Errorf("agent %s: %s on %s: %w", a.name, kind, m.Subject(), err))
		}
		return true
	})
}

// actOn runs fn, telling the server every third of the ack wait that m is
// still in progress (durable mode), so a long fn is not redelivered.
func actOn[T any](ctx context.Context, a *Agent, r *reader, m jetstream.Msg, v T, fn func(context.Context, T) error) error {
	if !r.ack {
		return fn(ctx, v)
	}
	done := make(chan struct{})
	beat := time.NewTicker(durableAckWait / 3)
	go func() {
		defer beat.Stop()
		for {
			select {
			case <-done:
				return
			case <-beat.C:
				_ = m.InProgress()
			}
		}
	}()
	defer close(done)
	return fn(ctx, v)
}

// decodeValue decodes m as the record its subject carries, *V, and returns
// the value.
func decodeValue[V any, P interface {
	*V
	events.Message
}](m jetstream.Msg) (V, error) {
	p, err := events.DecodeAs[P](m.Subject(), m.Headers(), m.Data())
	if err != nil {
		var zero V
		return zero, err
	}
	return *p, nil
}
