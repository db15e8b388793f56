package dev

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/internal/status"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/policy"
)

// Defaults of `failbus dev`.
const (
	// DefaultDataDir is where dev stores JetStream data unless --data says
	// otherwise: a folder in the working directory, so a restart finds it.
	DefaultDataDir = "failbus-data"
	// DefaultDevOpsAddr serves /metrics and /healthz of every in-process
	// service. The separate service binaries use 9401 and up.
	DefaultDevOpsAddr = "127.0.0.1:9400"
	// ClusterAckWait is the consumers' lease on a first delivery with
	// --nodes 3 or 5: a message in flight to a node that is lost is
	// redelivered after it, so it bounds the stall of classification
	// (30s otherwise; docs/DEPLOY.md).
	ClusterAckWait = 5 * time.Second
)

// Command is `failbus dev`.
var Command = cli.Command{Name: "dev", Summary: "run an embedded NATS server with JetStream and every service in one process", Run: run}

const devUsage = `[--port N] [--data DIR] [--nodes 1|3|5] [--ack-wait D] [--policy FILE] [--ops-addr ADDR] [--sync-interval D | --sync-always] [--auth] [--max-store SIZE] [--max-payload SIZE] [--shutdown-timeout D]

Runs an embedded nats-server with JetStream storing in DIR, applies the
failbus topology, and runs every implemented service in this process. Prints
the client URL on stdout; logs go to stderr. SIGINT or SIGTERM drains the
services (in-flight messages finish) and exits 0; a drain that has not
ended after --shutdown-timeout (40s) exits 1, and one whose writes are not
stored ends at once (what was in flight is redelivered at the next start).

/healthz fails while a service cannot store or lost its consumer, and while
the embedded server cannot store: once a stream of it failed a write (the
disk full, say) it refuses every later one until the server restarts, so
failbus dev then exits 1, for a supervisor (or you) to start it again once
DIR has room; what was stored before is kept.

One failbus dev at a time may use DIR: it is locked while dev runs, and a
second one exits naming the first's PID.

Durability: data in DIR survives a restart of dev, also after SIGKILL. A
crash of the whole host (power loss, kernel panic) can lose what JetStream
acknowledged within the last --sync-interval (JetStream's default is 2m)
because the store is fsynced only that often; --sync-always fsyncs every
write instead, at a large cost in throughput.

--nodes 3 runs three nats-servers in this process instead of one, routed
to each other as a cluster on loopback (client ports N, N+1, N+2; stores
in DIR/n1, DIR/n2, DIR/n3), with every stream, consumer and bucket at 3
replicas and every service given all three URLs: a 3-node deployment to
try on a laptop. Lose a node and bring it back through the ops address:
POST /nodes/n2/stop, POST /nodes/n2/start (GET /nodes lists them). Its
consumers lease a first delivery for 5s (--ack-wait), not 30s: what was
in flight to a lost node is redelivered that much sooner, which bounds
the stall of classification (docs/DEPLOY.md measures it).

--auth runs the server with the users of 'failbus auth init' (one nkey per
role, each allowed only its own subjects), written to DIR/auth the first
time and kept after: a connection without credentials is refused, and each
service connects as its own role. Clients give --nkey DIR/auth/<role>.nk
(agent.nk for agents, operator.nk to read, admin.nk for everything).

Limits: --max-store caps the JetStream store (16GiB by default; the
topology's streams and buckets reserve 6.5GiB of it by their max_bytes, and
each stream drops its oldest messages when full). --max-payload is the
largest message the server accepts (8MiB). Sizes take B, KiB, MiB, GiB or
TiB.`

// run is `failbus dev`.
func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return dev(ctx, args, stdout, stderr)
}

