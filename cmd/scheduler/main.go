// Command scheduler is the scheduler service: it reads every classification
// from FAILBUS_CLASSIFIED (durable consumer `scheduler`), keeps each
// provider's fault scope, and turns failures into decisions on
// failbus.decision.<agent> and durable delayed retries with JetStream's own
// message scheduler (due on failbus.retry.due.<agent>), writing the retry
// ledger before it schedules; it also reads agents' started and cancel
// records (consumer `scheduler-control`). Health changes go to
// failbus.health.<provider>, notification requests to
// failbus.notify.<severity>, junk to failbus.dlq.scheduler with the reason.
// SIGINT/SIGTERM drain: no new messages, in-flight ones finish, exit 0.
//
// The policy is --policy (or the default), overridden while KV bucket
// FAILBUS_POLICY holds key "active" (YAML, the same format), reloaded when
// it changes; --policy-kv=false ignores KV.
//
// Flags (each also read from the environment variable in brackets):
//
//	--nats-url URL      NATS server (NATS_URL; default nats://127.0.0.1:4222)
//	--creds FILE        NATS credentials file (NATS_CREDS)
//	--ops-addr ADDR     /metrics and /healthz (FAILBUS_SCHEDULER_OPS_ADDR; default 127.0.0.1:9402)
//	--policy FILE       policy file (FAILBUS_POLICY; default policy when empty)
//	--policy-kv         follow FAILBUS_POLICY/active in KV (default true)
//	--concurrency N     classifications handled at once (default 4)
//	--replicas N        stream replicas when applying the topology (FAILBUS_REPLICAS; default 1)
//	--apply-topology    create/update streams and consumers at start (default true)
//	--log-level LEVEL   debug, info, warn, error (FAILBUS_LOG_LEVEL; default info)
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

	"github.com/failbus/failbus/internal/service/refusals"
	"github.com/failbus/failbus/internal/service/scheduler"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/policy"
)

type options struct {
	natsURL     string
	creds       string
	opsAddr     string
	policyFile  string
	policyKV    bool
	concurrency int
	replicas    int
	apply       bool
	logLevel    string
	refusals    bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command; it returns the exit code (2: unusable flags or
// policy).
func run(ctx context.Context, args []string, stderr io.Writer) int {
	opts, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "scheduler:", err)
		return 2
	}
	level, err := zerolog.ParseLevel(opts.logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "scheduler: --log-level:", err)
		return 2
	}
	pol := policy.Default()
	if opts.policyFile != "" {
		if pol, err = policy.Load(opts.policyFile); err != nil {
			fmt.Fprintln(stderr, "scheduler:", err)
			return 2
		}
	}
	log := zerolog.New(stderr).Level(level).With().Timestamp().Logger()
	if err := serve(ctx, opts, pol, log); err != nil {
		log.Error().Err(err).Msg("scheduler failed")
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("scheduler", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.natsURL, "nats-url", env("NATS_URL", nats.DefaultURL), "NATS server URL (env NATS_URL)")
	fs.StringVar(&o.creds, "creds", env("NATS_CREDS", ""), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&o.opsAddr, "ops-addr", env("FAILBUS_SCHEDULER_OPS_ADDR", scheduler.DefaultOpsAddr), "address of /metrics and /healthz")
	fs.StringVar(&o.policyFile, "policy", env("FAILBUS_POLICY", ""), "policy file (env FAILBUS_POLICY); default policy when empty")
	fs.BoolVar(&o.policyKV, "policy-kv", true, "let FAILBUS_POLICY/"+scheduler.PolicyKVKey+" in KV override --policy, reloaded on change")
	fs.IntVar(&o.concurrency, "concurrency", scheduler.DefaultConcurrency, "classifications handled at once")
	fs.IntVar(&o.replicas, "replicas", envInt("FAILBUS_REPLICAS", topology.DefaultReplicas), "stream replicas when applying the topology (env FAILBUS_REPLICAS)")
	fs.BoolVar(&o.apply, "apply-topology", true, "create or update the streams and consumers at start")
	fs.BoolVar(&o.refusals, "refusals", true, "also run the refusal tiers (consumers refusals and refusals-boundaries, micro service failbus-refusals)")
	fs.StringVar(&o.logLevel, "log-level", env("FAILBUS_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.concurrency < 1 {
		return o, fmt.Errorf("--concurrency %d: must be at least 1", o.concurrency)
	}
	return o, nil
}

// serve connects, applies the topology, and runs the service until ctx ends.
func serve(ctx context.Context, o options, pol *policy.Policy, log zerolog.Logger) error {
	nopts := []nats.Option{nats.Name("failbus-scheduler"), nats.MaxReconnects(-1)}
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
	s, err := scheduler.New(js, scheduler.Options{
		Policy:      pol,
		WatchPolicy: o.policyKV,
		Runner:      consumer.Config{Concurrency: o.concurrency, Logger: log, Registerer: reg},
	})
	if err != nil {
		return err
	}
	health := []func() error{s.Healthy}
	run := []func(context.Context) error{s.Run}
	if o.refusals {
		// Refusal tiers live beside the scheduler (DESIGN.md §1: "in
		// scheduler or its own consumer"): same policy file, own consumers.
		r, err := refusals.New(js, refusals.Options{
			Policy: pol.Refusal,
			Runner: consumer.Config{Logger: log, Registerer: reg},
		})
		if err != nil {
			return err
		}
		health = append(health, r.Healthy)
		run = append(run, r.Run)
	}
	if _, err := consumer.ServeOps(ctx, o.opsAddr, reg, consumer.AllHealthy(health...), log); err != nil {
		return err
	}
	// Each part drains on ctx; if one stops on its own, stop the others.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(run))
	for _, f := range run {
		go func() {
			err := f(rctx)
			cancel()
			errs <- err
		}()
	}
	var first error
	for range run {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
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
