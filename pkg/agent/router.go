package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/requeue"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// router hands what the bus sends this agent to the Calls waiting for it:
// a decision to the Call that reported its outcome, a due retry to the
// Call that waits for its retry id, a probe control to one Call holding
// on its provider. It reads with ephemeral ordered consumers of its own
// (so it never splits messages with a durable reader the agent runs
// beside it), started the first time a Call needs it, from that moment.
// What arrives before its waiter registers (a due retry of a zero delay)
// is kept for earlyFor.
type router struct {
	a *Agent
	// startMu guards started: a start that failed (the bus unreachable for
	// a moment) is tried again by the next Call, not remembered.
	startMu sync.Mutex
	started bool

	mu        sync.Mutex
	decisions map[string]chan events.Decision
	dues      map[string]chan events.RetryDue
	probes    map[string][]chan events.Control // provider -> holders, in order
	early     map[string]early
}

// early is a message no waiter had yet.
type early struct {
	decision *events.Decision
	due      *events.RetryDue
	at       time.Time
}

// earlyFor is how long a message nobody waits for yet is kept.
const earlyFor = 2 * time.Minute

// maxEarly bounds the messages kept for a waiter to come (decisions of
// outcomes this process reported outside Call fill it).
const maxEarly = 4096

// start opens the readers once they open; their context is the agent's,
// which ends with the connection.
func (r *router) start(ctx context.Context) error {
	r.startMu.Lock()
	defer r.startMu.Unlock()
	if r.started {
		return nil
	}
	var opened []jetstream.MessagesContext
	err := func() error {
		r.mu.Lock()
		r.decisions = map[string]chan events.Decision{}
		r.dues = map[string]chan events.RetryDue{}
		r.probes = map[string][]chan events.Control{}
		r.early = map[string]early{}
		r.mu.Unlock()
		from := r.a.opts.now()
		for _, rd := range []struct {
			stream, subject, kind string
			deliver               func(jetstream.Msg) error
		}{
			{topology.StreamDecisions, events.DecisionSubject(r.a.name), "call decisions", r.decision},
			{topology.StreamRetries, events.RetryDueSubject(r.a.name), "call retries", r.due},
			{topology.StreamControl, events.ControlSubject(r.a.name), "call controls", r.control},
		} {
			it, err := r.a.js.OrderedConsumer(ctx, rd.stream, jetstream.OrderedConsumerConfig{
				FilterSubjects: []string{rd.subject}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &from,
			})
			if err != nil {
				return fmt.Errorf("agent %s: open %s on %s: %w", r.a.name, rd.kind, rd.stream, err)
			}
			msgs, err := it.Messages()
			if err != nil {
				return fmt.Errorf("agent %s: read %s: %w", r.a.name, rd.kind, err)
			}
			opened = append(opened, msgs)
			go r.read(context.Background(), msgs, rd.kind, rd.deliver)
		}
		return nil
	}()
	if err != nil {
		for _, m := range opened {
			m.Stop()
		}
		return err
	}
	r.started = true
	return nil
}

// read hands each message to deliver until the connection closes.
func (r *router) read(ctx context.Context, msgs jetstream.MessagesContext, kind string, deliver func(jetstream.Msg) error) {
	defer msgs.Stop()
	for {
		m, err := msgs.Next(jetstream.NextContext(ctx))
		if err != nil {
			if r.a.js.Conn().IsClosed() || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return
			}
			r.a.opts.onError(fmt.Errorf("agent %s: read %s: %w", r.a.name, kind, err))
			continue
		}
		if m.Headers().Get(requeue.HeaderFor) != "" {
			continue // a service's requeued dead letter: not for agents
		}
		if err := deliver(m); err != nil {
			r.a.opts.onError(fmt.Errorf("agent %s: %s on %s: %w", r.a.name, kind, m.Subject(), err))
		}
	}
}

func (r *router) decision(m jetstream.Msg) error {
	d, err := events.DecodeAs[*events.Decision](m.Subject(), m.Headers(), m.Data())
	if err != nil {
		return err
	}
	r.a.received(m)
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.decisions[d.OutcomeID]; ok {
		delete(r.decisions, d.OutcomeID)
		ch <- *d
		return nil
	}
	r.keep("d:"+d.OutcomeID, early{decision: d})
	return nil
}

func (r *router) due(m jetstream.Msg) error {
	d, err := events.DecodeAs[*events.RetryDue](m.Subject(), m.Headers(), m.Data())
	if err != nil {
		return err
	}
	r.a.received(m)
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch, ok := r.dues[d.RetryID]; ok {
		delete(r.dues, d.RetryID)
		ch <- *d
		return nil
	}
	r.keep("r:"+d.RetryID, early{due: d})
	return nil
}

