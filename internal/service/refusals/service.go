// Package refusals is the refusal tiers on the bus: the
// pure core of internal/policy/refusal (State, Notice, RouteProviders) with
// durable state, consumers and a route service around it.
//
//   - Content refusals in: the topology's `refusals` consumer on
//     failbus.classified.*.content_refusal. Each refusal updates the state of
//     (segment, provider) in KV bucket FAILBUS_REFUSALS (key
//     Key) with compare-and-set on the revision, retried on
//     conflict, so agents and service replicas racing on one key never lose
//     a count. Out go the decision (rerender or skip_provider) on
//     failbus.decision.<agent> and, only at the first refusal and at
//     freezing, a notification request on failbus.notify.<severity>, both
//     through the runner's Outputs: a redelivered refusal republishes the
//     same message ids, and the record remembers the refusals it applied, so
//     a redelivery is neither counted twice nor worded differently.
//   - Boundaries in: the `refusals-boundaries` consumer on failbus.segment.>.
//     A boundary for `<session>#<n>` deletes the state of the session's
//     segments below n. The bucket TTL is the backstop for what no boundary
//     retires; a route that reads a state older than half the TTL rewrites
//     it unchanged (refusal.TouchDue), so a segment still in use never
//     expires into "never refused".
//   - Route: a nats.go micro service, ServiceName "failbus-refusals" (found
//     by `nats micro ls`), endpoint "route" on events.RefusalRouteSubject
//     (failbus.refusal.route), JSON events.RouteRequest in and
//     events.RouteRecord out. A due re-probe is claimed for the asking agent
//     (refusal.Record.Probe), so of two agents racing on one segment
//     only one sends the re-probe: at most 1 + len(reprobe_delays) sends per
//     segment and provider, as on the virtual clock.
//
// What is not guaranteed: two agents that both send a segment before any
// refusal of it is recorded both reach the provider (nothing was known yet);
// each of those refusals counts, so the provider only freezes sooner. A
// claimed probe that is not refused keeps other agents off that provider for
// the rest of its lease (Config.ProbeLease).
package refusals

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/prom"
	"github.com/failbus/failbus/internal/scopestore"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/policy"
)

// Names of the service. Name labels metrics and logs, names the
// dead-letter subject failbus.dlq.refusals and prefixes the Nats-Msg-Id of
// the decisions and notifications it publishes; BoundaryName does the same
// for boundaries (it publishes nothing but dead letters).
const (
	Name         = "refusals"
	BoundaryName = "refusals-boundaries"
	// ServiceName is the micro service name `nats micro ls` shows.
	ServiceName = "failbus-refusals"
	// ServiceVersion is the micro service's SemVer.
	ServiceVersion = "1.0.0"
	// RouteEndpoint is the micro endpoint name of route; its subject is
	// events.RefusalRouteSubject.
	RouteEndpoint = "route"
)

// Defaults of Config.
const (
	// DefaultConcurrency is how many refusals are handled at once.
	// Compare-and-set makes concurrent updates of one key safe, and the
	// state machine does not depend on arrival order (a late refusal never
	// moves the refusal time back).
	DefaultConcurrency = 4
	// DefaultOpsAddr is where a standalone refusals process would serve
	// /metrics and /healthz (the services use 9401 and up).
	DefaultOpsAddr = "127.0.0.1:9405"
	// DefaultRouteTimeout bounds the KV work of one route request.
	DefaultRouteTimeout = 5 * time.Second
)

// Config configure the refusal service. The zero value runs the default
// re-probe schedule (15m, 1h, 6h) with the defaults below.
type Config struct {
	// Policy is the policy's `refusal:` section. Defaults to
	// refusal.DefaultConfig() when it has no delays, no re-render
	// bound and no TTL (the zero value); otherwise it must Validate.
	Policy refusal.Config

	// ProbeLease is how long a claimed re-probe keeps other agents off the
	// provider when no refusal ends it sooner. Defaults to
	// refusal.DefaultProbeLease (5m). It must cover one LLM call and the way
	// of its refusal through the classifier and this service.
	ProbeLease time.Duration

	// Now is the route's clock. Defaults to time.Now. Refusal times come
	// from the classification's `at` (the outcome's), falling back to when
	// the stream stored the classification.
	Now func() time.Time

	// RouteTimeout bounds one route request's KV work. Defaults to
	// DefaultRouteTimeout (5s).
	RouteTimeout time.Duration

	// Runner holds settings shared by the two consumer runners: Logger,
	// Registerer, Concurrency (defaults to DefaultConcurrency for refusals;
	// boundaries always run one at a time), Middleware, FetchWait,
	// DrainTimeout, Backoff, MaxDeliver. Service, Stream, Consumer,
	// ConsumerConfig and Decode are set here and must be left empty.
	Runner consumer.Config
}

