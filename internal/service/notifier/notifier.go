// Package notifier is the notifier service: the delivery.Notifier on the
// consumer runner, reading failbus.notify.> through the durable consumer
// "notifier". cmd/notifier and `failbus dev` start it; replicas share the
// consumer, the dedupe ledger and the budget, so any number of them
// delivers each notification once.
package notifier

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/prom"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// Name is the runner's service name: it names the dead-letter subject
// failbus.dlq.notifier, the audit subjects failbus.audit.notifier.<kind>
// and the metrics' service label.
const Name = delivery.DefaultService

// DefaultOpsAddr is where cmd/notifier serves /metrics and /healthz unless
// told otherwise: loopback, since the endpoints have no authentication.
const DefaultOpsAddr = "127.0.0.1:9404"

// bindTimeout bounds New's binding of the dedupe and budget buckets.
const bindTimeout = 10 * time.Second

// DefaultConcurrency is how many requests one replica handles at once.
// Notifications have no order to keep; sends to sinks that cannot
// deduplicate are still bounded by delivery.Config.MaxUnconfirmed.
const DefaultConcurrency = 8

// Config configures the service. Every field documents its default.
type Config struct {
	// Notify is the policy's notify section: the daily budget and the
	// sinks. Pass a loaded policy's (or policy.Default().Notify): the zero
	// value is a budget of 0, which holds back every non-critical
	// notification, and the log sink.
	Notify notification.Config
	// Routes, when set, replace the sinks built from Notify.Sinks (tests,
	// embedders with their own sinks). Defaults to delivery.Routes(Notify).
	Routes []delivery.Route
	// Getenv reads the sinks' secrets. Defaults to os.Getenv.
	Getenv func(string) string
	// HTTPClient is used by the HTTP sinks. Defaults to a shared client.
	HTTPClient *http.Client

	// DedupeLifetime, ClaimLease, MaxUnconfirmed and Replica are passed
	// to delivery.Config; see there for their defaults.
	DedupeLifetime time.Duration
	ClaimLease     time.Duration
	MaxUnconfirmed int
	Replica        string

	// Concurrency is how many requests are handled at once. Defaults to
	// DefaultConcurrency.
	Concurrency int
	// ConsumerConfig, when set, replaces the topology's "notifier"
	// consumer settings (created or updated on start); tests use it for
	// short AckWaits. Defaults to nil: the consumer topology.Apply made.
	ConsumerConfig *jetstream.ConsumerConfig
	// MaxDeliver is the delivery on which a still failing request is
	// dead-lettered. Defaults to the runner's choice: the consumer's
	// MaxDeliver (10) less one spare delivery, so a replica that dies on
	// the last run still dead-letters the request.
	MaxDeliver int
	// Heartbeat is how often a request being handled is marked in
	// progress. Defaults to a third of the consumer's AckWait.
	Heartbeat time.Duration
	// FetchWait is the runner's pull wait. Defaults to the runner's.
	FetchWait time.Duration
	// StoreCheckEvery is the runner's consumer.Config.StoreCheckEvery
	// (0: no store checks).
	StoreCheckEvery time.Duration

	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Logger receives the service's and the log sink's lines. The zero
	// value logs nothing.
	Logger zerolog.Logger
	// Registerer receives the runner's and the notifier's metrics.
	// Defaults to a new registry (see Runner().Gatherer()).
	Registerer prometheus.Registerer
}

// Service is a running notifier replica.
type Service struct {
	notifier  *delivery.Notifier
	runner    *consumer.Runner
	decisions *prometheus.CounterVec
}

