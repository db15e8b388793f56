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
)

// pipeline is one Run's flow of inputs. The pull hands each fetched input
// to a lane once the window has a free slot (the window is bounded by the
// consumer's MaxAckPending, so memory is too); a lane's worker runs the
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

	// slots holds one token per input fetched and not yet settled.
	slots chan struct{}
	// lanes are the workers' queues: one shared queue without Config.Key,
	// else one per worker, an input's key choosing its lane.
	lanes []chan *delivery
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

	workers sync.WaitGroup
	settler sync.WaitGroup
}

// delivery is a fetched input on its way to a worker.
type delivery struct {
	raw   jetstream.Msg
	m     *Msg // set when Config.Key needed it, else by the worker
	start time.Time
}

// pending is a handled input whose outputs are being stored.
type pending struct {
	m        *Msg
	out      *Outputs
	futures  []jetstream.PubAckFuture
	start    time.Time
	deadline time.Time
}

func (r *Runner) newPipeline(run, hctx context.Context) *pipeline {
	pl := &pipeline{
		r:       r,
		run:     run,
		hctx:    hctx,
		slots:   make(chan struct{}, r.window),
		settleq: make(chan *pending, r.window),
		pulled:  make(chan struct{}),
	}
	// Each queue can hold the whole window, so a busy lane holds up the
	// others only once the window is full.
	if r.cfg.Key == nil {
		pl.lanes = []chan *delivery{make(chan *delivery, r.window)}
	} else {
		pl.lanes = make([]chan *delivery, r.cfg.Concurrency)
		for i := range pl.lanes {
			pl.lanes[i] = make(chan *delivery, r.window)
		}
	}
	for i := range r.cfg.Concurrency {
		lane := pl.lanes[i%len(pl.lanes)]
		pl.workers.Go(func() {
			for d := range lane {
				if pl.run.Err() != nil {
					<-pl.pulled
					pl.handBack(d.raw) // fetched but not started: redelivered at once
					pl.release()
					continue
				}
				pl.process(d)
			}
		})
	}
	pl.settler.Go(pl.settleLoop)
	return pl
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

// dispatch queues raw, which holds a slot reserved for it, on its lane;
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
	d := &delivery{raw: raw, start: time.Now()}
	lane := pl.lanes[0]
	if r.cfg.Key != nil {
		if m, err := newMsg(raw); err == nil {
			d.m = m
			lane = pl.lanes[laneOf(r.keyOf(m), len(pl.lanes))]
		}
	}
	lane <- d // never blocks: a lane holds the whole window
}

// keyOf is Config.Key(m); a panicking Key routes to lane 0 (the handler,
// under Recover, then decides what the input is worth).
func (r *Runner) keyOf(m *Msg) (key string) {
	defer func() {
		if recover() != nil {
			key = ""
		}
	}()
	return r.cfg.Key(m)
}

// laneOf maps key to one of n lanes (FNV-1a).
func laneOf(key string, n int) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(n))
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
	for _, l := range pl.lanes {
		close(l)
	}
	pl.workers.Wait()
	close(pl.settleq)
	pl.settler.Wait()
}

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
	sctx := context.WithoutCancel(pl.hctx)
	var result, reason string
	switch {
	case herr == nil && out.err == nil && len(out.outs) > 0:
		futures, err := r.publishAsync(out)
		if err == nil {
			pl.settleq <- &pending{m: m, out: out, futures: futures, start: d.start, deadline: time.Now().Add(settleTimeout)}
			return
		}
		result, reason = r.fail(sctx, m, fmt.Errorf("publish outputs: %w", err), m.Delivered >= r.maxDeliver)
	case herr == nil && out.err == nil:
		result, reason = r.ack(m)
	default:
		result, reason = r.settle(sctx, pl.hctx, m, out, herr)
	}
	pl.finish(m, result, reason, herr, d.start)
}

// settleLoop waits for each pending input's outputs to be stored and
// acknowledges it, or hands it back with the backoff when a publish
// failed.
func (pl *pipeline) settleLoop() {
	r := pl.r
	sctx := context.WithoutCancel(pl.hctx)
	for p := range pl.settleq {
		var result, reason string
		if err := r.await(p); err != nil {
			result, reason = r.fail(sctx, p.m, fmt.Errorf("publish outputs: %w", err), p.m.Delivered >= r.maxDeliver)
		} else {
			result, reason = r.ack(p.m)
		}
		pl.finish(p.m, result, reason, nil, p.start)
	}
}

// finish records a settled input and frees its slot.
func (pl *pipeline) finish(m *Msg, result, reason string, herr error, start time.Time) {
	r := pl.r
	if result == ResultAck || result == ResultDeadLetter {
		r.pos.settled(m.Seq)
	}
	elapsed := time.Since(start)
	r.m.messages.WithLabelValues(r.cfg.Service, result).Inc()
	r.m.duration.WithLabelValues(r.cfg.Service).Observe(elapsed.Seconds())
	r.logResult(m, result, reason, herr, elapsed)
	pl.release()
}

// publishAsync starts storing every output; the futures say when each is
// stored. The window bounds how many are in flight.
func (r *Runner) publishAsync(out *Outputs) ([]jetstream.PubAckFuture, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(out.outs))
	for _, o := range out.outs {
		f, err := r.js.PublishMsgAsync(&nats.Msg{Subject: o.subject, Header: o.header, Data: o.data}, jetstream.WithStallWait(settleTimeout))
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", o.subject, o.msgID, err)
		}
		futures = append(futures, f)
	}
	return futures, nil
}

// errPublishTimeout: an output's PubAck did not come within settleTimeout.
var errPublishTimeout = errors.New("no acknowledgement from the stream in time")

// await waits for every output of p to be stored; a duplicate is a
// success (an earlier delivery stored it).
func (r *Runner) await(p *pending) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for i, f := range p.futures {
		o := p.out.outs[i]
		var (
			ack *jetstream.PubAck
			err error
		)
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
				err = fmt.Errorf("%w (%v)", errPublishTimeout, settleTimeout)
			}
		}
		if err != nil {
			return fmt.Errorf("%s (%s): %w", o.subject, o.msgID, err)
		}
		r.m.outputs.WithLabelValues(r.cfg.Service, strconv.FormatBool(ack.Duplicate)).Inc()
	}
	return nil
}

// ack acknowledges m without waiting for the server's confirmation.
func (r *Runner) ack(m *Msg) (string, string) {
	if err := m.raw.Ack(); err != nil {
		// Redelivered later; its outputs are deduplicated then.
		return ResultError, "ack failed: " + err.Error()
	}
	return ResultAck, ""
}
