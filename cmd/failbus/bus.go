package main

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

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/service/classifier"
	"github.com/failbus/failbus/internal/service/notifier"
	"github.com/failbus/failbus/internal/service/refusals"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/servicemain"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/policy"
)

// service is a failbus service run inside `failbus dev` and `failbus demo`:
// Run until its context ends, then drain and return nil; Healthy for
// /healthz. *consumer.Runner is one.
type service interface {
	Run(ctx context.Context) error
	Healthy() error
}

// serviceEnv is what every in-process service is built from.
type serviceEnv struct {
	js       jetstream.JetStream
	policy   *policy.Policy
	log      zerolog.Logger
	registry prometheus.Registerer
	// policyFile is where policy was read from ("" for none): the
	// scheduler follows its changes.
	policyFile string
}

// inProcess is one service of the in-process bus.
type inProcess struct {
	name string
	new  func(env serviceEnv) (service, error)
}

// services is every implemented service, in start order. A service's issue
// adds its line here, and dev and demo run it.
var services = []inProcess{
	{classifier.Service, newClassifier},
	{refusals.Service, newRefusals},
	{notifier.Service, newNotifier},
	{scheduler.Service, newScheduler},
}

func newClassifier(env serviceEnv) (service, error) {
	classify, err := env.policy.ClassifyFunc()
	if err != nil {
		return nil, fmt.Errorf("classifier policy: %w", err)
	}
	return classifier.NewRunner(env.js, classifier.Options{
		Classify: classify,
		Runner:   consumer.Config{Logger: env.log, Registerer: env.registry},
	})
}

// newNotifier runs the notifier with the policy's sinks; with none
// configured it writes every notification to the log sink.
func newNotifier(env serviceEnv) (service, error) {
	return notifier.New(context.Background(), env.js, notifier.Config{
		Notify: env.policy.Notify, Logger: env.log, Registerer: env.registry,
	})
}

// busOptions configure an in-process bus.
type busOptions struct {
	server     embedded.Options
	policy     *policy.Policy // nil: policy.Default()
	policyFile string         // where policy was read from; "" for none
	log        zerolog.Logger
}

// bus is an embedded nats-server with the topology applied and every
// service running against it.
type bus struct {
	srv      *embedded.Server
	nc       *nats.Conn
	js       jetstream.JetStream
	registry *prometheus.Registry
	names    []string
	health   []func() error

	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
	failed chan struct{} // closed when a service stops on its own
	once   sync.Once
}

// applyTimeout bounds applying the topology to a fresh embedded server.
const applyTimeout = 30 * time.Second

// startBus starts the server, applies the topology and starts every
// service. On error everything started is stopped again.
func startBus(o busOptions) (_ *bus, err error) {
	pol := o.policy
	if pol == nil {
		pol = policy.Default()
	}
	srv, err := embedded.Start(o.server)
	if err != nil {
		return nil, err
	}
	b := &bus{srv: srv, registry: prometheus.NewRegistry(), failed: make(chan struct{})}
	defer func() {
		if err != nil {
			b.stop()
		}
	}()
	b.nc, err = srv.Connect(nats.Name("failbus services"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	b.js, err = jetstream.New(b.nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	actx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	if err := topology.Apply(actx, b.js, servicemain.TopologyOptions(pol, 0)); err != nil {
		return nil, fmt.Errorf("apply topology: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	b.cancel = stop
	env := serviceEnv{js: b.js, policy: pol, policyFile: o.policyFile, log: o.log, registry: b.registry}
	for _, s := range services {
		svc, err := s.new(env)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		b.names = append(b.names, s.name)
		b.health = append(b.health, svc.Healthy)
		b.wg.Go(func() {
			err := svc.Run(ctx)
			if ctx.Err() == nil {
				// A service stopped while the bus runs: that is a failure
				// even when it says nil.
				if err == nil {
					err = errors.New("stopped")
				}
				b.mu.Lock()
				b.errs = append(b.errs, fmt.Errorf("%s: %w", s.name, err))
				b.mu.Unlock()
				b.once.Do(func() { close(b.failed) })
			}
		})
	}
	// Ready means every service is bound and answering (the route service
	// registered, consumers attached), so a caller's first request is not
	// lost to a start-up race.
	if err := b.waitHealthy(applyTimeout); err != nil {
		return nil, err
	}
	return b, nil
}

// waitHealthy polls the services' health until all are healthy, one fails,
// or the deadline passes.
func (b *bus) waitHealthy(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := b.healthy()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("services not healthy after %s: %w", limit, err)
		}
		select {
		case <-b.failed:
			b.mu.Lock()
			defer b.mu.Unlock()
			return fmt.Errorf("a service stopped while starting: %w", errors.Join(b.errs...))
		case <-tick.C:
		}
	}
}

// healthy is the /healthz check: every service healthy.
func (b *bus) healthy() error { return consumer.AllHealthy(b.health...)() }

// stop drains every service (each finishes its in-flight messages), then
// closes the connection and shuts the server down. It returns the errors of
// services that stopped on their own before.
func (b *bus) stop() error {
	if b.cancel != nil {
		b.cancel()
	}
	b.wg.Wait()
	if b.nc != nil {
		b.nc.Close()
	}
	if b.srv != nil {
		b.srv.Shutdown()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return errors.Join(b.errs...)
}
