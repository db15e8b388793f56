package scheduler

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/pkg/events"
)

// One lane per provider: the handlers of one replica observe a provider's
// classifications through its lane, so they never race each other for the
// provider's key in FAILBUS_SCOPE. While one write of the record is in
// flight, the classifications of that provider that arrive wait; the next
// write takes them all (engine.ObserveBatch: one compare-and-set for the
// batch), publishes the batch's health records and notification requests
// and settles them, and only then are the waiting handlers answered, so a
// decision never goes out before the health record it depends on. A hot
// provider then costs one round trip per batch instead of a storm of
// conflicting writes; replicas still meet on the key, and compare-and-set
// decides between them.
//
// The handler that finds its lane free leads: it writes the batch in its
// own goroutine (a crash hook or a panic there stops that handler, as it
// would without lanes) and hands the lane to the first handler waiting
// when it is done.

// maxLaneBatch bounds one write's batch.
const maxLaneBatch = 512

// laneTimeout bounds one batch's JetStream work; the handlers of the batch
// wait for it whatever their own context says, so it must stay short.
const laneTimeout = 30 * time.Second

// errLaneAborted answers the handlers of a batch whose leader stopped
// half way (a panic): their classifications are redelivered and observed
// again (observing is idempotent).
var errLaneAborted = errors.New("scheduler: the fault-scope write of this classification's batch was interrupted")

type lanes struct {
	s  *Service
	mu sync.Mutex
	m  map[string]*lane
}

type lane struct {
	queue []*laneReq
	busy  bool
}

type laneReq struct {
	c    events.Classification
	now  time.Time
	lead chan struct{} // closed: this handler writes the next batch
	done chan struct{} // closed: obs and err are set
	obs  engine.Observed
	err  error
}

// observe folds c at now into its provider's fault scope through the
// provider's lane and returns the observation once its records are
// published.
func (l *lanes) observe(c events.Classification, now time.Time) (engine.Observed, error) {
	r := &laneReq{c: c, now: now, lead: make(chan struct{}), done: make(chan struct{})}
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*lane{}
	}
	ln := l.m[c.Provider]
	if ln == nil {
		ln = &lane{}
		l.m[c.Provider] = ln
	}
	ln.queue = append(ln.queue, r)
	if !ln.busy {
		ln.busy = true
		close(r.lead)
	}
	l.mu.Unlock()
	select {
	case <-r.done:
	case <-r.lead:
		l.write(c.Provider, ln)
		<-r.done
	}
	return r.obs, r.err
}

// write observes a batch of the lane's queue (r's included) in one write,
// publishes its records, settles them, answers the batch, and hands the
// lane on.
func (l *lanes) write(provider string, ln *lane) {
	l.mu.Lock()
	n := min(len(ln.queue), maxLaneBatch)
	batch := ln.queue[:n:n]
	ln.queue = ln.queue[n:]
	l.mu.Unlock()
	answered := false
	defer func() {
		if !answered { // a panic: let the batch's other handlers go on
			for _, r := range batch {
				r.err = errLaneAborted
				close(r.done)
			}
		}
		l.mu.Lock()
		if len(ln.queue) > 0 {
			close(ln.queue[0].lead)
		} else {
			ln.busy = false
			delete(l.m, provider)
		}
		l.mu.Unlock()
	}()

	cs := make([]events.Classification, len(batch))
	nows := make([]time.Time, len(batch))
	for i, r := range batch {
		cs[i], nows[i] = r.c, r.now
	}
	ctx, cancel := context.WithTimeout(context.Background(), laneTimeout)
	defer cancel()
	obs, err := l.s.eng.ObserveBatch(ctx, provider, cs, nows)
	if err == nil {
		err = l.s.publishScope(ctx, provider, obs[len(obs)-1])
	}
	for i, r := range batch {
		if err == nil {
			r.obs = obs[i]
		}
		r.err = err
		close(r.done)
	}
	answered = true
}

// publishScope publishes the records a fault-scope write left in the
// provider's outbox, in order, each under its transition's id, then clears
// them. A failed publish leaves them there for the provider's next writer.
func (s *Service) publishScope(ctx context.Context, provider string, last engine.Observed) error {
	if len(last.Publish) == 0 {
		return nil
	}
	s.crash(CrashAfterScope)
	for _, e := range last.Publish {
		var err error
		switch {
		case e.Health != nil:
			_, err = s.publish(ctx, events.HealthSubject(e.Health.Provider), e.Health, e.MsgID, nil)
		case e.Notification != nil:
			_, err = s.publish(ctx, events.NotifySubject(e.Notification.Severity), e.Notification, e.MsgID, nil)
		}
		if err != nil {
			return err
		}
	}
	if err := s.eng.Settle(ctx, provider, last.Seq); err != nil {
		// The next change of the provider publishes them again (same
		// ids): nothing is lost, so the decisions go on.
		s.log.Warn().Err(err).Str("provider", provider).Msg("settle fault-scope outbox")
	}
	return nil
}
