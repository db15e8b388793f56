package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Errors Healthy reports before and after Run.
var (
	// ErrNotRunning: Run has not been called or has not bound its consumer
	// yet.
	ErrNotRunning = errors.New("consumer: not running")
	// ErrStopped: Run has returned.
	ErrStopped = errors.New("consumer: stopped")
)

// SettleTimeout bounds the settling of a handled input: each output
// publish, dead-letter publish and ack, and its Outputs.After waits, end
// within it after the handler returned, or the input is handed back
// (redelivered after the backoff). A handler that hands work to a
// shared write (Outputs.After) must have it done well within this.
const SettleTimeout = 10 * time.Second

// fetchErrorPause is the wait after a failed pull before the next one, so an
// unreachable server is not hammered.
const fetchErrorPause = time.Second

// Runner runs one Handler on one durable pull consumer. Create it with New,
// start it with Run. Several Runners (services) can share one connection and
// one metrics registry.
type Runner struct {
	js      jetstream.JetStream
	cfg     Config
	handler Handler
	log     zerolog.Logger
	m       *metrics

	// maxDeliver is Config.MaxDeliver resolved against the consumer: the
	// deliveries the handler runs on (logged as handler_deliveries).
	maxDeliver int
	// consumerMaxDeliver is the consumer's own max_deliver (0: no limit),
	// the figure an operator compares with the server's.
	consumerMaxDeliver int
	// pos is where the runner stands, for recreating a deleted durable.
	pos position
	// window is Config.MaxInFlight bounded by the consumer's
	// MaxAckPending: the inputs fetched and not yet settled, at most.
	window int
	// ackWait is the consumer's AckWait: inputs waiting in the window for
	// a worker get a progress signal between a third and a half of it
	// (pipeline.keepAliveLoop).
	ackWait time.Duration

	mu       sync.Mutex
	state    error // ErrNotRunning, nil (running) or ErrStopped
	fetchErr error // last pull failure, cleared by the next good pull
	store    storeState
	started  bool
}

// New checks cfg and prepares a runner for h; it does no I/O. Errors from a
// bad cfg wrap ErrInvalidConfig.
func New(js jetstream.JetStream, cfg Config, h Handler) (*Runner, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: nil JetStream", ErrInvalidConfig)
	}
	if h == nil {
		return nil, fmt.Errorf("%w: nil Handler", ErrInvalidConfig)
	}
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", c.Service, err)
	}
	handler := chain(h, append([]Middleware{Recover(), traceContext(c.Consumer)}, c.Middleware...)...)
	return &Runner{
		js:      js,
		cfg:     c,
		handler: handler,
		log:     c.Logger.With().Str("service", c.Service).Logger(),
		m:       m,
		state:   ErrNotRunning,
	}, nil
}

// Gatherer returns the registry the runner's metrics are in when it is a
// prometheus.Gatherer (the default registry New creates is), for a /metrics endpoint;
// otherwise nil.
func (r *Runner) Gatherer() prometheus.Gatherer {
	g, _ := r.cfg.Registerer.(prometheus.Gatherer)
	return g
}

// Service is the service name the runner was configured with.
func (r *Runner) Service() string { return r.cfg.Service }

// Healthy reports nil while Run is consuming, the connection is up, the
// last pull worked (the durable is there, or was recreated) and the
// latest message's writes were stored (store.go: ErrCannotStore);
// otherwise an error saying what is wrong. It is a service's /healthz
// check.
func (r *Runner) Healthy() error {
	r.mu.Lock()
	state, fetchErr := r.state, r.fetchErr
	r.mu.Unlock()
	if state != nil {
		return fmt.Errorf("%s: %w", r.cfg.Service, state)
	}
	if st := r.js.Conn().Status(); st != nats.CONNECTED {
		return fmt.Errorf("%s: NATS connection %s", r.cfg.Service, st)
	}
	if fetchErr != nil {
		return fmt.Errorf("%s: pull from %s/%s: %w", r.cfg.Service, r.cfg.Stream, r.cfg.Consumer, fetchErr)
	}
	if err := r.storeErr(); err != nil {
		return fmt.Errorf("%s: %w", r.cfg.Service, err)
	}
	return nil
}

func (r *Runner) setState(state error) {
	r.mu.Lock()
	r.state = state
	r.mu.Unlock()
}

func (r *Runner) setFetchErr(err error) {
	r.mu.Lock()
	r.fetchErr = err
	r.mu.Unlock()
}

