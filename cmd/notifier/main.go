// Command notifier is the notifier service: it reads notification requests
// from FAILBUS_NOTIFY (durable consumer `notifier`), delivers each dedupe key
// once to the sinks of the policy's notify: section (webhook, Slack, ntfy,
// SMTP, PagerDuty, log), holds non-critical ones back past the daily
// budget, and records every decision on failbus.audit.notifier.<kind>.
// Requests a failing sink never accepts go to failbus.dlq.notifier with the
// sink's last answer. Run as many replicas as you like. SIGINT/SIGTERM
// drain: no new requests, in-flight ones finish, exit 0.
//
// Flags (each also read from the environment variable in brackets):
//
//	--nats-url URL          NATS server (NATS_URL; default nats://127.0.0.1:4222)
//	--creds FILE            NATS credentials file (NATS_CREDS)
//	--ops-addr ADDR         /metrics and /healthz (FAILBUS_NOTIFIER_OPS_ADDR; default 127.0.0.1:9404)
//	--policy FILE           policy file; its notify: section is used (FAILBUS_POLICY; default policy when empty: budget 20, log sink)
//	--concurrency N         requests handled at once (default 8)
//	--dedupe-lifetime D     how long a sent dedupe key suppresses repeats (FAILBUS_NOTIFY_DEDUPE_LIFETIME; default 168h, at most the bucket TTL)
//	--replica NAME          replica name in the ledger and audit records (default host-pid-random)
//	--replicas N            stream replicas when applying the topology (FAILBUS_REPLICAS; default 1)
//	--apply-topology        create/update streams, consumers and buckets at start (default true)
//	--log-level LEVEL       debug, info, warn, error (FAILBUS_LOG_LEVEL; default info)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/service/notifier"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/notify"
	"github.com/failbus/failbus/pkg/policy"
)

type options struct {
	natsURL        string
	creds          string
	opsAddr        string
	policyFile     string
	concurrency    int
	dedupeLifetime time.Duration
	replica        string
	replicas       int
	apply          bool
	logLevel       string
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command; it returns the exit code (2: unusable flags).
func run(ctx context.Context, args []string, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "notifier:", err)
		return 2
	}
	level, err := zerolog.ParseLevel(opts.logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "notifier: --log-level:", err)
		return 2
	}
	log := zerolog.New(stderr).Level(level).With().Timestamp().Logger()
	if err := serve(ctx, opts, log); err != nil {
		log.Error().Err(err).Msg("notifier failed")
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("notifier", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.natsURL, "nats-url", env("NATS_URL", nats.DefaultURL), "NATS server URL (env NATS_URL)")
	fs.StringVar(&o.creds, "creds", env("NATS_CREDS", ""), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&o.opsAddr, "ops-addr", env("FAILBUS_NOTIFIER_OPS_ADDR", notifier.DefaultOpsAddr), "address of /metrics and /healthz")
	fs.StringVar(&o.policyFile, "policy", env("FAILBUS_POLICY", ""), "policy file (env FAILBUS_POLICY); default policy when empty")
	fs.IntVar(&o.concurrency, "concurrency", notifier.DefaultConcurrency, "requests handled at once")
	fs.DurationVar(&o.dedupeLifetime, "dedupe-lifetime", envDuration("FAILBUS_NOTIFY_DEDUPE_LIFETIME", notify.DefaultDedupeLifetime), "how long a sent dedupe key suppresses repeats")
	fs.StringVar(&o.replica, "replica", env("FAILBUS_NOTIFIER_REPLICA", ""), "replica name (default host-pid-random)")
	fs.IntVar(&o.replicas, "replicas", envInt("FAILBUS_REPLICAS", topology.DefaultReplicas), "stream replicas when applying the topology (env FAILBUS_REPLICAS)")
	fs.BoolVar(&o.apply, "apply-topology", true, "create or update the streams, consumers and buckets at start")
	fs.StringVar(&o.logLevel, "log-level", env("FAILBUS_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return o, nil
}

// serve connects, applies the topology, and runs the service until ctx ends.
func serve(ctx context.Context, o options, log zerolog.Logger) error {
	p := policy.Default()
	if o.policyFile != "" {
		var err error
		if p, err = policy.Load(o.policyFile); err != nil {
			return err
		}
		log.Info().Str("policy", o.policyFile).Msg("policy loaded")
	}

	nopts := []nats.Option{nats.Name("failbus-notifier"), nats.MaxReconnects(-1)}
	if o.creds != "" {
		nopts = append(nopts, nats.UserCredentials(o.creds))
	}
	nc, err := nats.Connect(o.natsURL, nopts...)
	if err != nil {
		return fmt.Errorf("connect %s: %w", o.natsURL, err)
	}
	defer func() { _ = nc.Drain() }()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if o.apply {
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := topology.Apply(actx, js, topology.Options{Replicas: o.replicas})
		cancel()
		if err != nil {
			return fmt.Errorf("apply topology: %w", err)
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	svc, err := notifier.New(ctx, js, notifier.Config{
		Notify:         p.Notify,
		DedupeLifetime: o.dedupeLifetime,
		Replica:        o.replica,
		Concurrency:    o.concurrency,
		Logger:         log,
		Registerer:     reg,
	})
	if err != nil {
		return err
	}
	if _, err := consumer.ServeOps(ctx, o.opsAddr, reg, svc.Runner().Healthy, log); err != nil {
		return err
	}
	return svc.Run(ctx)
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return d
	}
	return def
}
