// Package daemon is the start-up every failbus service binary shares:
// the common flags (each also read from an environment variable), logging,
// the policy file, the NATS connection, applying the topology, the metrics
// registry, /metrics and /healthz, and draining on SIGINT/SIGTERM. A
// cmd/<service>/main.go registers its own flags and builds its service;
// nothing else is repeated per binary.
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/internal/status"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/policy"
)

// ApplyTimeout bounds applying the topology at start.
const ApplyTimeout = 30 * time.Second

// DefaultShutdownTimeout bounds a service's stop after SIGINT/SIGTERM
// (--shutdown-timeout): the runners' drain (consumer.DefaultDrainTimeout)
// and the time to store and acknowledge what in-flight handlers produced.
// A drain whose writes are failing stops at once (the runner does not wait
// for a store that cannot answer); this is the bound for everything else.
const DefaultShutdownTimeout = consumer.DefaultDrainTimeout + 10*time.Second

// ErrShutdownTimeout: the service had not stopped within --shutdown-timeout
// of the signal; the process exits 1 and what was in flight is redelivered,
// as after SIGKILL.
var ErrShutdownTimeout = errors.New("did not stop in time")

// Service is what a binary runs: Run until ctx ends, then drain and return
// nil; Healthy answers /healthz.
type Service interface {
	Run(ctx context.Context) error
	Healthy() error
}

// Env is what a service is built from.
type Env struct {
	JS       jetstream.JetStream
	Policy   *policy.Policy
	Log      zerolog.Logger
	Registry prometheus.Registerer
	// PolicyFile is the --policy path ("" for the default policy).
	PolicyFile string
}

// Spec describes one service binary.
type Spec struct {
	// Name is the service's name in errors, logs and the NATS connection.
	Name string
	// DefaultOpsAddr is the default of --ops-addr; its environment
	// variable is FAILBUS_<NAME>_OPS_ADDR.
	DefaultOpsAddr string
	// Flags registers the binary's own flags (may be nil).
	Flags func(fs *flag.FlagSet)
	// Check validates the binary's own flags after parsing (may be nil).
	Check func() error
	// Build makes the service once connected and the topology applied.
	Build func(ctx context.Context, env Env) (Service, error)
}

type common struct {
	conn                          connect.Options
	opsAddr, policyFile, logLevel string
	replicas                      int
	ackWait                       time.Duration
	apply, noApply, checkHealth   bool
	shutdownTimeout               time.Duration
}

// Run is a whole service binary: it returns the exit code (0 after a
// drain, 1 when the service fails, 2 for unusable flags or policy).
func Run(ctx context.Context, spec Spec, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(spec.Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c common
	c.conn.Register(fs)
	c.conn.RegisterServerAlias(fs, "nats-url")
	opsEnv := "FAILBUS_" + upper(spec.Name) + "_OPS_ADDR"
	fs.StringVar(&c.opsAddr, "ops-addr", EnvString(opsEnv, spec.DefaultOpsAddr), "address of /metrics, /healthz and the live status page /status (env "+opsEnv+")")
	fs.StringVar(&c.policyFile, "policy", EnvString("FAILBUS_POLICY", ""), "policy file (env FAILBUS_POLICY); default policy when empty")
	fs.IntVar(&c.replicas, "replicas", EnvInt("FAILBUS_REPLICAS", topology.DefaultReplicas), "stream replicas when applying the topology (env FAILBUS_REPLICAS)")
	fs.DurationVar(&c.ackWait, "ack-wait", 0, "when applying the topology: every consumer's lease on a first delivery, what a node loss stalls for at most (default 30s; as failbus apply was given)")
	fs.BoolVar(&c.apply, "apply-topology", true, "create or update the streams, consumers and buckets at start")
	fs.BoolVar(&c.noApply, "no-apply", false, "do not touch the topology (same as --apply-topology=false): for a service running with its own role's credentials, while the admin applies the topology")
	fs.StringVar(&c.logLevel, "log-level", EnvString("FAILBUS_LOG_LEVEL", "info"), "debug, info, warn or error (env FAILBUS_LOG_LEVEL)")
	fs.BoolVar(&c.checkHealth, "check-health", false, "ask the running service's /healthz on --ops-addr and exit 0 when healthy, 1 when not (a container health check)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", EnvDuration("FAILBUS_SHUTDOWN_TIMEOUT", DefaultShutdownTimeout), "after SIGINT/SIGTERM, exit 1 if the drain has not ended by then (env FAILBUS_SHUTDOWN_TIMEOUT); what was in flight is redelivered")
	if spec.Flags != nil {
		spec.Flags(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "%s: %v\n", spec.Name, err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", spec.Name, fs.Args())
		return 2
	}
	if c.shutdownTimeout <= 0 {
		fmt.Fprintf(stderr, "%s: --shutdown-timeout %v: must be positive\n", spec.Name, c.shutdownTimeout)
		return 2
	}
	if c.checkHealth {
		return checkHealth(ctx, spec.Name, c.opsAddr, stderr)
	}
	if c.noApply {
		c.apply = false
	}
	c.conn = c.conn.WithEnv()
	if _, err := c.conn.Resolve(); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", spec.Name, err)
		return 2
	}
	if spec.Check != nil {
		if err := spec.Check(); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", spec.Name, err)
			return 2
		}
	}
	level, err := zerolog.ParseLevel(c.logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "%s: --log-level: %v\n", spec.Name, err)
		return 2
	}
	pol := policy.Default()
	if c.policyFile != "" {
		if pol, err = policy.Load(c.policyFile); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", spec.Name, err)
			return 2
		}
	}
	log := zerolog.New(stderr).Level(level).With().Timestamp().Logger()
	if c.policyFile != "" {
		log.Info().Str("policy", c.policyFile).Msg("policy loaded")
	}
	if err := serve(ctx, spec, c, pol, log); err != nil {
		log.Error().Err(err).Msg(spec.Name + " failed")
		return 1
	}
	return 0
}