// control hands a probe control to the first Call holding on its
// provider; other controls are the agent's own business (HandleControls).
func (r *router) control(m jetstream.Msg) error {
	c, err := events.DecodeAs[*events.Control](m.Subject(), m.Headers(), m.Data())
	if err != nil {
		return err
	}
	if c.Action != events.ControlProbe {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range r.probes[c.Provider] {
		select {
		case ch <- *c:
			return nil
		default: // that holder is probing already
		}
	}
	return nil
}

// keep stores a message nobody waits for yet; call with mu held.
func (r *router) keep(key string, e early) {
	now := time.Now()
	if len(r.early) >= maxEarly {
		for k, v := range r.early {
			if now.Sub(v.at) > earlyFor || len(r.early) >= maxEarly {
				delete(r.early, k)
			}
		}
	}
	e.at = now
	r.early[key] = e
}

// awaitDecision registers for the decision on outcome id; register before
// reporting the outcome.
func (r *router) awaitDecision(id string) <-chan events.Decision {
	ch := make(chan events.Decision, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.early["d:"+id]; ok {
		delete(r.early, "d:"+id)
		ch <- *e.decision
		return ch
	}
	r.decisions[id] = ch
	return ch
}

// awaitDue registers for the due retry retryID.
func (r *router) awaitDue(retryID string) <-chan events.RetryDue {
	ch := make(chan events.RetryDue, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.early["r:"+retryID]; ok {
		delete(r.early, "r:"+retryID)
		ch <- *e.due
		return ch
	}
	r.dues[retryID] = ch
	return ch
}

// forget drops the waiters of a Call that stopped waiting.
func (r *router) forget(outcomeID, retryID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.decisions, outcomeID)
	delete(r.dues, retryID)
}

// hold registers a holder of provider for probe controls; the returned
// func unregisters it.
func (r *router) hold(provider string) (<-chan events.Control, func()) {
	ch := make(chan events.Control, 1)
	r.mu.Lock()
	r.probes[provider] = append(r.probes[provider], ch)
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		hs := r.probes[provider]
		for i, h := range hs {
			if h == ch {
				r.probes[provider] = append(hs[:i:i], hs[i+1:]...)
				break
			}
		}
		if len(r.probes[provider]) == 0 {
			delete(r.probes, provider)
		}
	}
}

// inOutage reports whether provider's latest health record on the bus
// says outage (read with a short-lived ordered consumer of its own: the
// server's latest, not a copy that may lag a decision).
func (r *router) inOutage(ctx context.Context, provider string) (bool, error) {
	c, err := r.a.js.OrderedConsumer(ctx, topology.StreamHealth, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.HealthSubject(provider)}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return false, fmt.Errorf("agent %s: read the health of %s: %w", r.a.name, provider, err)
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
			defer cancel()
			_ = r.a.js.DeleteConsumer(dctx, topology.StreamHealth, info.Name)
		}
	}()
	if c.CachedInfo() != nil && c.CachedInfo().NumPending == 0 {
		return false, nil // no health record: never in an outage
	}
	batch, err := c.Fetch(1, jetstream.FetchMaxWait(ackTimeout))
	if err != nil {
		return false, fmt.Errorf("agent %s: read the health of %s: %w", r.a.name, provider, err)
	}
	m, ok := <-batch.Messages()
	if !ok {
		return false, batch.Error()
	}
	h, err := events.DecodeAs[*events.Health](m.Subject(), m.Headers(), m.Data())
	if err != nil {
		return false, nil // an undecodable record says nothing of an outage
	}
	return h.State == events.HealthOutage, nil
}

// waitHealthy returns once provider's health on the bus says recovered or
// healthy: its latest record first (a recovery that came before the hold),
// then each new one. It reads FAILBUS_HEALTH with an ordered consumer of
// its own.
func (r *router) waitHealthy(ctx context.Context, provider string) (events.Health, error) {
	c, err := r.a.js.OrderedConsumer(ctx, topology.StreamHealth, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.HealthSubject(provider)}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return events.Health{}, fmt.Errorf("agent %s: read the health of %s: %w", r.a.name, provider, err)
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
			defer cancel()
			_ = r.a.js.DeleteConsumer(dctx, topology.StreamHealth, info.Name)
		}
	}()
	msgs, err := c.Messages()
	if err != nil {
		return events.Health{}, fmt.Errorf("agent %s: read the health of %s: %w", r.a.name, provider, err)
	}
	defer msgs.Stop()
	for {
		m, err := msgs.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return events.Health{}, ctx.Err()
			}
			return events.Health{}, fmt.Errorf("agent %s: read the health of %s: %w", r.a.name, provider, err)
		}
		h, err := events.DecodeAs[*events.Health](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			r.a.opts.onError(fmt.Errorf("agent %s: health of %s: %w", r.a.name, provider, err))
			continue
		}
		if h.State == events.HealthRecovered || h.State == events.HealthHealthy {
			return *h, nil
		}
	}
}
