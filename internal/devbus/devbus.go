// Package devbus is failbus in one process: an embedded nats-server with
// the topology applied and every service of the registry
// (internal/services) built through the same Spec its own binary uses. It
// is what `failbus dev` runs, and the throwaway bus of `failbus demo` and
// `failbus bench`.
package devbus

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/servicemain"
	"github.com/failbus/failbus/internal/services"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/policy"
)

// StartTimeout bounds applying the topology and the services becoming
// healthy.
const StartTimeout = 30 * time.Second

// Options configure an in-process bus.
type Options struct {
	// Server is the embedded server's configuration (store folder, port,
	// sync). The zero value is a temporary store on a random port.
	Server embedded.Options
	// Policy every service runs. Defaults to policy.Default().
	Policy *policy.Policy
	// PolicyFile is where Policy was read from ("" for none): the
	// scheduler follows its changes.
	PolicyFile string
	// Log receives the services' logs. The zero logger writes nothing.
	Log zerolog.Logger
	// Registry receives every service's metrics. Defaults to a new
	// registry; pass one to serve /metrics before the bus starts.
	Registry *prometheus.Registry
	// Specs are the services to run, in start order. Defaults to
	// services.All() with every flag at its default.
	Specs []servicemain.Spec
	// Nodes, above 1, runs that many servers instead of one, routed to
	// each other as a cluster on loopback (`failbus dev --nodes 3`): store
	// folders <Server.Dir>/n1…, client ports Server.Port, Server.Port+1, …
	// (free ones for 0), the topology at Nodes replicas, every service
	// given every node's URL so it fails over. Server.Dir is required.
	Nodes int
	// AckWait is every consumer's lease on a first delivery
	// (topology.Options.AckWait); 0: the consumers' own (30s).
	AckWait time.Duration
	// Auth, when set, runs the server with these users (auth.Init's
	// directory; `failbus dev --auth`): a connection without credentials
	// is refused, the topology is applied as the admin, and each service
	// connects as its own role, with only that role's permissions. Without
	// it each service still has a connection of its own (as deployed).
	Auth *auth.Set
}

// Bus is an embedded nats-server with the topology applied and every
// service running against it.
type Bus struct {
	// Srv is the embedded server (the first node's, with several).
	Srv *embedded.Server
	// Nodes are the servers, in order (one, unless Options.Nodes).
	Nodes []*Node
	// JS is the admin's JetStream context (the topology, tools, tests);
	// each service has its own connection.
	JS jetstream.JetStream
	// Registry holds every service's metrics.
	Registry *prometheus.Registry
	// Names are the services running, in start order.
	Names []string

	conns  []*connect.Conn // the services' own connections
	health []func() error
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
	failed chan struct{} // closed when a service stops on its own
	once   sync.Once
}