// Run binds the durable consumer and handles messages until ctx is
// cancelled; then it drains: it stops pulling, hands fetched but unstarted
// messages back to the server for immediate redelivery, lets in-flight
// handlers finish (until Config.DrainTimeout) and returns nil. It returns an
// error when the consumer cannot be bound or the connection is closed. A
// Runner runs once.
func (r *Runner) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return fmt.Errorf("consumer %s: Run called twice", r.cfg.Service)
	}
	r.started = true
	r.mu.Unlock()
	defer r.setState(ErrStopped)

	cons, err := r.bind(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.store.seen = time.Now() // the first store check after StoreCheckEvery idle
	r.mu.Unlock()
	r.setState(nil)
	r.log.Info().Str("stream", r.cfg.Stream).Str("consumer", r.cfg.Consumer).
		Int("concurrency", r.cfg.Concurrency).Int("max_in_flight", r.window).Bool("keyed", r.cfg.Key != nil).
		Int("max_deliver", r.consumerMaxDeliver).
		Int("handler_deliveries", r.maxDeliver).Msg("consumer started")

	// Handlers get a context that survives ctx's cancellation by
	// DrainTimeout, so in-flight work finishes during a drain.
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hcancel()
	// Handlers (and what they call: streamread.KeyValue's healing) log with
	// the service's logger through zerolog.Ctx.
	hctx = r.log.WithContext(hctx)

	pl := r.newPipeline(ctx, hctx)
	stopDrain := context.AfterFunc(ctx, func() { r.drain(hctx, hcancel, pl) })
	defer stopDrain()
	err = r.pull(ctx, cons, pl)
	pl.close()
	// Acks are published without waiting for the server's answer: flush
	// them before returning, so a clean stop leaves nothing to redeliver.
	if ferr := r.js.Conn().FlushTimeout(SettleTimeout); ferr != nil && err == nil && !r.js.Conn().IsClosed() {
		r.log.Warn().Err(ferr).Msg("flush acks on stop (unflushed ones are redelivered after AckWait; their outputs deduplicate)")
	}
	if err != nil {
		r.log.Error().Err(err).Msg("consumer stopped")
		return err
	}
	r.log.Info().Msg("consumer drained and stopped")
	return nil
}

// drainPoll is how often a drain checks whether writes are failing.
const drainPoll = 100 * time.Millisecond

