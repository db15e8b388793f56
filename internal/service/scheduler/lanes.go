package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/scopestore"
	"github.com/failbus/failbus/pkg/events"
)

// One lane per provider: the provider's fault-scope record, held in
// memory, and the one goroutine of this replica that writes it to
// FAILBUS_SCOPE (compare-and-set on the key's revision). A classification
// is folded into the record the moment its handler hands it over
// (engine.Fold, in the order the handlers hand them over: a session's in
// its order, BudgetLane), so its verdict is known at once; the write that
// stores the fold comes later and stores every fold since the last one:
//
//   - A handler whose fold left records to publish (an outage declared, a
//     recovery, a rate limit, a notice; or records of an earlier writer
//     still unpublished) waits for the write and for those records to be
//     published, so no decision goes out before the health record it
//     depends on. Such a fold writes at once.
//   - Any other handler goes on with its verdict at once: the write
//     cannot change what it decides (nothing is published by it), only
//     make it durable. Its input is acknowledged only once the write that
//     holds its fold is stored (consumer.Outputs.After), so a process that
//     dies first has it redelivered and folded again (folding is
//     idempotent per outcome).
//   - Without a handler waiting, the lane waits up to
//     Config.ScopeLinger for more before it writes: in a storm or at a
//     fleet's rates a provider's record is written once a linger, not
//     once a classification.
//
// When another writer (a replica) changed the key since the lane's last
// write, the write fails on the revision: the lane reads the key, folds
// every classification not yet stored again on top of it, and writes
// that; for a while after (scopestore.ReadFirst) it reads the key before
// each write. A verdict given before such a conflict stands (a replica's failures of the same
// provider reach another's verdicts up to a linger late: the write after
// the conflict publishes whatever transition they make together). A
// write that fails otherwise (a timeout: stored or not, nobody knows)
// answers its classifications with the error, so their inputs are
// redelivered, and the lane reads the key again.

// maxLaneBatch is how many classifications a lane folds before it writes
// without waiting out the linger.
const maxLaneBatch = 512

// laneTimeout bounds the JetStream work of one load, write and publish.
const laneTimeout = 30 * time.Second

// errLaneAborted answers the classifications of a write whose lane
// stopped half way (a panic, such as a crash hook): their inputs are
// redelivered and folded again.
var errLaneAborted = errors.New("scheduler: the fault-scope write of this classification was interrupted")

type lanes struct {
	s *Service
	// maxIdle bounds the idle lanes (and the records they hold) kept
	// between writes: Config.MaxProviders. Past it idle lanes are
	// dropped, and their provider's record is read again when next
	// needed. Agents name providers, so this bounds memory, not
	// correctness.
	maxIdle int
	mu      sync.Mutex
	m       map[string]*lane
	// stopping is set once the service stops: nothing lingers (a drain
	// waits for the writes).
	stopping bool
}

type lane struct {
	// rec is the provider's record with every fold handed over so far;
	// nil until read (or after a write failed). rev is the revision of
	// the key it was read at or last written at (0: no key).
	rec *engine.ProviderRecord
	rev uint64
	// unfolded waits for rec to be read; unwritten is folded into rec
	// and in no stored write yet. Both in hand-over order.
	unfolded  []*laneReq
	unwritten []*laneReq
	// dirty: rec changed without a classification (a published outbox
	// cleared): it needs a write.
	dirty bool
	// running: the lane's goroutine is on. urgent: a handler waits on
	// the next write, so it does not linger. kick wakes a lingering
	// goroutine.
	running bool
	urgent  bool
	kick    chan struct{}
}

type laneReq struct {
	c    events.Classification
	now  time.Time
	wait bool // the handler waits for the write whatever its fold
	// handed is when it was handed over: the linger runs from the
	// earliest unwritten one, so none waits more than a linger and a
	// write for its write.
	handed time.Time
	// folded is closed once obs (the first fold's observation) is set,
	// or readErr (the record could not be read); hold is then set: the
	// handler waits for stored too.
	folded  chan struct{}
	obs     engine.Observed
	readErr error
	hold    bool
	// stored is closed once a write holding the fold is stored and its
	// records published, or err; final is the observation of the fold
	// that write holds (folded again after a conflict).
	stored chan struct{}
	final  engine.Observed
	err    error
	// released: folded is closed.
	released bool
}

// start lets lanes linger again (a Run after a stopped one).
func (l *lanes) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopping = false
}

// stop has every lane write now, and every later write come without a
// linger.
func (l *lanes) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopping = true
	for _, ln := range l.m {
		ln.wake()
	}
}

// lingerFor is how long a lane waits for more before a write nobody waits
// on; call with mu held.
func (l *lanes) lingerFor() time.Duration {
	if l.stopping {
		return 0
	}
	return l.s.scopeLinger
}

