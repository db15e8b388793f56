// Package watch reads a stream with an ordered consumer: JetStream's
// client-side cursor, which leaves no state on the server (the consumer is
// ephemeral, recreated by the client after a gap, and deleted when the read
// ends); or, with Config.Direct, with no consumer at all, by direct batch
// gets, which is how the operator tools read (`failbus tail`, `failbus
// health`, report, shadow, dlq), since the operator role may create no
// consumer. It is the one stream reader of the tools, the demo's waits and
// the bench's collectors, so how a stream is read, followed, stopped and
// cleaned up is written once.
//
// Read is the synchronous form (return when the messages stored at the
// start are read, or follow until the context ends); Start runs the same
// loop in the background for a caller that waits on what arrives; Log
// collects decoded messages so a caller can wait for the one it expects,
// with a deadline, instead of sleeping.
//
// Not for services' durable work: a message read here is never acknowledged
// and is not redelivered. Services consume through pkg/consumer.
package watch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/connect"
)

// DefaultInactiveThreshold bounds how long the server keeps the ordered
// consumer of a reader that died without deleting it.
const DefaultInactiveThreshold = 30 * time.Second

// deleteTimeout bounds deleting the consumer when a read ends.
const deleteTimeout = 5 * time.Second

// Config says what to read.
type Config struct {
	// Stream is the stream to read. Required.
	Stream string
	// Filters are subject filters within the stream; none means all of it.
	// They must not overlap (the server rejects overlapping filters).
	Filters []string
	// DeliverPolicy is where reading starts. Defaults to
	// jetstream.DeliverAllPolicy. DeliverByStartSequencePolicy needs
	// StartSeq, DeliverByStartTimePolicy needs StartTime;
	// DeliverLastPerSubjectPolicy reads the latest message of each subject.
	DeliverPolicy jetstream.DeliverPolicy
	// StartSeq is the first stream sequence with
	// DeliverByStartSequencePolicy.
	StartSeq uint64
	// StartTime is the first store time with DeliverByStartTimePolicy.
	StartTime *time.Time
	// HeadersOnly delivers headers without payloads.
	HeadersOnly bool
	// Follow keeps reading messages stored after the read began. Without
	// it, reading ends once the messages selected when it began are read.
	Follow bool
	// InactiveThreshold is how long the server keeps the consumer of a
	// reader that stopped without deleting it. Defaults to
	// DefaultInactiveThreshold.
	InactiveThreshold time.Duration
	// Stall, without Follow, is how long Run waits for the next of the
	// messages selected at the start before it fails (ErrStalled) instead
	// of waiting until its context ends: for a service that must not take
	// a partial read for a whole one. 0: no limit.
	Stall time.Duration
	// Direct reads with direct batch gets instead of a consumer, so it
	// leaves nothing on the server and needs only the permission to read
	// (the operator role may create no consumer: see direct.go). A read
	// that follows asks for new messages every PollInterval. Messages are
	// read whole (HeadersOnly is ignored), carry no reply subject and
	// cannot be acknowledged. The stream must allow direct gets (every
	// failbus stream does); Stall is not applied. The operator tools
	// read this way.
	Direct bool
	// PollInterval is how often a Direct read that follows asks for
	// messages stored since its last answer. Defaults to
	// DefaultPollInterval.
	PollInterval time.Duration
}

// ErrStalled: a read without Follow got no message for Config.Stall while
// messages selected at its start were still unread.
var ErrStalled = errors.New("watch: read stalled")

// ErrStop, returned by a Read callback, ends the read without an error.
var ErrStop = errors.New("watch: stop")

// Reader is one open read of a stream: the ordered consumer exists on the
// server from Open on, so nothing stored after Open is missed.
type Reader struct {
	js      jetstream.JetStream
	cfg     Config
	cons    jetstream.Consumer
	it      jetstream.MessagesContext
	direct  *directRead // Config.Direct: no consumer
	pending uint64      // messages selected when the reader opened
}

// Open creates the ordered consumer cfg describes, or, with Config.Direct,
// reads the first page of each filter.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Reader, error) {
	if cfg.Stream == "" {
		return nil, errors.New("watch: no stream")
	}
	if cfg.Direct {
		if cfg.PollInterval <= 0 {
			cfg.PollInterval = DefaultPollInterval
		}
		d, pending, err := openDirect(ctx, js, cfg)
		if err != nil {
			return nil, err
		}
		return &Reader{js: js, cfg: cfg, direct: d, pending: pending}, nil
	}
	occ := jetstream.OrderedConsumerConfig{
		FilterSubjects:    cfg.Filters,
		DeliverPolicy:     cfg.DeliverPolicy,
		OptStartSeq:       cfg.StartSeq,
		OptStartTime:      cfg.StartTime,
		HeadersOnly:       cfg.HeadersOnly,
		InactiveThreshold: cfg.InactiveThreshold,
	}
	if occ.InactiveThreshold == 0 {
		occ.InactiveThreshold = DefaultInactiveThreshold
	}
	c, err := js.OrderedConsumer(ctx, cfg.Stream, occ)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", cfg.Stream, err)
	}
	r := &Reader{js: js, cfg: cfg, cons: c}
	if info := c.CachedInfo(); info != nil {
		r.pending = info.NumPending
	}
	if r.pending == 0 && !cfg.Follow {
		return r, nil // nothing to read: no iterator, Run returns at once
	}
	if r.it, err = c.Messages(); err != nil {
		r.Close(ctx)
		return nil, fmt.Errorf("read %s: %w", cfg.Stream, err)
	}
	return r, nil
}

// Pending is how many messages the reader selected when it opened (for
// DeliverLastPerSubjectPolicy: how many subjects); for a Direct read,
// messages stored meanwhile may be counted.
func (r *Reader) Pending() uint64 { return r.pending }

