package consumer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/pkg/events"
)

// pipeline is one Run's flow of inputs. The pull hands each fetched input
// to the workers once the window has a free slot (the window is bounded by
// the consumer's MaxAckPending, so memory is too) — with Config.Key, behind
// the input of the same key a worker has, if any; a worker runs the
// handler and starts storing the outputs with async publishes, then moves
// on to its next input; the settler waits for each input's output acks, in
// the order the inputs were handled, and only then acknowledges the input.
// A worker therefore never waits for a round trip of its own, and an input
// is still acknowledged only after every output is stored: a process that
// dies with publishes in flight leaves its inputs unacknowledged, they are
// redelivered, and their outputs, re-published under the same Nats-Msg-Id,
// are deduplicated by the output streams.
//
// Acks are sent without waiting for the server's confirmation (Ack, not
// DoubleAck): a lost ack only means a redelivery, whose outputs
// deduplicate, and Run flushes the connection before it returns.
type pipeline struct {
	r    *Runner
	run  context.Context // Run's: once done, unstarted inputs are handed back
	hctx context.Context // the handlers'
	// settle bounds settling (storing outputs and dead letters, waiting
	// for their acknowledgements): it outlives hctx, and ends only when a
	// drain gives up on writes that are not stored (giveUp).
	settle     context.Context
	stopSettle context.CancelFunc

	// slots holds one token per input fetched and not yet settled.
	slots chan struct{}
	// ready is the workers' queue: inputs any free worker may start. It
	// holds the whole window, so pushing to it never blocks.
	ready chan *delivery
	// keys (Config.Key) holds, for each key with an input in a worker,
	// the inputs of that key waiting for it, in delivery order: the
	// worker that finishes one moves the next to ready. One key's inputs
	// are handled one at a time and in order; an input whose key is free
	// goes to the first free worker, never behind another key's.
	kmu  sync.Mutex
	keys map[string][]*delivery
	// outstanding counts the inputs dispatched and not yet through a
	// worker; close waits for it before closing ready.
	outstanding sync.WaitGroup
	// settleq holds inputs whose outputs are being stored, in order.
	settleq chan *pending
	// pulled is closed once the pull has ended. Inputs are handed back
	// only then: a message handed back while a pull request of this runner
	// is still open would be redelivered into it, and one arriving as the
	// request expires is dropped by the client and waits out its AckWait.
	pulled chan struct{}
	// later holds inputs fetched during a shutdown (pull goroutine only),
	// handed back once the pull has ended.
	later []jetstream.Msg

	// queued holds the deliveries waiting for a worker; the
	// keep-alive loop signals progress for those waiting long (their
	// AckWait runs from the fetch, not from when a worker starts them).
	qmu    sync.Mutex
	queued map[*delivery]struct{}
	stopKA chan struct{}

	workers   sync.WaitGroup
	settler   sync.WaitGroup
	keepAlive sync.WaitGroup
}

// delivery is a fetched input on its way to a worker.
type delivery struct {
	raw   jetstream.Msg
	m     *Msg   // set when Config.Key needed it, else nil (process makes its own)
	key   string // non-empty: it holds a place in pipeline.keys
	start time.Time
	// alive is when its AckWait last restarted: the fetch, or the
	// latest progress signal (under pipeline.qmu).
	alive time.Time
}

// pending is a handled input whose outputs are being stored.
type pending struct {
	m        *Msg
	out      *Outputs
	futures  []jetstream.PubAckFuture
	start    time.Time
	deadline time.Time
	// dead is set for an input being dead-lettered: the one future stores
	// its dead letter, and the input is then acknowledged as one.
	dead *deadPending
}

// deadPending is an input's dead letter on its way to the DLQ.
type deadPending struct {
	reason    string
	truncated bool
	herr      error
}