// drain bounds a drain (Run's ctx has ended): in-flight handlers may run
// for DrainTimeout, unless the runner's writes are failing (storeErr),
// now or as the drain goes on. Then nothing in flight can be stored, and
// waiting for it only keeps the process from stopping (a server whose
// disk is full answers no publish): handlers are cancelled and outputs no
// longer awaited at once, and their inputs, unacknowledged, are
// redelivered later, their outputs deduplicated. A runner with store
// checks (Config.StoreCheckEvery) makes one as the drain begins, so
// handlers stuck on writes nobody answers do not hold the drain for
// DrainTimeout before any of their writes has failed.
func (r *Runner) drain(hctx context.Context, hcancel context.CancelFunc, pl *pipeline) {
	if r.cfg.StoreCheckEvery > 0 {
		go r.checkStore(hctx, true)
	}
	deadline := time.NewTimer(r.cfg.DrainTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	for {
		if err := r.storeErr(); err != nil {
			r.log.Warn().Err(err).Msg("draining while writes are not stored: in-flight messages are left for redelivery")
			pl.giveUp()
			hcancel()
			return
		}
		select {
		case <-hctx.Done():
			return // Run is over
		case <-deadline.C:
			hcancel()
			return
		case <-tick.C:
		}
	}
}

// bind finds (or creates, with Config.ConsumerConfig) the durable consumer
// and resolves MaxDeliver against it.
func (r *Runner) bind(ctx context.Context) (jetstream.Consumer, error) {
	var (
		cons jetstream.Consumer
		err  error
	)
	if cc := r.cfg.ConsumerConfig; cc != nil {
		want := *cc
		want.Durable, want.Name = r.cfg.Consumer, r.cfg.Consumer
		cons, err = r.js.CreateOrUpdateConsumer(ctx, r.cfg.Stream, want)
	} else {
		cons, err = r.js.Consumer(ctx, r.cfg.Stream, r.cfg.Consumer)
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			err = fmt.Errorf("%w (apply the topology first: topology.Apply or failbus dev)", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("consumer %s: bind %s/%s: %w", r.cfg.Service, r.cfg.Stream, r.cfg.Consumer, err)
	}
	r.pos.snapshot(cons.CachedInfo())
	info := cons.CachedInfo().Config
	if info.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("%w: consumer %s/%s has ack policy %s, want explicit", ErrInvalidConfig, r.cfg.Stream, r.cfg.Consumer, info.AckPolicy)
	}
	md, err := resolveMaxDeliver(r.cfg.MaxDeliver, info.MaxDeliver)
	if err != nil {
		return nil, fmt.Errorf("%w (consumer %s/%s)", err, r.cfg.Stream, r.cfg.Consumer)
	}
	r.maxDeliver, r.consumerMaxDeliver = md, info.MaxDeliver
	r.ackWait = info.AckWait
	// The window never exceeds what the server lets the consumer have
	// unacknowledged: MaxAckPending is the backpressure.
	r.window = r.cfg.MaxInFlight
	if info.MaxAckPending > 0 {
		r.window = min(r.window, info.MaxAckPending)
	}
	if info.MaxDeliver > 0 && md >= info.MaxDeliver {
		r.log.Warn().Int("handler_deliveries", md).Int("max_deliver", info.MaxDeliver).
			Msg("no spare delivery: a message whose last delivery dies with the process is dropped by the server without a dead letter; leave MaxDeliver below the consumer's")
	}
	return cons, nil
}

// pull fetches batches and hands each message to a free worker until ctx
// ends. It returns nil on cancellation and an error only when the
// connection is closed for good.
func (r *Runner) pull(ctx context.Context, cons jetstream.Consumer, pl *pipeline) error {
	lastSnap, idle := time.Now(), false
	for ctx.Err() == nil {
		if since := time.Since(lastSnap); since >= snapshotEvery || idle && since >= idleSnapshotEvery {
			lastSnap = time.Now()
			ictx, cancel := context.WithTimeout(ctx, SettleTimeout)
			if info, err := cons.Info(ictx); err == nil {
				r.pos.snapshot(info)
			}
			cancel()
		}
		// The pull is not cancelled with ctx: a cancelled pull request
		// stays on the server until it expires, and messages it delivers
		// then would wait out their AckWait. Ending naturally after
		// FetchWait, and handing back what arrives, avoids that.
		// A pull asks only for what the window has room for, and waits
		// until it has room for a whole batch: asking for whatever
		// trickled free would make a pull request per message once the
		// window is full (the workers slower than the server).
		n, ok := pl.reserve(ctx, min(r.cfg.FetchBatch, r.window))
		if !ok {
			break // shutting down
		}
		batch, err := cons.Fetch(n, jetstream.FetchMaxWait(r.cfg.FetchWait))
		idle = true
		used := 0
		if err == nil {
			for raw := range batch.Messages() {
				idle = false
				if used < n {
					used++
					pl.dispatch(ctx, raw)
				} else {
					pl.later = append(pl.later, raw) // cannot happen: the pull asked for n
				}
			}
			err = batch.Error()
		}
		pl.unreserve(n - used)
		if err == nil {
			r.setFetchErr(nil)
			if idle {
				r.checkStore(ctx, false)
			}
			continue
		}
		if errors.Is(err, nats.ErrConnectionClosed) || r.js.Conn().IsClosed() {
			return fmt.Errorf("consumer %s: %w", r.cfg.Service, nats.ErrConnectionClosed)
		}
		r.m.fetchErrors.WithLabelValues(r.cfg.Service).Inc()
		if consumerGone(err) && ctx.Err() == nil {
			hctx, cancel := context.WithTimeout(ctx, SettleTimeout)
			healed, herr := r.heal(hctx, err)
			cancel()
			if herr == nil {
				cons = healed
				r.setFetchErr(nil)
				continue
			}
			err = fmt.Errorf("%w; not recreated: %w", err, herr)
		}
		r.setFetchErr(err)
		r.log.Warn().Err(err).Str("stream", r.cfg.Stream).Str("consumer", r.cfg.Consumer).Msg("pull failed")
		t := time.NewTimer(fetchErrorPause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return nil
}

// resolveMaxDeliver is the last delivery on which the handler runs, given
// Config.MaxDeliver (0: default) and the consumer's MaxDeliver (<= 0: no
// limit). By default it leaves the consumer one spare delivery: the server
// stops delivering after its MaxDeliver, so if the process died during the
// handler's last delivery, the spare one is what lets the runner still
// dead-letter the message (without running the handler again) instead of
// the server dropping it silently.
func resolveMaxDeliver(want, consumerMax int) (int, error) {
	switch {
	case want == 0 && consumerMax > 1:
		return consumerMax - 1, nil
	case want == 0 && consumerMax == 1:
		return 1, nil // no room for a spare; the warning says so
	case want == 0:
		return defaultMaxDeliver, nil // the server never gives up: every later delivery is a spare
	case consumerMax > 0 && want > consumerMax:
		return 0, fmt.Errorf("%w: MaxDeliver %d exceeds the consumer's MaxDeliver %d: the server would drop messages before they are dead-lettered",
			ErrInvalidConfig, want, consumerMax)
	}
	return want, nil
}
