// Package devbus is failbus in one process: an embedded nats-server with
// the topology applied and every service of the registry
// (internal/servicespec) built through the same Spec its own binary uses. It
// is what `failbus dev` runs, and the throwaway bus of `failbus demo` and
// `failbus bench`.
package devbus

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/internal/servicespec"
	topology "github.com/failbus/failbus/jetstream"
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
	// servicespec.All() with every flag at its default.
	Specs []daemon.Spec
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
	check  serverCheck
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
		specs = servicespec.All()
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
	if err := topology.Apply(actx, b.JS, daemon.TopologyOptions(pol, replicas, o.AckWait)); err != nil {
		return nil, fmt.Errorf("apply topology: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	b.cancel = stop
	env := daemon.Env{Policy: pol, PolicyFile: o.PolicyFile, Log: o.Log, Registry: reg}
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
	b.wg.Go(func() { b.watchServer(ctx, serverCheckEvery, b.serverHealthy) })
	return b, nil
}

// ErrServerCannotStore is the bus's failure once its embedded server can
// no longer store (serverHealthy): a stream that failed a write (no space
// left on the device, say) refuses every later write until the server
// restarts, and nats-server cannot restart its JetStream in the process.
// `failbus dev` exits non-zero then, for a supervisor to start it again
// once the disk has room; what was stored before is kept.
var ErrServerCannotStore = errors.New("the embedded nats-server cannot store")

// Bounds of the embedded server's checks.
const (
	// serverCheckEvery is how often a running bus asks its server whether
	// it can still store (two failed answers in a row stop the bus).
	serverCheckEvery = time.Second
	// serverCheckTimeout is how long the server's health check may take
	// before the server counts as unable to store: the check waits for
	// each stream's lock, which a stream stuck on its store holds for good
	// (nats-server 2.15.2 deadlocks a stream whose purge fails a write, a
	// full disk for one).
	serverCheckTimeout = 5 * time.Second
	// ServerShutdownTimeout bounds the embedded server's shutdown in Stop:
	// a stream stuck on its store never stops.
	ServerShutdownTimeout = 10 * time.Second
)

// serverCheck is the one server health check in flight at a time.
type serverCheck struct {
	mu      sync.Mutex
	running chan struct{} // closed when the check in flight is done; nil: none
	started time.Time
	err     error // the last check's answer
}

// serverHealthy is the embedded server's own health check, nats-server's
// /healthz without the HTTP: JetStream enabled and every stream without a
// write error, answered within serverCheckTimeout. Callers share the
// check in flight, so a server that stopped answering costs one goroutine,
// not one per /healthz request. A bus of several nodes is not judged by
// any one of them (Options.Nodes): a node whose disk fails shuts its own
// JetStream down and the others go on, and a node is stopped on purpose
// now and then; its services' own checks say whether it can store.
func (b *Bus) serverHealthy() error {
	if len(b.Nodes) > 1 {
		return nil
	}
	c := &b.check
	c.mu.Lock()
	if c.running == nil {
		done := make(chan struct{})
		c.running, c.started = done, time.Now()
		go func() {
			err := cannotStore(b.Srv.NATS().Healthz(&server.HealthzOptions{Details: true}))
			c.mu.Lock()
			c.err, c.running = err, nil
			c.mu.Unlock()
			close(done)
		}()
	}
	running, started := c.running, c.started
	c.mu.Unlock()
	wait := time.NewTimer(max(serverCheckTimeout-time.Since(started), 0))
	defer wait.Stop()
	select {
	case <-running:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.err
	case <-wait.C:
		return fmt.Errorf("%w: its health check has not answered for %v (a stream stuck on its store)",
			ErrServerCannotStore, time.Since(started).Round(time.Second))
	}
}

// cannotStore reads nats-server's health, asked with details: an error
// of its JetStream, an account, a stream or a consumer means the server
// cannot store (ErrServerCannotStore, naming each). Its readiness check
// (CONNECTION) is not such an error: the server is started and listening
// long before, and that check gives itself one millisecond, which a
// goroutine taken off its core on a saturated machine overruns ("failed
// to be ready for connections after 1ms", seen under a storm on 2 cores,
// which stopped failbus dev as if its disk had failed). The server skips
// the other checks then; the next check asks again.
func cannotStore(st *server.HealthStatus) error {
	var errs []string
	for _, e := range st.Errors {
		if e.Type == server.HealthzErrorConn {
			continue
		}
		what := e.Type.String()
		if e.Stream != "" {
			what += " " + e.Stream
		}
		if e.Consumer != "" {
			what += " > " + e.Consumer
		}
		errs = append(errs, what+": "+e.Error)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrServerCannotStore, strings.Join(errs, "; "))
}

// watchServer fails the bus (Failed, Stop's error) once its server cannot
// store: check, run every interval until ctx ends, failed twice in a row.
// A server that cannot store keeps failing (a stream's write error stays
// until the server restarts; a check stuck on a stream's lock stays
// stuck), while a check that failed once and then passed saw a moment,
// not the store: a stream created or deleted under its scan of the store
// folder, say. Stopping the whole bus on one such answer would stop every
// service for nothing.
func (b *Bus) watchServer(ctx context.Context, interval time.Duration, check func() error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last error
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := check()
		if ctx.Err() != nil {
			return
		}
		if err != nil && last != nil {
			b.mu.Lock()
			b.errs = append(b.errs, err)
			b.mu.Unlock()
			b.once.Do(func() { close(b.failed) })
			return
		}
		last = err
	}
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
func (b *Bus) startService(ctx context.Context, spec daemon.Spec, env daemon.Env, o Options) error {
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

// Healthy is the /healthz check: the embedded server can store
// (serverHealthy) and every service is healthy.
func (b *Bus) Healthy() error {
	return errors.Join(b.serverHealthy(), ops.AllHealthy(b.health...)())
}

// Stop drains every service (each finishes its in-flight messages, unless
// its writes are not stored), then closes the connections and shuts the
// server down, waiting at most ServerShutdownTimeout for it. It returns
// the errors of services that stopped on their own before, and the bus's
// own (ErrServerCannotStore).
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
	down := make(chan struct{})
	go func() {
		sg.Wait()
		close(down)
	}()
	select {
	case <-down:
	case <-time.After(ServerShutdownTimeout):
		b.mu.Lock()
		b.errs = append(b.errs, fmt.Errorf("the embedded nats-server did not shut down within %v (a stream stuck on its store): left as it is", ServerShutdownTimeout))
		b.mu.Unlock()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return errors.Join(b.errs...)
}