func (r *Runner) newPipeline(run, hctx context.Context) *pipeline {
	pl := &pipeline{
		r:       r,
		run:     run,
		hctx:    hctx,
		slots:   make(chan struct{}, r.window),
		settleq: make(chan *pending, r.window),
		pulled:  make(chan struct{}),
		queued:  map[*delivery]struct{}{},
		stopKA:  make(chan struct{}),
		keys:    map[string][]*delivery{},
	}
	pl.settle, pl.stopSettle = context.WithCancel(context.WithoutCancel(hctx))
	pl.ready = make(chan *delivery, r.window)
	for range r.cfg.Concurrency {
		pl.workers.Go(func() {
			for d := range pl.ready {
				pl.dequeue(d)
				if pl.run.Err() != nil {
					<-pl.pulled
					pl.handBack(d.raw) // fetched but not started: redelivered at once
					pl.release()
				} else {
					pl.process(d)
				}
				pl.next(d)
				pl.outstanding.Done()
			}
		})
	}
	pl.settler.Go(pl.settleLoop)
	if beat := r.ackWait / 3; beat > 0 {
		pl.keepAlive.Go(func() { pl.keepAliveLoop(beat) })
	}
	return pl
}

// maxQueuedAlive is how many AckWaits an input waiting for a worker is
// kept alive (keepAliveLoop).
const maxQueuedAlive = 10

// enqueue notes d as waiting for a worker.
func (pl *pipeline) enqueue(d *delivery) {
	pl.qmu.Lock()
	pl.queued[d] = struct{}{}
	pl.qmu.Unlock()
}

// dequeue notes that a worker took d.
func (pl *pipeline) dequeue(d *delivery) {
	pl.qmu.Lock()
	delete(pl.queued, d)
	pl.qmu.Unlock()
}

// keepAliveLoop signals progress (+WPI, restarting the AckWait) for every
// input that has waited beat or longer for a worker since its fetch or its
// last signal, for at most maxQueuedAlive AckWaits after its fetch: an
// input queued behind a handler stuck on its key is then left to its
// AckWait and redelivered (to another replica, if there is one), as
// without the keep-alive. A window of inputs behind slow handlers (a hostile payload
// near the size limit, a sink at its timeout) would otherwise run out its
// AckWait before a worker starts it, and be redelivered while it is still
// here: handled twice, its outputs deduplicated, but the work and the
// redelivery count spent. A handler keeps its own input alive
// (Heartbeat); outputs being stored wait at most SettleTimeout.
func (pl *pipeline) keepAliveLoop(beat time.Duration) {
	t := time.NewTicker(beat / 2)
	defer t.Stop()
	var due []*delivery
	for {
		select {
		case <-pl.stopKA:
			return
		case now := <-t.C:
			due = due[:0]
			pl.qmu.Lock()
			for d := range pl.queued {
				if now.Sub(d.alive) >= beat && now.Sub(d.start) < maxQueuedAlive*pl.r.ackWait {
					d.alive = now
					due = append(due, d)
				}
			}
			pl.qmu.Unlock()
			for _, d := range due {
				// A failed signal leaves the input to its AckWait, as
				// before; a worker may have taken it meanwhile, which is
				// harmless (the handler's input stays alive longer).
				if d.raw.InProgress() == nil {
					pl.r.m.keptAlive.WithLabelValues(pl.r.cfg.Service).Inc()
				}
			}
		}
	}
}

// reserve waits for n window slots, which the next pull's messages take;
// false when ctx ended first (the slots taken are given back).
func (pl *pipeline) reserve(ctx context.Context, n int) (int, bool) {
	for i := range n {
		select {
		case pl.slots <- struct{}{}:
		case <-ctx.Done():
			pl.unreserve(i)
			return 0, false
		}
	}
	return n, true
}

// unreserve gives back n slots a pull reserved and did not fill.
func (pl *pipeline) unreserve(n int) {
	for range n {
		<-pl.slots
	}
}