// dev runs until ctx ends; runDev cancels it on SIGINT/SIGTERM.
func dev(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("dev", devUsage, stderr)
	port := fs.Int("port", cli.DefaultPort, "client port to listen on (loopback only); 0 picks a free one")
	data := fs.String("data", DefaultDataDir, "JetStream store folder; kept across restarts")
	nodes := fs.Int("nodes", 1, "nats-servers to run as a cluster on loopback: 1, 3 or 5 (replicas follow)")
	ackWait := fs.Duration("ack-wait", 0, "every consumer's lease on a first delivery (default 30s; 5s with --nodes 3 or 5)")
	policyFile := fs.String("policy", "", "policy YAML file (default: the built-in policy)")
	opsAddr := fs.String("ops-addr", DefaultDevOpsAddr, "address of /metrics and /healthz; \"off\" disables")
	syncInterval := fs.Duration("sync-interval", embedded.DefaultSyncInterval, "how often the store is fsynced; bounds what a host crash can lose")
	syncAlways := fs.Bool("sync-always", false, "fsync every write: nothing acknowledged is lost on a host crash; much slower")
	logLevel := fs.String("log-level", "info", "service log level: debug, info, warn, error")
	natsLog := fs.Bool("nats-log", false, "also print nats-server's own log")
	withAuth := fs.Bool("auth", false, "require credentials: the users of failbus auth init, written to DIR/auth; each service runs as its own role")
	maxStore := sizeFlag{n: embedded.DefaultMaxStore}
	fs.Var(&maxStore, "max-store", "JetStream store limit (the topology reserves 6.5GiB of it)")
	maxPayload := sizeFlag{n: int64(embedded.DefaultMaxPayload)}
	fs.Var(&maxPayload, "max-payload", "largest message the server accepts (at most 64MiB)")
	shutdownTimeout := fs.Duration("shutdown-timeout", daemon.DefaultShutdownTimeout, "after SIGINT/SIGTERM, exit 1 if the drain has not ended by then (what was in flight is redelivered at the next start)")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	if *port < 0 || *port > 65535-*nodes {
		return cli.UsageError(fs, stderr, "--port %d: not a port", *port)
	}
	if *nodes != 1 && *nodes != 3 && *nodes != 5 {
		return cli.UsageError(fs, stderr, "--nodes %d: 1, 3 or 5 (an odd count keeps a majority when a node is lost)", *nodes)
	}
	if *ackWait == 0 && *nodes > 1 {
		*ackWait = ClusterAckWait
	}
	if *ackWait != 0 && (*ackWait < topology.MinAckWait || *ackWait > time.Minute) {
		return cli.UsageError(fs, stderr, "--ack-wait %s: must be between %s and 1m", *ackWait, topology.MinAckWait)
	}
	if *syncInterval <= 0 {
		return cli.UsageError(fs, stderr, "--sync-interval must be positive")
	}
	if *shutdownTimeout <= 0 {
		return cli.UsageError(fs, stderr, "--shutdown-timeout must be positive")
	}
	if *data == "" {
		return cli.UsageError(fs, stderr, "--data must name a folder")
	}
	if maxStore.n < topology.DefaultReservedBytes {
		return cli.UsageError(fs, stderr, "--max-store %s: below the %s the topology reserves", maxStore, sizeFlag{n: topology.DefaultReservedBytes})
	}
	if maxPayload.n < 64<<10 || maxPayload.n > 64<<20 {
		return cli.UsageError(fs, stderr, "--max-payload %s: must be between 64KiB and 64MiB", maxPayload)
	}
	level, err := zerolog.ParseLevel(*logLevel)
	if err != nil {
		return cli.UsageError(fs, stderr, "--log-level %q: %v", *logLevel, err)
	}
	pol, err := loadPolicy(*policyFile)
	if err != nil {
		return cli.UsageError(fs, stderr, "%v", err)
	}
	log := cli.ConsoleLogger(stderr).Level(level)
	unlock, err := lockData(*data)
	if err != nil {
		fmt.Fprintf(stderr, "failbus dev: %v\n", err)
		return 1
	}
	defer unlock()
	if *port != 0 {
		// nats-server reports a taken port only by never becoming ready;
		// say it at once instead.
		for i := range *nodes {
			if err := portFree(*port + i); err != nil {
				fmt.Fprintf(stderr, "failbus dev: %v (another failbus dev or nats-server? use --port)\n", err)
				return 1
			}
		}
	}
	// The ops endpoints are bound before any service starts, so a taken
	// address is an error up front, not after a start and a drain.
	// /healthz says "starting" until the bus is up.
	registry := prometheus.NewRegistry()
	// The process's own figures, as each service binary serves them
	// (internal/daemon): process_cpu_seconds_total is how `failbus bench
	// --fleet --server` reads the CPU the bus spent.
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var running atomic.Pointer[devbus.Bus]
	health := func() error {
		if b := running.Load(); b != nil {
			return b.Healthy()
		}
		return errors.New("starting")
	}
	opsCtx, stopOps := context.WithCancel(context.Background())
	defer stopOps()
	// The live status page (internal/status), reading the bus once it is
	// up.
	page := status.NewServer(opsCtx, nil, 0, "starting: the bus is not up yet")
	opsURL := "off"
	if *opsAddr != "off" && *opsAddr != "" {
		endpoints := append(page.Routes(), nodeEndpoints(&running, log)...)
		bound, err := ops.Serve(opsCtx, *opsAddr, registry, health, log, endpoints...)
		if err != nil {
			fmt.Fprintf(stderr, "failbus dev: %v (use --ops-addr, or off)\n", err)
			return 1
		}
		opsURL = "http://" + bound
	}

	stopTracing, err := daemon.StartTracing(ctx, "dev", log)
	if err != nil {
		fmt.Fprintf(stderr, "failbus dev: %v\n", err)
		return 1
	}
	defer stopTracing()

	var users *auth.Set
	if *withAuth {
		if users, err = auth.Init(filepath.Join(*data, "auth"), nil); err != nil {
			fmt.Fprintf(stderr, "failbus dev: --auth: %v\n", err)
			return 1
		}
	}
	b, err := devbus.Start(devbus.Options{
		Server: embedded.Options{
			Dir:          *data,
			Port:         *port,
			SyncInterval: *syncInterval,
			SyncAlways:   *syncAlways,
			ServerName:   "failbus-dev",
			Logging:      *natsLog,
			MaxStore:     maxStore.n,
			MaxPayload:   int32(maxPayload.n),
		},
		Nodes:      *nodes,
		AckWait:    *ackWait,
		Policy:     pol,
		PolicyFile: *policyFile,
		Log:        log,
		Registry:   registry,
		Auth:       users,
	})
	if err != nil {
		fmt.Fprintf(stderr, "failbus dev: %v\n", err)
		return 1
	}
	running.Store(b)
	if opsURL != "off" {
		closeStatus, err := watchStatus(b, users, page, registry, log)
		if err != nil {
			fmt.Fprintf(stderr, "failbus dev: status page: %v\n", err)
			stopOps()
			_ = b.Stop()
			return 1
		}
		defer closeStatus() // after the bus stopped
	}
	syncDesc := syncInterval.String()
	if *syncAlways {
		syncDesc = "always"
	}
	dataDir := b.Srv.Dir()
	if len(b.Nodes) > 1 {
		dataDir = filepath.Dir(dataDir)
	}
	log.Info().Str("data", dataDir).Str("sync", syncDesc).Str("services", strings.Join(b.Names, ",")).
		Int("nodes", len(b.Nodes)).Str("ops", opsURL).Msg("failbus dev running")
	fmt.Fprintf(stdout, "failbus dev: NATS_URL=%s  (services: %s; data: %s; /metrics,/healthz: %s)\n",
		b.URL(), strings.Join(b.Names, ", "), dataDir, opsURL)
	if opsURL != "off" {
		fmt.Fprintf(stdout, "failbus dev: live status page: %s%s\n", opsURL, status.Path)
	}
	if len(b.Nodes) > 1 {
		names := make([]string, len(b.Nodes))
		for i, n := range b.Nodes {
			names[i] = n.Name
		}
		lose := "give --ops-addr to stop and start nodes"
		if opsURL != "off" {
			lose = "lose one: curl -X POST " + opsURL + "/nodes/n2/stop (then .../start)"
		}
		fmt.Fprintf(stdout, "failbus dev: %d nodes (%s) as cluster %s, every stream at %d replicas, a first delivery leased for %s; %s\n",
			len(b.Nodes), strings.Join(names, ", "), devbus.ClusterName, len(b.Nodes), *ackWait, lose)
	}
	if users != nil {
		fmt.Fprintf(stdout, "failbus dev: credentials required; users in %s: --nkey %s for agents, %s to read, %s for everything\n",
			users.ConfPath(), users.Seed(auth.RoleAgent), users.Seed(auth.RoleOperator), users.Seed(auth.RoleAdmin))
	}

	code := 0
	select {
	case <-ctx.Done():
		log.Info().Msg("signal received: draining")
	case <-b.Failed():
		log.Error().Msg("the bus failed: shutting down")
		code = 1
	}
	stopOps()
	stopped := make(chan error, 1)
	go func() { stopped <- b.Stop() }()
	timer := time.NewTimer(*shutdownTimeout)
	defer timer.Stop()
	select {
	case err := <-stopped:
		if errors.Is(err, devbus.ErrServerCannotStore) {
			log.Error().Err(err).Str("data", *data).Msg("JetStream cannot store in the data folder (no space left, say): " +
				"exiting 1 for a supervisor to start failbus dev again once it can; what was stored is kept " +
				"(a stream that failed a write refuses every later one until its server restarts)")
			code = 1
		} else if err != nil {
			log.Error().Err(err).Msg("service failure")
			code = 1
		}
	case <-timer.C:
		log.Error().Dur("shutdown_timeout", *shutdownTimeout).Err(b.Healthy()).
			Msg("still draining after --shutdown-timeout: exiting; in-flight messages are redelivered at the next start")
		return 1
	}
	log.Info().Msg("failbus dev stopped")
	return code
}

