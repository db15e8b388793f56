// Package classifier is the classifier service: outcomes in, one
// classification per outcome out on failbus.classified.<provider>.<class>.
// It is a Handler for the consumer runner, so the same code runs as
// cmd/classifier and inside `failbus dev`.
//
// Exactly once: each classification carries Nats-Msg-Id
// "classifier:<outcome id>:0" (msgid.Output), so an outcome that is
// redelivered after a crash yields no second classification as long as the
// redelivery falls inside FAILBUS_CLASSIFIED's duplicate window. Outcomes
// that do not decode or validate go to failbus.dlq.classifier with the
// reason. Segment boundaries on the same stream are acknowledged and
// otherwise ignored here: the refusal tiers read them with their own
// consumer.
package classifier

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/limitstore"
	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/policy/limits"
	"github.com/failbus/failbus/internal/prom"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// Name is the service name: the metrics label, the dead-letter subject
// failbus.dlq.classifier and the prefix of its outputs' Nats-Msg-Id.
const Name = "classifier"

// DefaultOpsAddr is where cmd/classifier serves /metrics and /healthz unless
// told otherwise. Each service has its own port (classifier 9401), so they
// can run side by side on one host.
const DefaultOpsAddr = "127.0.0.1:9401"

// DefaultConcurrency is how many outcomes the classifier handles at once.
// Classification is pure and independent per outcome, but the order it
// stores them in is the order the scheduler observes them in: one agent's
// outcomes of a provider (one subject) are handled by one worker, in order
// (see New).
const DefaultConcurrency = 4

// ClassifyFunc classifies one outcome; classify.Classify and
// (*classify.Classifier).Classify fit.
type ClassifyFunc func(*events.Outcome) events.Classification

// Config configures the classifier service.
type Config struct {
	// Policy is the policy whose classification stage runs: its classify
	// rules, and its retry section for the classes' retryability "after
	// policy" (engine.Classify). Defaults to policy.Default().
	Policy *policy.Policy

	// Classify, when set, replaces the policy's classification (a plug-in
	// classifier); the outcome's identity and context are still completed
	// (engine.Complete).
	Classify ClassifyFunc

	// Runner holds the consumer runner settings: Logger, Registerer,
	// Concurrency (defaults to DefaultConcurrency here), Key (defaults to
	// the outcome's subject here: one agent's outcomes of a provider in
	// order), Middleware,
	// FetchWait, DrainTimeout and so on. Service, Stream, Consumer and Decode
	// are set by the classifier (the topology's `classifier` consumer on
	// FAILBUS_OUTCOMES, decoding done by the handler) and must be left empty.
	Runner consumer.Config
}

// Service is the classifier service: a consumer runner on the topology's
// `classifier` consumer around the engine's classification stage. Run,
// Healthy and Gatherer are the runner's.
type Service struct {
	*consumer.Runner
}