// dispatch queues raw, which holds a slot reserved for it, for a worker
// (behind the input of its key that is in a worker, if any);
// during a shutdown it gives the slot back and keeps raw to hand back to
// the server once the pull has ended.
func (pl *pipeline) dispatch(ctx context.Context, raw jetstream.Msg) {
	r := pl.r
	if md, err := raw.Metadata(); err == nil {
		r.pos.delivered(md.Sequence.Stream) // before a later pull can find the durable gone
	}
	if ctx.Err() != nil {
		<-pl.slots
		pl.later = append(pl.later, raw)
		return
	}
	r.m.inFlight.WithLabelValues(r.cfg.Service).Inc()
	now := time.Now()
	d := &delivery{raw: raw, start: now, alive: now}
	pl.enqueue(d)
	pl.outstanding.Add(1)
	if r.cfg.Key != nil {
		if m, err := newMsg(raw); err == nil {
			d.m = m
			d.key = r.keyOf(m)
		}
		if d.key != "" {
			pl.kmu.Lock()
			waiting, busy := pl.keys[d.key]
			if busy {
				pl.keys[d.key] = append(waiting, d) // after the one in a worker
				pl.kmu.Unlock()
				return
			}
			pl.keys[d.key] = nil
			pl.kmu.Unlock()
		}
	}
	pl.ready <- d // never blocks: ready holds the whole window
}

// next frees d's key: its next waiting input goes to ready, or the key is
// forgotten.
func (pl *pipeline) next(d *delivery) {
	if d.key == "" {
		return
	}
	pl.kmu.Lock()
	waiting := pl.keys[d.key]
	if len(waiting) == 0 {
		delete(pl.keys, d.key)
		pl.kmu.Unlock()
		return
	}
	n := waiting[0]
	waiting[0] = nil
	pl.keys[d.key] = waiting[1:]
	pl.kmu.Unlock()
	pl.ready <- n
}

// keyOf is Config.Key(m); a panicking Key gives no key (the handler,
// under Recover, then decides what the input is worth).
func (r *Runner) keyOf(m *Msg) (key string) {
	defer func() {
		if recover() != nil {
			key = ""
		}
	}()
	return r.cfg.Key(m)
}

func (pl *pipeline) handBack(raw jetstream.Msg) {
	if err := raw.Nak(); err != nil {
		pl.r.log.Warn().Err(err).Str("subject", logText(raw.Subject())).Msg("hand back on shutdown failed; redelivered after AckWait")
	}
}

// release frees the input's window slot.
func (pl *pipeline) release() {
	pl.r.m.inFlight.WithLabelValues(pl.r.cfg.Service).Dec()
	<-pl.slots
}

// close stops the pipeline after the pull has ended: workers finish their
// inputs (handing back the unstarted ones), then the settler stores and
// settles what they handled.
func (pl *pipeline) close() {
	close(pl.pulled)
	for _, raw := range pl.later {
		pl.handBack(raw)
	}
	pl.outstanding.Wait() // every input dispatched has been through a worker
	close(pl.ready)
	pl.workers.Wait()
	close(pl.stopKA)
	pl.keepAlive.Wait()
	close(pl.settleq)
	pl.settler.Wait()
	pl.stopSettle()
}

// giveUp stops settling: outputs are no longer waited for and dead letters
// no longer sent; their inputs, unacknowledged, are redelivered later.
func (pl *pipeline) giveUp() { pl.stopSettle() }