// Service is the refusal service: two consumer runners (refusals,
// boundaries) and the micro route service, sharing one Store. Create it with
// New and start it with Run; it satisfies the in-process service interface
// of `failbus dev` (Run, Healthy).
type Service struct {
	js    jetstream.JetStream
	cfg   refusal.Config
	lease time.Duration
	now   func() time.Time
	rtout time.Duration
	log   zerolog.Logger
	reg   prometheus.Registerer
	m     *metrics

	refusals   *consumer.Runner
	boundaries *consumer.Runner

	// eng runs the refusal, boundary and route stages on the bucket
	// (engineStore) and reads the fault scope (FAILBUS_SCOPE) to skip
	// providers in an outage.
	eng   *engine.Engine
	scope lateScope

	mu      sync.Mutex
	store   *Store
	micro   micro.Service
	touchAt refusal.Config // cfg with StateTTL = min(policy TTL, bucket TTL)
	state   error
}

// errNotStarted is Healthy's answer before Run has opened the bucket.
var errNotStarted = errors.New("refusals: not running")

// New checks opts and builds the service; it does no I/O. Errors for bad
// options wrap consumer.ErrInvalidConfig.
func New(js jetstream.JetStream, opts Config) (*Service, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: refusals: nil JetStream", consumer.ErrInvalidConfig)
	}
	cfg := opts.Policy
	if cfg.ReprobeDelays == nil && cfg.MaxRerenders == 0 && cfg.StateTTL == 0 {
		cfg = refusal.DefaultConfig()
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: refusals: %w", consumer.ErrInvalidConfig, err)
	}
	rc := opts.Runner
	if rc.Service != "" || rc.Stream != "" || rc.Consumer != "" || rc.ConsumerConfig != nil || rc.Decode {
		return nil, fmt.Errorf("%w: refusals sets Service, Stream, Consumer, ConsumerConfig and Decode itself", consumer.ErrInvalidConfig)
	}
	if opts.ProbeLease < 0 || opts.RouteTimeout < 0 {
		return nil, fmt.Errorf("%w: refusals: ProbeLease and RouteTimeout must not be negative", consumer.ErrInvalidConfig)
	}
	if rc.Registerer == nil {
		rc.Registerer = prometheus.NewRegistry()
	}
	m, err := newMetrics(rc.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Service{
		js: js, cfg: cfg, lease: opts.ProbeLease, now: opts.Now, rtout: opts.RouteTimeout,
		log: rc.Logger.With().Str("service", Name).Logger(), reg: rc.Registerer, m: m,
		state: errNotStarted, touchAt: cfg,
	}
	if s.lease == 0 {
		s.lease = refusal.DefaultProbeLease
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.rtout == 0 {
		s.rtout = DefaultRouteTimeout
	}
	pol := policy.Default()
	pol.Refusal = cfg
	if s.eng, err = engine.New(engine.Config{Policy: pol, Stores: engine.Stores{Refusals: engineStore{s}, Providers: &s.scope}}); err != nil {
		return nil, fmt.Errorf("refusals: %w", err)
	}

	refCfg := rc
	refCfg.Service, refCfg.Stream, refCfg.Consumer = Name, topology.StreamClassified, topology.ConsumerRefusals
	if refCfg.Concurrency == 0 {
		refCfg.Concurrency = DefaultConcurrency
	}
	refCfg.Key = segmentLane
	if s.refusals, err = consumer.New(js, refCfg, s.handleRefusal); err != nil {
		return nil, fmt.Errorf("refusals: %w", err)
	}
	bdCfg := rc
	bdCfg.Service, bdCfg.Stream, bdCfg.Consumer = BoundaryName, topology.StreamOutcomes, topology.ConsumerRefusalBoundaries
	bdCfg.Concurrency, bdCfg.FetchBatch = 1, 0
	if s.boundaries, err = consumer.New(js, bdCfg, s.handleBoundary); err != nil {
		return nil, fmt.Errorf("refusals: %w", err)
	}
	return s, nil
}

// Config is the refusal policy the service runs.
func (s *Service) Config() refusal.Config { return s.cfg }

// Gatherer returns the registry of the service's metrics when it is a
// prometheus.Gatherer (the default one is), for ops.Serve.
func (s *Service) Gatherer() prometheus.Gatherer {
	g, _ := s.reg.(prometheus.Gatherer)
	return g
}

// Store is the KV store once Run has opened it, else nil.
func (s *Service) Store() *Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.store
}