// New builds the classifier service on a consumer runner bound to the
// topology's `classifier` consumer. Apply the topology before Run. Its
// metrics go to opts.Runner.Registerer (or the runner's own registry, see
// Runner.Gatherer).
func New(js jetstream.JetStream, opts Config) (*Service, error) {
	cfg := opts.Runner
	if cfg.Service != "" || cfg.Stream != "" || cfg.Consumer != "" || cfg.Decode {
		return nil, fmt.Errorf("%w: classifier sets Service, Stream, Consumer and Decode itself", consumer.ErrInvalidConfig)
	}
	cfg.Service, cfg.Stream, cfg.Consumer = Name, topology.StreamOutcomes, topology.ConsumerClassifier
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.Key == nil {
		cfg.Key = sessionLane
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	fn := opts.Classify
	if fn == nil {
		eng, err := engine.New(engine.Config{Policy: opts.Policy})
		if err != nil {
			return nil, fmt.Errorf("classifier: %w", err)
		}
		fn = eng.Classify
	}
	pol := opts.Policy
	if pol == nil {
		pol = policy.Default()
	}
	g := &gate{providers: limitstore.NewProviders(js, pol.Limits.WithDefaults(), nil), notify: limitstore.NewNotifier(js, Name, nil)}
	h, err := newHandler(fn, g, cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r, err := consumer.New(js, cfg, h)
	if err != nil {
		return nil, fmt.Errorf("classifier: %w", err)
	}
	return &Service{Runner: r}, nil
}

// newHandler returns the classifier's message handler, registering its
// metrics with reg: failbus_classifier_classified_total{class} and
// failbus_classifier_overrules_total{claimed,final}, the rate at which
// evidence demotes a heuristic's or an upstream code's claim (evidence beats heuristics).
// Metrics count handler runs, so a redelivered outcome counts again.
// classify nil selects classify.Classify (the default policy's rules, the
// contract's retryability); whatever classifies, the outcome's identity and
// context are completed by engine.Complete.
func newHandler(classifyFn ClassifyFunc, g *gate, reg prometheus.Registerer) (consumer.Handler, error) {
	if classifyFn == nil {
		classifyFn = classify.Classify
	}
	if reg == nil {
		return nil, fmt.Errorf("%w: classifier: nil Registerer", consumer.ErrInvalidConfig)
	}
	classes, err := prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "failbus_classifier_classified_total",
		Help: "Outcomes classified, by class.",
	}, []string{"class"}))
	if err != nil {
		return nil, fmt.Errorf("classifier: %w", err)
	}
	overrules, err := prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "failbus_classifier_overrules_total",
		Help: "Classifications where evidence overruled the class a heuristic or upstream_code claimed, by claimed and final class.",
	}, []string{"claimed", "final"}))
	if err != nil {
		return nil, fmt.Errorf("classifier: %w", err)
	}
	refused, err := prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "failbus_limits_refused_total",
		Help: "Agents' records refused because the agent (or all agents) reached a policy limit, by service and limit; each is a dead letter naming the limit and the agent.",
	}, []string{"service", "limit"}))
	if err != nil {
		return nil, fmt.Errorf("classifier: %w", err)
	}
	return func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		if strings.HasPrefix(m.Subject, segmentPrefix) {
			return nil // boundaries are the refusal tiers' business
		}
		o, err := consumer.ValueAs[*events.Outcome](m) // decoded once, by sessionLane
		if err != nil {
			return consumer.DeadLetter("decode outcome: " + err.Error())
		}
		if err := g.admit(ctx, o.Agent, o.Provider); err != nil {
			var ex *limits.Exceeded
			if !errors.As(err, &ex) {
				return err // the store: redelivered after the backoff
			}
			refused.WithLabelValues(Name, ex.Limit).Inc()
			if nerr := g.notify.Tell(ctx, ex); nerr != nil {
				zerolog.Ctx(ctx).Warn().Err(nerr).Msg("limit notification not requested; asked again at the next refusal")
			}
			return consumer.DeadLetter(err.Error())
		}
		c := classifyFn(o)
		engine.Complete(&c, o)
		classes.WithLabelValues(c.Class).Inc()
		if c.Overruled != "" {
			overrules.WithLabelValues(c.Overruled, c.Class).Inc()
		}
		out.Publish(events.ClassifiedSubject(o.Provider, c.Class), &c, "")
		return nil
	}, nil
}

// gate keeps each agent within its share of the providers
// (internal/policy/limits); nil admits everything.
type gate struct {
	providers *limitstore.Providers
	notify    *limitstore.Notifier
}

func (g *gate) admit(ctx context.Context, agent, provider string) error {
	if g == nil {
		return nil
	}
	return g.providers.Admit(ctx, agent, provider)
}

// sessionLane is the runner's Key: the outcome's agent, session and
// provider — engine.SessionLane, the order the scheduler keeps too.
// A session's outcomes of a provider are classified one at a time and
// published in their order, the order `failbus simulate` reads them in,
// so the decisions of one session's backlog match simulate's (the fault
// scope counts each failure at its own `at` whatever the order, but
// declares an outage only once every failure of the rule has arrived:
// stored in any order, a backlog's outage could begin a few decisions
// later than simulate says). Other sessions run in parallel, also the
// sessions of one busy agent (a gateway or a coordinator that reports its
// subagents' calls under one name). The decoded outcome is left in
// m.Value for the handler; a boundary, or an outcome that does not
// decode, has no key (any worker).
func sessionLane(m *consumer.Msg) string {
	if strings.HasPrefix(m.Subject, segmentPrefix) {
		return ""
	}
	o, err := consumer.ValueAs[*events.Outcome](m)
	if err != nil {
		return ""
	}
	return engine.SessionLane(o.Agent, o.Session, o.Provider)
}

// segmentPrefix starts the subjects of context-segment boundaries, which
// share the outcomes' stream.
const segmentPrefix = events.SegmentPrefix + "."