// hand folds c at now into its provider's record (once the record is
// read) and returns its request: verdict gives the observation, and
// stored tells when the fold is durable. wait makes the verdict wait for
// the write (and its records published) whatever the fold.
func (l *lanes) hand(c events.Classification, now time.Time, wait bool) *laneReq {
	r := &laneReq{c: c, now: now, wait: wait, handed: time.Now(), folded: make(chan struct{}), stored: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	ln := l.laneOf(c.Provider)
	if ln.rec == nil {
		ln.unfolded = append(ln.unfolded, r)
		ln.urgent = ln.urgent || wait
	} else {
		l.fold(c.Provider, ln, r)
	}
	if len(ln.unwritten) >= maxLaneBatch {
		ln.urgent = true
	}
	if !ln.running {
		ln.running = true
		go l.run(c.Provider, ln)
	} else if ln.urgent {
		ln.wake()
	}
	return r
}

// verdict returns r's observation: at once, or once the write holding it
// is stored and its records published when the handler must wait.
func (r *laneReq) verdict(ctx context.Context) (engine.Observed, error) {
	select {
	case <-r.folded:
	case <-ctx.Done():
		return engine.Observed{}, ctx.Err()
	}
	if r.readErr != nil {
		return engine.Observed{}, r.readErr
	}
	if !r.hold {
		return r.obs, nil
	}
	if err := r.waitStored(ctx); err != nil {
		return engine.Observed{}, err
	}
	return r.final, nil
}

// waitStored returns once the write holding r's fold is stored (and its
// records published), with its error, or ctx's.
func (r *laneReq) waitStored(ctx context.Context) error {
	select {
	case <-r.stored:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// laneOf returns provider's lane, made if need be; call with mu held.
func (l *lanes) laneOf(provider string) *lane {
	if l.m == nil {
		l.m = map[string]*lane{}
	}
	ln := l.m[provider]
	if ln == nil {
		ln = &lane{kick: make(chan struct{}, 1)}
		l.m[provider] = ln
	}
	return ln
}

// wake ends the lane's linger.
func (ln *lane) wake() {
	select {
	case ln.kick <- struct{}{}:
	default:
	}
}

// fold folds r into the lane's record and, the first time, releases its
// handler; call with mu held and ln.rec read.
func (l *lanes) fold(provider string, ln *lane, r *laneReq) {
	obs := l.s.eng.Fold(ln.rec, provider, r.c, r.now)
	r.final = obs
	ln.unwritten = append(ln.unwritten, r)
	if r.released {
		return
	}
	r.obs = obs
	r.hold = r.wait || len(ln.rec.Outbox) > 0
	ln.urgent = ln.urgent || r.hold
	r.released = true
	close(r.folded)
}

// fail answers every request of the lane not yet stored with err and
// drops its record (read again next time); call with mu held.
func (ln *lane) fail(err error) {
	for _, r := range ln.unfolded {
		r.readErr, r.err = err, err
		close(r.folded)
		close(r.stored)
	}
	for _, r := range ln.unwritten {
		r.err = err
		close(r.stored)
	}
	ln.unfolded, ln.unwritten, ln.rec, ln.dirty, ln.urgent = nil, nil, nil, false, false
}

// run is the lane's goroutine: it reads the record when needed, waits out
// the linger, writes, publishes the records the write stored, and
// answers; it ends when nothing is left to write. A panic (a crash hook)
// answers what it was writing with errLaneAborted and drops the record.
func (l *lanes) run(provider string, ln *lane) {
	// batch is the write in flight; settled were stored by the write
	// before, whose published records the next write clears.
	var batch, settled []*laneReq
	defer func() {
		if p := recover(); p != nil {
			l.s.log.Error().Str("provider", provider).Str("panic", fmt.Sprint(p)).Msg("fault-scope write interrupted; its classifications are redelivered")
			l.mu.Lock()
			answer(settled, nil)
			answer(batch, errLaneAborted)
			ln.rec = nil // read again: what the write stored is not known here
			ln.running = false
			if len(ln.unfolded)+len(ln.unwritten) > 0 {
				ln.running = true
				go l.run(provider, ln)
			}
			l.mu.Unlock()
		}
	}()
	conflicts := 0
	for {
		l.mu.Lock()
		if len(ln.unfolded) == 0 && len(ln.unwritten) == 0 && !ln.dirty {
			ln.running = false
			l.dropIdle()
			l.mu.Unlock()
			return
		}
		read := ln.rec == nil
		urgent := ln.urgent || l.stopping
		wait := l.lingerFor()
		if len(ln.unwritten) > 0 {
			wait -= time.Since(ln.unwritten[0].handed)
		}
		l.mu.Unlock()
		if read {
			l.read(provider, ln)
			continue
		}
		if !urgent && wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ln.kick:
			}
			t.Stop()
		}
		// Another writer is about (scopestore.ReadFirst): fold on top
		// of its latest.
		fresh := l.s.providers.ReadFirst(provider)
		if fresh {
			l.mu.Lock()
			ln.rec = nil
			l.mu.Unlock()
		}
		if fresh && !l.read(provider, ln) {
			continue
		}
		var snap snapshot
		batch, snap = l.snapshot(ln)
		cleared, err := l.write(provider, ln, snap)
		l.mu.Lock()
		switch {
		case errors.Is(err, engine.ErrConflict):
			if fresh {
				l.s.m.scopeConflicts.Inc()
			} else {
				l.s.m.scopeStale.Inc()
			}
			answer(settled, nil)
			ln.unwritten = append(batch, ln.unwritten...)
			ln.rec = nil
			if conflicts++; conflicts >= engine.MaxConflicts {
				ln.fail(fmt.Errorf("fault scope %s: %w %d times in a row", provider, engine.ErrConflict, conflicts))
				conflicts = 0
			}
		case err != nil:
			answer(settled, nil)
			answer(batch, err)
			ln.rec = nil // the later folds are folded again on what is read
		case cleared:
			// Published: answered once the cleared outbox is stored
			// too, at once, so what is acknowledged leaves nothing to
			// publish again.
			conflicts = 0
			settled = append(settled, batch...)
			ln.urgent = true
		default:
			conflicts = 0
			answer(settled, nil)
			answer(batch, nil)
		}
		if !cleared || err != nil {
			settled = nil
		}
		batch = nil
		l.mu.Unlock()
	}
}

// answer tells each request that its write is stored (err nil) or why
// not; call with mu held.
func answer(rs []*laneReq, err error) {
	for _, r := range rs {
		r.err = err
		close(r.stored)
	}
}

// read reads the provider's record and folds what waits for it: first,
// again, what was folded before and not stored, then what was handed over
// while it read. It reports whether the record was read; if not, every
// request not yet stored is answered with the error.
func (l *lanes) read(provider string, ln *lane) bool {
	ctx, cancel := context.WithTimeout(context.Background(), laneTimeout)
	defer cancel()
	rec, rev, err := l.s.providers.Load(ctx, provider)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.s.log.Warn().Err(err).Str("provider", provider).Msg("read fault scope; its classifications are redelivered")
		ln.fail(err)
		return false
	}
	ln.rec, ln.rev = rec, rev
	again, waiting := ln.unwritten, ln.unfolded
	ln.unwritten, ln.unfolded = nil, nil
	for _, r := range again {
		l.fold(provider, ln, r)
	}
	for _, r := range waiting {
		l.fold(provider, ln, r)
	}
	return true
}