// Run opens the bucket, starts the route service and both consumers, and
// serves until ctx ends; then it stops the route service (in-flight requests
// are answered) and drains the consumers, and returns nil. It returns an
// error when something cannot start or a consumer stops on its own. Apply
// the topology first. A Service runs once.
func (s *Service) Run(ctx context.Context) (err error) {
	defer func() {
		s.mu.Lock()
		s.state = consumer.ErrStopped
		s.mu.Unlock()
	}()
	store, err := OpenStore(ctx, s.js)
	if err != nil {
		return err
	}
	touch := s.cfg
	if ttl, err := store.TTL(ctx); err != nil {
		return err
	} else if ttl > 0 && (touch.StateTTL <= 0 || ttl < touch.StateTTL) {
		touch.StateTTL = ttl
	}
	scope, err := scopestore.Open(ctx, s.js, scopestore.Options{Log: s.log})
	if err != nil {
		return fmt.Errorf("refusals: %w", err)
	}
	s.scope.Store = scope
	svc, err := s.startMicro(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.store, s.micro, s.touchAt, s.state = store, svc, touch, nil
	s.mu.Unlock()
	s.log.Info().Str("route", routeSubject()).Int64("probe_lease_ms", s.lease.Milliseconds()).
		Str("rule", refusal.Rule(s.cfg)).Msg("refusal tiers started")

	err = ops.RunAll(ctx, s.refusals, s.boundaries)
	if serr := svc.Stop(); serr != nil {
		s.log.Warn().Err(serr).Msg("stop route service")
	}
	return err
}

// Healthy reports nil while both consumers run and the route service
// serves; otherwise what is wrong. It is the /healthz check.
func (s *Service) Healthy() error {
	s.mu.Lock()
	state, svc := s.state, s.micro
	s.mu.Unlock()
	if state != nil {
		return fmt.Errorf("%s: %w", Name, state)
	}
	var errs []error
	if svc == nil || svc.Stopped() {
		errs = append(errs, fmt.Errorf("%s: route service %s stopped", Name, ServiceName))
	}
	errs = append(errs, s.refusals.Healthy(), s.boundaries.Healthy())
	return errors.Join(errs...)
}

// Run runs the refusal service on nc until ctx ends: the entry point of a
// process that runs it alone (apply the topology first). It is New and
// Service.Run.
func Run(ctx context.Context, nc *nats.Conn, opts Config) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("refusals: jetstream: %w", err)
	}
	s, err := New(js, opts)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// metrics are the service's own series beside the runners'.
type metrics struct {
	refusals      *prometheus.CounterVec
	replays       prometheus.Counter
	conflicts     *prometheus.CounterVec
	routes        *prometheus.CounterVec
	retired       prometheus.Counter
	touched       prometheus.Counter
	unreadable    prometheus.Counter
	notifications *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	var m metrics
	var err error
	reg1 := func(c prometheus.Collector) prometheus.Collector {
		if err != nil {
			return c
		}
		got, e := prom.Register(reg, c)
		if e != nil {
			err = e
			return c
		}
		return got
	}
	m.refusals = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "failbus_refusals_applied_total",
		Help: "Content refusals applied to refusal state, by resulting action (rerender, skip_provider) and whether the provider froze.",
	}, []string{"action", "frozen"})).(*prometheus.CounterVec)
	m.replays = reg1(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "failbus_refusals_replayed_total",
		Help: "Redelivered refusals recognised by outcome id and answered without counting them again.",
	})).(prometheus.Counter)
	m.conflicts = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "failbus_refusals_cas_conflicts_total",
		Help: "Compare-and-set conflicts on refusal state, retried, by operation (refusal, claim, touch).",
	}, []string{"op"})).(*prometheus.CounterVec)
	m.routes = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "failbus_refusals_route_providers_total",
		Help: "Providers answered by route, by verdict (free, claimed, held, skip).",
	}, []string{"verdict"})).(*prometheus.CounterVec)
	m.retired = reg1(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "failbus_refusals_retired_total",
		Help: "Refusal states deleted by segment boundaries.",
	})).(prometheus.Counter)
	m.touched = reg1(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "failbus_refusals_ttl_refreshed_total",
		Help: "Refusal states rewritten unchanged by route so a segment in use does not expire.",
	})).(prometheus.Counter)
	m.unreadable = reg1(prometheus.NewCounter(prometheus.CounterOpts{
		Name: "failbus_refusals_unreadable_total",
		Help: "Stored refusal values that could not be fully read (treated conservatively: frozen, no claim).",
	})).(prometheus.Counter)
	m.notifications = reg1(prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "failbus_refusals_notifications_total",
		Help: "Notification requests published for refusals, by severity.",
	}, []string{"severity"})).(*prometheus.CounterVec)
	if err != nil {
		return nil, fmt.Errorf("refusals: %w", err)
	}
	return &m, nil
}

// lateScope is the fault-scope store the route stage reads, bound by Run
// (New does no I/O); the engine holds a pointer to it.
type lateScope struct{ *scopestore.Store }