// New builds the sinks, binds the buckets and prepares the runner. The
// topology must be applied (topology.Apply) unless cfg.ConsumerConfig is
// set; the buckets must exist in any case.
func New(js jetstream.JetStream, cfg Config) (*Service, error) {
	routes := cfg.Routes
	if routes == nil {
		var err error
		routes, err = delivery.Routes(cfg.Notify, delivery.BuildOptions{Getenv: cfg.Getenv, HTTPClient: cfg.HTTPClient, Log: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("notifier: sinks: %w", err)
		}
	}
	_, ccfg, ok := topology.Consumer(topology.ConsumerNotifier)
	if !ok {
		return nil, errors.New("notifier: the topology has no notifier consumer")
	}
	if cfg.ConsumerConfig != nil {
		ccfg = *cfg.ConsumerConfig
	}
	// MaxDeliver 0 lets the runner keep its spare delivery (the consumer's
	// MaxDeliver − 1 handler runs), so a replica dying on the last one still
	// dead-letters the request instead of losing it.
	maxDeliver := cfg.MaxDeliver
	hb := cfg.Heartbeat
	if hb == 0 {
		wait := ccfg.AckWait
		if len(ccfg.BackOff) > 0 {
			wait = ccfg.BackOff[0] // the server uses BackOff[0] as the first AckWait
		}
		if wait <= 0 {
			wait = 30 * time.Second
		}
		hb = wait / 3
	}
	concurrency := cfg.Concurrency
	if concurrency == 0 {
		concurrency = DefaultConcurrency
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}

	ctx, cancel := context.WithTimeout(context.Background(), bindTimeout)
	defer cancel()
	n, err := delivery.New(ctx, delivery.Config{
		JetStream:      js,
		Routes:         routes,
		DailyBudget:    cfg.Notify.DailyBudget,
		DedupeLifetime: cfg.DedupeLifetime,
		ClaimLease:     cfg.ClaimLease,
		MaxUnconfirmed: cfg.MaxUnconfirmed,
		Replica:        cfg.Replica,
		Service:        Name,
		Now:            cfg.Now,
		Log:            cfg.Logger.With().Str("service", Name).Logger(),
	})
	if err != nil {
		return nil, fmt.Errorf("notifier: %w", err)
	}
	decisions, err := prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "failbus_notifier_decisions_total",
		Help: "Notification requests by decision: sent, deduped, held_by_budget, failed (retried or dead-lettered), unrouted.",
	}, []string{"decision"}))
	if err != nil {
		return nil, fmt.Errorf("notifier: metrics: %w", err)
	}
	s := &Service{notifier: n, decisions: decisions}
	var cc *jetstream.ConsumerConfig
	if cfg.ConsumerConfig != nil {
		c := *cfg.ConsumerConfig
		cc = &c
	}
	s.runner, err = consumer.New(js, consumer.Config{
		Service:        Name,
		Consumer:       topology.ConsumerNotifier,
		Stream:         topology.StreamNotify,
		ConsumerConfig: cc,
		Decode:         true,
		Concurrency:    concurrency,
		// A send can take its sink's whole timeout. The runner keeps a
		// request queued in its window alive for at most ten AckWaits, so
		// a wide window behind slow sinks would let queued requests run
		// out and be redelivered (to another replica, where the dedupe
		// key still stops a second send, but late). Requests are few and
		// slow, not many and fast: the window stays at twice the senders,
		// enough to keep every sender busy.
		MaxInFlight:     2 * concurrency,
		MaxDeliver:      maxDeliver,
		FetchWait:       cfg.FetchWait,
		StoreCheckEvery: cfg.StoreCheckEvery,
		Middleware:      []consumer.Middleware{consumer.Heartbeat(hb)},
		Logger:          cfg.Logger,
		Registerer:      reg,
	}, s.Handle)
	if err != nil {
		return nil, fmt.Errorf("notifier: %w", err)
	}
	return s, nil
}

// Run consumes requests until ctx ends, then drains (see consumer.Runner).
func (s *Service) Run(ctx context.Context) error { return s.runner.Run(ctx) }

// Healthy reports nil while the service is consuming (the /healthz check;
// see consumer.Runner.Healthy).
func (s *Service) Healthy() error { return s.runner.Healthy() }

// Runner is the consumer runner, for its health check and metrics.
func (s *Service) Runner() *consumer.Runner { return s.runner }

// Notifier is the decision core, for operators and tests (budget reads).
func (s *Service) Notifier() *delivery.Notifier { return s.notifier }

// Handle is the consumer.Handler: one notification request in, a decision
// out. The request's identity is its stream position, unique per stored
// message and stable across redeliveries.
func (s *Service) Handle(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
	note, ok := m.Value.(*events.Notification)
	if !ok {
		return consumer.DeadLetterf("%s carries a %s, not a notification request", m.Subject, schemaOf(m.Value))
	}
	if err := notification.CheckSubject(m.Subject, *note); err != nil {
		return consumer.DeadLetter(err.Error()) // neither severity wins (CheckSubject)
	}
	res, err := s.notifier.Process(ctx, delivery.Request{
		ID:           m.Stream + ":" + fmt.Sprint(m.Seq),
		Notification: *note,
		LastDelivery: m.Last,
	})
	if err != nil {
		return err // the bus itself: the runner retries with backoff
	}
	if res.Kind != "" {
		s.decisions.WithLabelValues(res.Kind).Inc()
	}
	switch res.Action {
	case delivery.Retry:
		return consumer.Retry(res.After, res.Reason)
	case delivery.DeadLetter:
		return consumer.DeadLetter(res.Reason)
	}
	return nil
}

func schemaOf(v events.Message) string {
	if v == nil {
		return "nothing"
	}
	return v.SchemaName()
}
