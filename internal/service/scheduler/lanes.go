package scheduler

import (
	"context"
	"errors"
	"fmt"
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
//
// A success that needs nothing from the scope write (it ends no retry
// episode through the ledger: observeLater) does not wait for it: its
// handler returns at once, and its input is acknowledged only once the
// write that folds it is stored (consumer.Outputs.After), so a crash
// before that redelivers it. A lane that holds only such successes waits
// up to Config.SuccessLinger for more before writing — for a failure
// (which writes at once, taking the successes with it), for more
// successes, or for maxLaneBatch of them — in a goroutine of its own: at
// a fleet's rates, where nine calls in ten succeed, a provider's
// successes then cost one write per linger instead of one each. Nothing
// waits on a success's write but its acknowledgement and the provider's
// recovery, which comes at most a linger later.

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
	// stopping is set once the service stops: successes no longer linger
	// (a drain waits for their writes).
	stopping bool
}

// start lets successes linger again (a Run after a stopped one).
func (l *lanes) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopping = false
}

// stop writes every lingering lane's successes now, and every later one
// without lingering.
func (l *lanes) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopping = true
	for _, ln := range l.m {
		if ln.linger != nil {
			close(ln.linger)
			ln.linger = nil
		}
	}
}

// lingerFor is how long a lane of successes waits for more; call with mu
// held.
func (l *lanes) lingerFor() time.Duration {
	if l.stopping {
		return 0
	}
	return l.s.successLinger
}

type lane struct {
	queue []*laneReq
	busy  bool
	// linger is non-nil while a goroutine of its own holds the lane for
	// successes (later), waiting for more; closed: write now.
	linger chan struct{}
}

type laneReq struct {
	c   events.Classification
	now time.Time
	// lead is closed when this handler writes the next batch; nil for a
	// success nobody waits on (observeLater).
	lead chan struct{}
	done chan struct{} // closed: obs and err are set
	obs  engine.Observed
	err  error
}

// observeLater queues c at now for its provider's next fault-scope write
// without waiting for it; done is closed once that write is stored (or
// failed: err says). A lane holding only such requests writes after
// Config.SuccessLinger, or at once when a waiting handler, or
// maxLaneBatch of them, arrive.
func (l *lanes) observeLater(c events.Classification, now time.Time) *laneReq {
	r := &laneReq{c: c, now: now, done: make(chan struct{})}
	l.mu.Lock()
	ln := l.laneOf(c.Provider)
	ln.queue = append(ln.queue, r)
	switch {
	case !ln.busy:
		ln.busy = true
		ln.linger = make(chan struct{})
		go l.background(c.Provider, ln, ln.linger, l.lingerFor())
	case ln.linger != nil && len(ln.queue) >= maxLaneBatch:
		close(ln.linger)
		ln.linger = nil
	}
	l.mu.Unlock()
	return r
}

// wait returns r's observation once its write is done, or ctx's error.
func (r *laneReq) wait(ctx context.Context) (engine.Observed, error) {
	select {
	case <-r.done:
		return r.obs, r.err
	case <-ctx.Done():
		return engine.Observed{}, ctx.Err()
	}
}

// laneOf returns provider's lane, made if need be; call with mu held.
func (l *lanes) laneOf(provider string) *lane {
	if l.m == nil {
		l.m = map[string]*lane{}
	}
	ln := l.m[provider]
	if ln == nil {
		ln = &lane{}
		l.m[provider] = ln
	}
	return ln
}

// background writes the lane's next batch from a goroutine of its own,
// after wait unless linger is closed first. A panic there (a crash hook)
// answers the batch with errLaneAborted: its inputs are redelivered.
func (l *lanes) background(provider string, ln *lane, linger chan struct{}, wait time.Duration) {
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-linger:
		}
		t.Stop()
	}
	l.mu.Lock()
	if ln.linger == linger {
		ln.linger = nil
	}
	l.mu.Unlock()
	defer func() {
		if p := recover(); p != nil {
			l.s.log.Error().Str("provider", provider).Str("panic", fmt.Sprint(p)).Msg("fault-scope write of successes interrupted; they are redelivered")
		}
	}()
	l.write(provider, ln)
}

// observe folds c at now into its provider's fault scope through the
// provider's lane and returns the observation once its records are
// published.
func (l *lanes) observe(c events.Classification, now time.Time) (engine.Observed, error) {
	r := &laneReq{c: c, now: now, lead: make(chan struct{}), done: make(chan struct{})}
	l.mu.Lock()
	ln := l.laneOf(c.Provider)
	ln.queue = append(ln.queue, r)
	switch {
	case !ln.busy:
		ln.busy = true
		close(r.lead)
	case ln.linger != nil:
		// Successes linger: write them now, with this one.
		close(ln.linger)
		ln.linger = nil
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
		l.handOn(provider, ln)
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

// handOn gives the lane to the first request queued: its handler leads
// the next write, or, for a success nobody waits on, a goroutine of its
// own does (at once when a handler waits further back, else after the
// linger). Call with mu held.
func (l *lanes) handOn(provider string, ln *lane) {
	if len(ln.queue) == 0 {
		ln.busy = false
		delete(l.m, provider)
		return
	}
	if ln.queue[0].lead != nil {
		close(ln.queue[0].lead)
		return
	}
	wait := l.lingerFor()
	for _, r := range ln.queue {
		if r.lead != nil {
			wait = 0
			break
		}
	}
	ln.linger = make(chan struct{})
	go l.background(provider, ln, ln.linger, wait)
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