// nodeEndpoints are the ops endpoints that stop and start the nodes of
// the running bus (--nodes): GET /nodes, POST /nodes/{name}/stop and
// /start.
func nodeEndpoints(running *atomic.Pointer[devbus.Bus], log zerolog.Logger) []ops.Endpoint {
	act := func(verb string, do func(*devbus.Bus, string) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			b := running.Load()
			if b == nil {
				http.Error(w, "starting", http.StatusServiceUnavailable)
				return
			}
			name := r.PathValue("name")
			if err := do(b, name); err != nil {
				http.Error(w, err.Error(), http.StatusConflict)
				return
			}
			log.Warn().Str("node", name).Msg("node " + verb)
			fmt.Fprintf(w, "node %s %s\n", name, verb)
		}
	}
	return []ops.Endpoint{
		{Pattern: "GET /nodes", Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			b := running.Load()
			if b == nil {
				http.Error(w, "starting", http.StatusServiceUnavailable)
				return
			}
			for _, n := range b.Nodes {
				state := "stopped"
				if n.Running() {
					state = "running"
				}
				fmt.Fprintf(w, "%s %s %s %s\n", n.Name, state, n.URL(), n.Dir())
			}
		})},
		{Pattern: "POST /nodes/{name}/stop", Handler: act("stopped", (*devbus.Bus).StopNode)},
		{Pattern: "POST /nodes/{name}/start", Handler: act("started", (*devbus.Bus).StartNode)},
	}
}

// portFree checks that the loopback port can be listened on.
func portFree(port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort(embedded.DefaultHost, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("port %d: %w", port, err)
	}
	return l.Close()
}

// loadPolicy reads --policy, or returns the default policy for "".
func loadPolicy(path string) (*policy.Policy, error) {
	if path == "" {
		return policy.Default(), nil
	}
	p, err := policy.Load(path)
	if err != nil {
		return nil, fmt.Errorf("--policy %s: %w", path, err)
	}
	return p, nil
}

// watchStatus gives the status page and the consumers' lag gauges a
// connection of their own, as the operator under --auth: they read what
// `failbus status` reads, with the rights an operator has.
// The returned function closes the connection.
func watchStatus(b *devbus.Bus, users *auth.Set, page *status.Server, reg *prometheus.Registry, log zerolog.Logger) (func(), error) {
	o := connect.Options{Servers: b.URL()}
	if users != nil {
		o.Nkey = users.Seed(auth.RoleOperator)
	}
	c, err := connect.Connect(o, "status", connect.WithLogger(log))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(c.Conn)
	if err == nil {
		err = reg.Register(status.NewLagCollector(js))
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	page.SetCollector(status.NewCollector(js, nil))
	return c.Close, nil
}