// Run calls fn with every message in stream order until fn returns an error
// (ErrStop: nil), ctx ends (nil; its cause when that is a permission the
// server denied), Close is called (nil), or, without Follow,
// the messages selected when the reader opened are read. A message stored
// after the read began may be included when it arrives before the last of
// those. Run does not close the reader.
func (r *Reader) Run(ctx context.Context, fn func(jetstream.Msg) error) error {
	if r.direct != nil {
		err := r.direct.run(ctx, fn)
		if errors.Is(err, ErrStop) {
			return nil
		}
		return err
	}
	if r.it == nil {
		return nil
	}
	var seen uint64
	for {
		m, err := r.next(ctx)
		if err != nil {
			if cause := connect.Denied(ctx); cause != nil {
				// A denial ended the read: it failed, and must not pass
				// for a read of an empty stream.
				return fmt.Errorf("read %s: %w", r.cfg.Stream, cause)
			}
			if ctx.Err() != nil || errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return nil
			}
			if errors.Is(err, ErrStalled) {
				return fmt.Errorf("read %s: %w: no message for %v with %d of %d read", r.cfg.Stream, err, r.cfg.Stall, seen, r.pending)
			}
			return fmt.Errorf("read %s: %w", r.cfg.Stream, err)
		}
		seen++
		if err := fn(m); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
		if !r.cfg.Follow {
			if seen >= r.pending {
				return nil
			}
			if meta, err := m.Metadata(); err == nil && meta.NumPending == 0 {
				return nil // some were removed (age, limits) while reading
			}
		}
	}
}

// next waits for the next message, at most Config.Stall without Follow.
func (r *Reader) next(ctx context.Context) (jetstream.Msg, error) {
	if r.cfg.Follow || r.cfg.Stall <= 0 {
		return r.it.Next(jetstream.NextContext(ctx))
	}
	sctx, cancel := context.WithTimeoutCause(ctx, r.cfg.Stall, ErrStalled)
	defer cancel()
	m, err := r.it.Next(jetstream.NextContext(sctx))
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(sctx), ErrStalled) {
		return nil, ErrStalled
	}
	return m, err
}

// Close stops reading and deletes the ordered consumer at once instead of
// leaving it to expire.
func (r *Reader) Close(ctx context.Context) {
	if r.direct != nil {
		return // nothing on the server
	}
	if r.it != nil {
		r.it.Stop()
	}
	if info := r.cons.CachedInfo(); info != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
		defer cancel()
		_ = r.js.DeleteConsumer(dctx, r.cfg.Stream, info.Name)
	}
}

// Read opens cfg, runs fn over it (see Reader.Run) and closes it.
func Read(ctx context.Context, js jetstream.JetStream, cfg Config, fn func(jetstream.Msg) error) error {
	r, err := Open(ctx, js, cfg)
	if err != nil {
		return err
	}
	defer r.Close(ctx)
	return r.Run(ctx, fn)
}

// Watch is a read running in the background (Start).
type Watch struct {
	r      *Reader
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start opens cfg and runs fn over it in a goroutine until Stop, ctx's
// end, or fn's error. The consumer exists when Start returns, so a caller
// may then cause what it waits for without missing it. fn runs on one
// goroutine, in stream order.
func Start(ctx context.Context, js jetstream.JetStream, cfg Config, fn func(jetstream.Msg) error) (*Watch, error) {
	r, err := Open(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	w := &Watch{r: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = r.Run(rctx, fn)
	}()
	return w, nil
}

// Done is closed when the background read has ended.
func (w *Watch) Done() <-chan struct{} { return w.done }

// Stop ends the read, deletes the consumer, and returns fn's error, if
// any.
func (w *Watch) Stop() error {
	w.cancel()
	if w.r.it != nil {
		w.r.it.Stop()
	}
	<-w.done
	w.r.Close(context.Background())
	return w.err
}

// Log keeps what a background read decoded, so a caller can wait for the
// message it expects (Wait) instead of sleeping. Messages decode fails on
// are skipped: a reader that must judge bad input is not a Log.
type Log[T any] struct {
	w       *Watch
	mu      sync.Mutex
	items   []T
	changed chan struct{} // closed and replaced on every new item
}

// StartLog follows cfg (Follow is implied) and keeps decode's result of
// each message.
func StartLog[T any](ctx context.Context, js jetstream.JetStream, cfg Config, decode func(jetstream.Msg) (T, error)) (*Log[T], error) {
	l := &Log[T]{changed: make(chan struct{})}
	cfg.Follow = true
	w, err := Start(ctx, js, cfg, func(m jetstream.Msg) error {
		v, err := decode(m)
		if err != nil {
			return nil
		}
		l.mu.Lock()
		l.items = append(l.items, v)
		close(l.changed)
		l.changed = make(chan struct{})
		l.mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	l.w = w
	return l, nil
}

// Wait returns the first item since index from that satisfies match, and
// its index, waiting until ctx ends for it.
func (l *Log[T]) Wait(ctx context.Context, from int, match func(T) bool) (T, int, error) {
	for {
		l.mu.Lock()
		items, changed := l.items, l.changed
		l.mu.Unlock()
		for i := from; i < len(items); i++ {
			if match(items[i]) {
				return items[i], i, nil
			}
		}
		from = max(from, len(items))
		select {
		case <-changed:
		case <-l.w.Done():
			var zero T
			return zero, 0, fmt.Errorf("watch of %s ended", l.w.r.cfg.Stream)
		case <-ctx.Done():
			var zero T
			return zero, 0, ctx.Err()
		}
	}
}

// Stop ends the read.
func (l *Log[T]) Stop() error { return l.w.Stop() }