// snapshot is the record as one write stores it.
type snapshot struct {
	data   []byte
	err    error // encoding it failed
	seq    uint64
	outbox []engine.Effect
	rev    uint64
}

// snapshot takes the requests folded so far and the record holding them,
// encoded, for a write.
func (l *lanes) snapshot(ln *lane) ([]*laneReq, snapshot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	batch := ln.unwritten
	ln.unwritten = nil
	ln.dirty, ln.urgent = false, false
	data, err := scopestore.EncodeRecord(ln.rec)
	return batch, snapshot{data: data, err: err, seq: ln.rec.Seq, outbox: slices.Clone(ln.rec.Outbox), rev: ln.rev}
}

// write stores snap with compare-and-set and publishes the records its
// outbox holds, then clears them from the lane's record unless a later
// fold added more (cleared: the record needs a write). An error wrapping
// engine.ErrConflict stored nothing.
func (l *lanes) write(provider string, ln *lane, snap snapshot) (cleared bool, err error) {
	if snap.err != nil {
		return false, snap.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), laneTimeout)
	defer cancel()
	rev, err := l.s.providers.Put(ctx, provider, snap.data, snap.rev)
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	ln.rev = rev
	l.mu.Unlock()
	if err := l.s.publishScope(ctx, snap.outbox); err != nil {
		// Stored, not published: the outbox stays for the next write.
		return false, err
	}
	if len(snap.outbox) == 0 {
		return false, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if ln.rec != nil && ln.rec.Seq == snap.seq {
		ln.rec.Outbox = nil
		ln.dirty = true
		return true, nil
	}
	return false, nil
}

// dropIdle drops idle lanes past maxIdle, down to three quarters of it;
// call with mu held.
func (l *lanes) dropIdle() {
	if len(l.m) <= l.maxIdle {
		return
	}
	for p, ln := range l.m {
		if !ln.running && len(ln.unfolded) == 0 && len(ln.unwritten) == 0 {
			delete(l.m, p)
			if len(l.m) <= l.maxIdle*3/4 {
				return
			}
		}
	}
}

// publishScope publishes the records a fault-scope write stored in the
// provider's outbox, in order, each under its transition's id. A failed
// publish leaves them there for the provider's next write.
func (s *Service) publishScope(ctx context.Context, outbox []engine.Effect) error {
	if len(outbox) == 0 {
		return nil
	}
	s.crash(CrashAfterScope)
	for _, e := range outbox {
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
	return nil
}
