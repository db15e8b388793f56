package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/jspub"
	"github.com/failbus/failbus/internal/storecheck"
	"github.com/failbus/failbus/pkg/events"
)

// Whether the runner's writes are stored.
//
// A bus whose disk is full still answers pulls and info requests (the
// server answered account info on a full disk), but stores nothing: a
// stream that failed a write gives no answer to any later publish, and
// one full by its own limit refuses each. Only a write tells. While it
// works, the runner adds no write to find out: it watches its own, every
// message's outputs, dead letters, and the handler's writes (an error the
// handler returns that storeFailure recognises), and Healthy fails while
// the latest message it settled could not be stored. The next message
// whose writes are stored (a redelivery of the same, once the server has
// room) makes it healthy again. A runner that saw no write go either way
// for Config.StoreCheckEvery (idle) writes a storecheck.Record of its own
// instead: a page of the disk and a bit (a smaller write may still fit in
// a page with bytes to spare, on a disk with none) to FAILBUS_STORECHECK,
// which keeps one per service, and takes its acknowledgement within
// storeCheckTimeout as the verdict. What none of this sees is a stream the
// runner does not write that failed a write: nats-server's own /healthz
// names each.

// ErrCannotStore is Healthy's error while the runner's latest writes were
// not stored: JetStream did not acknowledge them in time, nobody answered,
// or a stream refused them for want of room.
var ErrCannotStore = errors.New("cannot store")

// Error codes of the JetStream API that mean a write was not stored for
// want of room (nats-server's JSStreamStoreFailedF and
// JSInsufficientResourcesErr).
const (
	errCodeStoreFailed           jetstream.ErrorCode = 10077
	errCodeInsufficientResources jetstream.ErrorCode = 10023
)

// storeFailure reports whether err says JetStream did not store a write:
// no acknowledgement within its deadline (a server whose disk is full
// answers none), no responder (JetStream gone), a stream or the account
// out of room (maximum bytes or messages with discard new, insufficient
// resources), or a 503 of the JetStream API. A compare-and-set conflict,
// a duplicate, or a message the stream rejects for what it is, is not.
// A handler that writes beside its outputs returns such errors wrapped, so
// the runner's health sees them (see Healthy).
func storeFailure(err error) bool {
	if err == nil {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == errCodeStoreFailed || apiErr.ErrorCode == errCodeInsufficientResources ||
			apiErr.Code == 503
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, jetstream.ErrTooManyStalledMsgs) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, errPublishTimeout)
}

// storeState is the runner's latest verdict on its writes.
type storeState struct {
	err   error     // nil: the latest settled message's writes were stored
	since time.Time // when they started failing
	seen  time.Time // when a write last went either way
}

// Defaults and bounds of the store check.
const (
	// DefaultStoreCheckEvery is the failbus services' Config.StoreCheckEvery.
	DefaultStoreCheckEvery = 15 * time.Second
	// storeCheckTimeout bounds one store check's acknowledgement.
	storeCheckTimeout = 5 * time.Second
	// storeCheckPad is how much a store check writes: a page and a bit,
	// so it needs room a page with free bytes left does not give.
	storeCheckPad = 4096 + 64
)

// checkStore writes a storecheck.Record when no write went either way for
// Config.StoreCheckEvery (or at once, with now), and records how it went.
func (r *Runner) checkStore(ctx context.Context, now bool) {
	every := r.cfg.StoreCheckEvery
	r.mu.Lock()
	due := every > 0 && (now || time.Since(r.store.seen) >= every)
	r.mu.Unlock()
	if !due || ctx.Err() != nil {
		return
	}
	at := time.Now()
	m, err := jspub.NewMsg(storecheck.Subject(r.cfg.Service), &storecheck.Record{At: events.At(at), Service: r.cfg.Service, Pad: make([]byte, storeCheckPad)},
		fmt.Sprintf("storecheck:%s:%d", r.cfg.Service, at.UnixNano()), nil)
	if err != nil {
		r.log.Error().Err(err).Msg("store check not built")
		return
	}
	cctx, cancel := context.WithTimeout(ctx, storeCheckTimeout)
	defer cancel()
	_, err = r.js.PublishMsg(cctx, m)
	if ctx.Err() != nil {
		return // stopping: no verdict
	}
	if err != nil && !storeFailure(err) {
		// Not a store's answer (a permission refused, say): still a
		// failure to store, which the service cannot work without.
		err = fmt.Errorf("%w: store check refused: %w", ErrCannotStore, err)
	}
	r.stored(err)
	r.mu.Lock()
	r.store.seen = time.Now() // even when it told nothing
	r.mu.Unlock()
}

// stored records how the writes of a message went: err nil when they were
// stored (or there were none), else the failure. Errors that are not
// storeFailure change nothing.
func (r *Runner) stored(err error) {
	if err != nil && !storeFailure(err) && !errors.Is(err, ErrCannotStore) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.store.seen = time.Now()
	switch {
	case err == nil && r.store.err != nil:
		r.log.Info().Dur("failed_for", time.Since(r.store.since)).Msg("writes are stored again")
		r.store = storeState{}
	case err != nil:
		r.m.storeFailures.WithLabelValues(r.cfg.Service).Inc()
		if r.store.err == nil {
			r.log.Error().Err(err).Msg("a write was not stored: unhealthy until one is")
			r.store.since = time.Now()
		}
		r.store.err = err
	}
}

// storeErr is Healthy's part: nil while writes are stored.
func (r *Runner) storeErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.store.err == nil {
		return nil
	}
	since := r.store.since.UTC().Format(time.RFC3339)
	if errors.Is(r.store.err, ErrCannotStore) {
		return fmt.Errorf("%w (since %s)", r.store.err, since)
	}
	return fmt.Errorf("%w since %s: %w", ErrCannotStore, since, r.store.err)
}