// Start starts the server, applies the topology (with the settings that
// follow from the policy, as every service binary does) and starts every
// service; it returns once all are healthy. On error everything started
// is stopped again.
func Start(o Options) (_ *Bus, err error) {
	pol := o.Policy
	if pol == nil {
		pol = policy.Default()
	}
	specs := o.Specs
	if specs == nil {
		specs = services.All()
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if o.Auth != nil && o.Server.ConfigFile == "" {
		o.Server.ConfigFile = o.Auth.ConfPath()
	}
	nodeOpts, err := nodeOptions(o.Server, o.Nodes)
	if err != nil {
		return nil, err
	}
	b := &Bus{Registry: reg, failed: make(chan struct{})}
	for i, no := range nodeOpts {
		name := fmt.Sprintf("n%d", i+1)
		b.Nodes = append(b.Nodes, &Node{Name: name, opts: no})
	}
	defer func() {
		if err != nil {
			_ = b.Stop()
		}
	}()
	// Every goroutine a server starts (its client connections,
	// JetStream's stream and consumer loops) carries the profiler label
	// failbus=nats-server, each service's its own name (labelled): `go
	// tool pprof -tags` on a CPU profile of `failbus bench` or `failbus
	// dev` then splits the CPU between the server and each service.
	// Several nodes start together: each waits for its routes.
	var startErrs = make([]error, len(b.Nodes))
	var sg sync.WaitGroup
	for i, n := range b.Nodes {
		sg.Go(func() { startErrs[i] = n.start() })
	}
	sg.Wait()
	if err := errors.Join(startErrs...); err != nil {
		return nil, err
	}
	b.Srv = b.Nodes[0].Server()
	replicas := 0
	if len(b.Nodes) > 1 {
		replicas = len(b.Nodes)
		wctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
		err := waitJetStream(wctx, b.URL())
		cancel()
		if err != nil {
			return nil, fmt.Errorf("cluster of %d nodes: %w", len(b.Nodes), err)
		}
	}
	var admin *connect.Conn
	labelled(auth.RoleAdmin, func() { admin, err = b.connectAs(o.Auth, auth.RoleAdmin, o.Log) })
	if err != nil {
		return nil, err
	}
	b.JS, err = jetstream.New(admin.Conn)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	actx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	if err := topology.Apply(actx, b.JS, servicemain.TopologyOptions(pol, replicas, o.AckWait)); err != nil {
		return nil, fmt.Errorf("apply topology: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	b.cancel = stop
	env := servicemain.Env{Policy: pol, PolicyFile: o.PolicyFile, Log: o.Log, Registry: reg}
	for _, spec := range specs {
		var err error
		labelled(spec.Name, func() { err = b.startService(ctx, spec, env, o) })
		if err != nil {
			return nil, err
		}
	}
	// Ready means every service is bound and answering (the route service
	// registered, consumers attached), so a caller's first request is not
	// lost to a start-up race.
	if err := b.waitHealthy(StartTimeout); err != nil {
		return nil, err
	}
	return b, nil
}

// labelled runs fn on a goroutine of its own labelled failbus=name, and
// waits for it; the goroutines fn starts keep the label (a goroutine
// inherits its creator's labels), so CPU samples of a service's runner,
// workers and connection show under its name. (pprof.Do on the caller's
// goroutine would leave it without the labels it had: the bench's load.)
// A panic in fn is raised again on the caller's goroutine, as if fn
// had run there.
func labelled(name string, fn func()) {
	done := make(chan struct{})
	var panicked any
	go func() {
		defer close(done)
		defer func() { panicked = recover() }()
		pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels("failbus", name)))
		fn()
	}()
	<-done
	if panicked != nil {
		panic(panicked)
	}
}

// startService connects spec's service, builds it and runs it until the
// bus stops.
func (b *Bus) startService(ctx context.Context, spec servicemain.Spec, env servicemain.Env, o Options) error {
	// Its own connection, as each service has in production (under
	// Auth, as its role's user): one connection shared by every
	// service is one socket, one server-side read loop and one
	// client-side dispatcher for all of them, and measures (failbus
	// bench) a bus nobody deploys.
	c, err := b.connectAs(o.Auth, spec.Name, o.Log)
	if err != nil {
		return err
	}
	if env.JS, err = jetstream.New(c.Conn); err != nil {
		return fmt.Errorf("%s: jetstream: %w", spec.Name, err)
	}
	svc, err := spec.Build(ctx, env)
	if err != nil {
		return fmt.Errorf("%s: %w", spec.Name, c.Explain(err))
	}
	b.Names = append(b.Names, spec.Name)
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
			b.errs = append(b.errs, fmt.Errorf("%s: %w", spec.Name, err))
			b.mu.Unlock()
			b.once.Do(func() { close(b.failed) })
		}
	})
	return nil
}

// Denials are the permission violations the server reported to the
// services' own connections (Options.Auth): none, when every role's
// permissions cover what its service does.
func (b *Bus) Denials() []connect.Denial {
	var out []connect.Denial
	for _, c := range b.conns {
		out = append(out, c.Denials()...)
	}
	return out
}

// connectAs connects to the bus's server as role: with role's seed in set,
// or without credentials when set is nil.
func (b *Bus) connectAs(set *auth.Set, role string, log zerolog.Logger) (*connect.Conn, error) {
	o := connect.Options{Servers: b.URL()}
	if set != nil {
		if o.Nkey = set.Seed(role); o.Nkey == "" {
			return nil, fmt.Errorf("%s: no user for it in %s (run failbus auth init again)", role, set.Dir)
		}
	}
	c, err := connect.Connect(o, role, connect.WithLogger(log))
	if err != nil {
		return nil, err
	}
	b.conns = append(b.conns, c)
	return c, nil
}

// Failed is closed when a service stopped on its own; Stop returns why.
func (b *Bus) Failed() <-chan struct{} { return b.failed }

// waitHealthy polls the services' health until all are healthy, one fails,
// or the deadline passes.
func (b *Bus) waitHealthy(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := b.Healthy()
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

// Healthy is the /healthz check: every service healthy.
func (b *Bus) Healthy() error { return consumer.AllHealthy(b.health...)() }

// Stop drains every service (each finishes its in-flight messages), then
// closes the connections and shuts the server down. It returns the errors of
// services that stopped on their own before.
func (b *Bus) Stop() error {
	if b.cancel != nil {
		b.cancel()
	}
	b.wg.Wait()
	for _, c := range b.conns { // the admin's and every service's
		c.Close()
	}
	var sg sync.WaitGroup
	for _, n := range b.Nodes {
		sg.Go(n.stop)
	}
	sg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	return errors.Join(b.errs...)
}