// process handles one delivery: decode, handler, then either the async
// publish of its outputs (settled by the settler) or its immediate
// settlement (ack without outputs, retry, dead letter).
func (pl *pipeline) process(d *delivery) {
	r := pl.r
	m := d.m
	if m == nil {
		var err error
		if m, err = newMsg(d.raw); err != nil {
			// Cannot happen on a pull consumer; without metadata there is no
			// stream position to dead-letter, so stop its redelivery.
			r.log.Error().Err(err).Str("subject", logText(d.raw.Subject())).Msg("message without JetStream metadata terminated")
			_ = d.raw.Term()
			pl.release()
			return
		}
	}
	out, herr := r.handle(pl.hctx, m)
	// Settling must finish even during a drain, so it does not use hctx.
	sctx := pl.settle
	var result, reason string
	switch {
	case herr == nil && out.err == nil && (len(out.outs) > 0 || len(out.after) > 0):
		futures, err := r.publishAsync(out)
		if err == nil {
			pl.settleq <- &pending{m: m, out: out, futures: futures, start: d.start, deadline: time.Now().Add(SettleTimeout)}
			return
		}
		r.stored(err)
		result, reason = r.fail(sctx, m, fmt.Errorf("publish outputs: %w", err), m.Delivered >= r.maxDeliver)
	case herr == nil && out.err == nil:
		r.stored(nil) // whatever the handler wrote itself was stored
		result, reason = r.ack(m)
	default:
		var dl *deadLetterError
		if errors.As(herr, &dl) {
			// Stored like an output, without the worker waiting for it: a
			// flood of bad input is dead-lettered at the rate of good.
			if p, err := r.deadLetterAsync(m, dl.Reason, herr, d.start); err == nil {
				pl.settleq <- p
				return
			}
		}
		result, reason = r.settle(sctx, pl.hctx, m, out, herr)
	}
	pl.finish(m, result, reason, herr, d.start)
}

// deadLetterAsync starts storing m's dead letter (the record and message
// id deadLetter stores synchronously); the settler acknowledges m once it
// is stored.
func (r *Runner) deadLetterAsync(m *Msg, reason string, herr error, start time.Time) (*pending, error) {
	data, hdr, dl, err := deadLetterRecord(r.cfg.Service, m, reason, r.js.Conn().MaxPayload())
	if err != nil {
		return nil, err
	}
	id := msgid.DeadLetter(r.cfg.Service, m.Stream, m.Seq)
	hdr.Set(events.HeaderMsgID, id)
	subject := events.DLQSubject(r.cfg.Service)
	f, err := r.js.PublishMsgAsync(&nats.Msg{Subject: subject, Header: hdr, Data: data}, stallWait)
	if err != nil {
		return nil, err
	}
	return &pending{
		m: m, out: &Outputs{outs: []output{{subject: subject, msgID: id}}}, futures: []jetstream.PubAckFuture{f},
		start: start, deadline: time.Now().Add(SettleTimeout),
		dead: &deadPending{reason: dl.Reason, truncated: dl.Truncated, herr: herr},
	}, nil
}

// settleLoop waits for each pending input's outputs to be stored and
// acknowledges it, or hands it back with the backoff when a publish
// failed.
func (pl *pipeline) settleLoop() {
	r := pl.r
	sctx := pl.settle
	for p := range pl.settleq {
		var result, reason string
		if p.dead != nil {
			result, reason = r.settleDead(sctx, p)
			pl.finish(p.m, result, reason, p.dead.herr, p.start)
			continue
		}
		fresh, err := r.await(sctx, p)
		r.stored(err)
		if err != nil {
			err = fmt.Errorf("publish outputs: %w", err)
		} else {
			err = r.awaitAfter(sctx, p)
		}
		if err != nil {
			result, reason = r.fail(sctx, p.m, err, p.m.Delivered >= r.maxDeliver)
		} else {
			if len(p.out.outs) > 0 {
				for _, fn := range p.out.stored {
					r.onStored(fn, fresh, p.m)
				}
			}
			result, reason = r.ack(p.m)
		}
		pl.finish(p.m, result, reason, nil, p.start)
	}
}

// settleDead acknowledges an input whose dead letter is stored, or hands
// it back with the backoff when storing failed (never lost: the next
// delivery dead-letters it again, under the same message id).
func (r *Runner) settleDead(ctx context.Context, p *pending) (string, string) {
	_, err := r.await(ctx, p)
	r.stored(err)
	if err != nil {
		return r.nak(p.m, r.cfg.backoff(p.m.Delivered), resultError, fmt.Sprintf("publish dead letter (%s): %v", p.dead.reason, err))
	}
	if p.dead.truncated {
		r.m.deadLettersTruncated.WithLabelValues(r.cfg.Service).Inc()
	}
	if err := p.m.raw.Ack(); err != nil {
		return resultDeadLetter, p.dead.reason + "; ack failed, dead letter deduplicated on redelivery: " + err.Error()
	}
	return resultDeadLetter, p.dead.reason
}