// HealthCheckTimeout bounds --check-health.
const HealthCheckTimeout = 5 * time.Second

// checkHealth is --check-health: GET /healthz of the service listening on
// opsAddr (an unspecified host means this machine), 0 when it answers 200.
func checkHealth(ctx context.Context, name, opsAddr string, stderr io.Writer) int {
	host, port, err := net.SplitHostPort(opsAddr)
	if err != nil {
		fmt.Fprintf(stderr, "%s: --ops-addr %q: %v\n", name, opsAddr, err)
		return 2
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, HealthCheckTimeout)
	defer cancel()
	url := "http://" + net.JoinHostPort(host, port) + "/healthz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %s: %v\n", name, url, err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "%s: %s: %s %s\n", name, url, resp.Status, strings.TrimSpace(string(body)))
		return 1
	}
	return 0
}

// serve connects, applies the topology, builds the service, serves
// /metrics and /healthz, and runs it until ctx ends.
func serve(ctx context.Context, spec Spec, c common, pol *policy.Policy, log zerolog.Logger) error {
	nc, err := connect.Connect(c.conn, spec.Name, connect.WithLogger(log))
	if err != nil {
		return err
	}
	defer func() { _ = nc.Drain() }()
	log.Info().Str("server", nc.ConnectedUrlRedacted()).Str("user", nc.User()).Msg("connected to NATS")
	stopTracing, err := StartTracing(ctx, spec.Name, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if c.apply {
		actx, cancel := context.WithTimeout(ctx, ApplyTimeout)
		actx, stop := nc.FailFast(actx)
		err := topology.Apply(actx, js, TopologyOptions(pol, c.replicas, c.ackWait))
		stop()
		cancel()
		if err != nil {
			err = nc.Explain(err)
			if errors.Is(err, nats.ErrPermissionViolation) {
				return fmt.Errorf("apply topology: %w; a service running with its own role's credentials may not change the topology: start it with --no-apply and apply the topology as admin", err)
			}
			return fmt.Errorf("apply topology: %w", err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	svc, err := spec.Build(ctx, Env{JS: js, Policy: pol, Log: log, Registry: reg, PolicyFile: c.policyFile})
	if err != nil {
		return nc.Explain(err)
	}
	// The live status page, read with this service's own connection: all
	// of it on a bus without users; under a role, the parts the role may
	// not read list why (`failbus status` with the operator's
	// credentials shows everything).
	page := status.NewServer(ctx, status.NewCollector(js, nil), 0, "")
	if _, err := ops.Serve(ctx, c.opsAddr, reg, svc.Healthy, log, page.Routes()...); err != nil {
		return err
	}
	return nc.Explain(RunBounded(ctx, svc, c.shutdownTimeout, log))
}

// RunBounded runs svc until ctx ends, then waits at most timeout for it to
// drain: past it, it returns ErrShutdownTimeout and leaves svc running
// (the caller exits the process; nothing acknowledged is lost, and what
// was in flight is redelivered, as after SIGKILL).
func RunBounded(ctx context.Context, svc Service, timeout time.Duration, log zerolog.Logger) error {
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		err := fmt.Errorf("%w: still draining %v after the signal (--shutdown-timeout); in-flight messages are redelivered", ErrShutdownTimeout, timeout)
		if herr := svc.Healthy(); herr != nil {
			err = fmt.Errorf("%w; health: %w", err, herr)
		}
		log.Error().Err(err).Msg("stopping without a full drain")
		return err
	}
}

// TopologyOptions are the topology settings that follow from the policy, so
// every binary applying the topology at start agrees on them (otherwise the
// last one started would win): the refusal bucket's TTL is the policy's
// refusal.state_ttl, the backstop that retires what no boundary does.
//
// ackWait is every consumer's lease on a first delivery
// (topology.Options.AckWait; 0: the consumers' own, 30s): on a cluster, it
// bounds how long classification stalls after a node loss.
func TopologyOptions(pol *policy.Policy, replicas int, ackWait time.Duration) topology.Options {
	o := topology.Options{Replicas: replicas, AckWait: ackWait}
	if pol == nil {
		return o
	}
	if pol.Refusal.StateTTL > 0 {
		o.BucketTTL = map[string]time.Duration{topology.BucketRefusals: pol.Refusal.StateTTL}
	}
	if n := pol.Limits.TaskBytes; n > 0 && n <= math.MaxInt32 {
		o.MaxMsgSize = map[string]int32{topology.StreamTasks: int32(n)}
	}
	return o
}

// Group runs several services as one: Run returns when all have stopped
// (one stopping on its own stops the others), Healthy when all are.
type Group []Service

// Run implements Service.
func (g Group) Run(ctx context.Context) error {
	parts := make([]ops.Runnable, len(g))
	for i, s := range g {
		parts[i] = s
	}
	return ops.RunAll(ctx, parts...)
}

// Healthy implements Service.
func (g Group) Healthy() error {
	checks := make([]func() error, len(g))
	for i, s := range g {
		checks[i] = s.Healthy
	}
	return ops.AllHealthy(checks...)()
}

// EnvString reads an environment variable with a default; flags use it so every
// flag can also be set from the environment.
func EnvString(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// EnvInt is EnvString for integers; an unparsable value keeps the default.
func EnvInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

// EnvDuration is EnvString for Go durations; an unparsable value keeps the
// default.
func EnvDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}

func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z':
			b[i] = c - 'a' + 'A'
		case c == '-':
			b[i] = '_'
		}
	}
	return string(b)
}