// finish records a settled input and frees its slot.
func (pl *pipeline) finish(m *Msg, result, reason string, herr error, start time.Time) {
	r := pl.r
	if result == resultAck || result == resultDeadLetter {
		r.pos.settled(m.Seq)
	}
	elapsed := time.Since(start)
	r.m.messages.WithLabelValues(r.cfg.Service, result).Inc()
	r.m.duration.WithLabelValues(r.cfg.Service).Observe(elapsed.Seconds())
	r.logResult(m, result, reason, herr, elapsed)
	pl.release()
}

// stallWait is the async publish option every output is stored with,
// made once (an option is a closure: one allocation per call).
var stallWait = jetstream.WithStallWait(SettleTimeout)

// publishAsync starts storing every output; the futures say when each is
// stored. The window bounds how many are in flight.
func (r *Runner) publishAsync(out *Outputs) ([]jetstream.PubAckFuture, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(out.outs))
	for _, o := range out.outs {
		f, err := r.js.PublishMsgAsync(&nats.Msg{Subject: o.subject, Header: o.header, Data: o.data}, stallWait)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", o.subject, o.msgID, err)
		}
		futures = append(futures, f)
	}
	return futures, nil
}

// errPublishTimeout: an output's PubAck did not come within SettleTimeout.
var errPublishTimeout = errors.New("no acknowledgement from the stream in time")

// await waits for every output of p to be stored; a duplicate is a
// success (an earlier delivery stored it). fresh reports whether any
// output was stored by this delivery rather than found a duplicate. It
// stops waiting when ctx ends (a drain gave up on the store).
func (r *Runner) await(ctx context.Context, p *pending) (fresh bool, err error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for i, f := range p.futures {
		o := p.out.outs[i]
		var ack *jetstream.PubAck
		select {
		case ack = <-f.Ok():
		case err = <-f.Err():
		default:
			if timer == nil {
				timer = time.NewTimer(time.Until(p.deadline))
			}
			select {
			case ack = <-f.Ok():
			case err = <-f.Err():
			case <-timer.C:
				err = fmt.Errorf("%w (%v)", errPublishTimeout, SettleTimeout)
			case <-ctx.Done():
				err = fmt.Errorf("not waited for: stopping while writes are not stored: %w", ctx.Err())
			}
		}
		if err != nil {
			return false, fmt.Errorf("%s (%s): %w", o.subject, o.msgID, err)
		}
		fresh = fresh || !ack.Duplicate
		if p.dead == nil {
			r.m.outputs.WithLabelValues(r.cfg.Service, strconv.FormatBool(ack.Duplicate)).Inc()
		}
	}
	return fresh, nil
}

// awaitAfter runs p's Outputs.After waits, each bounded by p's deadline.
func (r *Runner) awaitAfter(ctx context.Context, p *pending) error {
	if len(p.out.after) == 0 {
		return nil
	}
	ctx, cancel := context.WithDeadline(ctx, p.deadline)
	defer cancel()
	for _, wait := range p.out.after {
		if err := wait(ctx); err != nil {
			return fmt.Errorf("wait after the outputs (Outputs.After): %w", err)
		}
	}
	return nil
}

// ack acknowledges m without waiting for the server's confirmation.
func (r *Runner) ack(m *Msg) (string, string) {
	if err := m.raw.Ack(); err != nil {
		// Redelivered later; its outputs are deduplicated then.
		return resultError, "ack failed: " + err.Error()
	}
	return resultAck, ""
}

// onStored calls an Outputs.OnStored callback. It runs outside the
// handler's Recover middleware, so a panic there is recovered here and
// logged: the outputs are stored, and the input is acknowledged anyway.
func (r *Runner) onStored(fn func(fresh bool), fresh bool, m *Msg) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error().Str("id", logText(m.ID())).Str("panic", logText(fmt.Sprint(p))).Msg("OnStored callback panicked")
		}
	}()
	fn(fresh)
}
