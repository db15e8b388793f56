// Command classifier is the classifier service: it reads every outcome from
// FAILBUS_OUTCOMES (durable consumer `classifier`), classifies it with
// pkg/policy and publishes one classification to
// failbus.classified.<provider>.<class>; junk goes to failbus.dlq.classifier
// with the reason. SIGINT/SIGTERM drain: no new messages, in-flight ones
// finish, exit 0.
//
// Flags (each also read from the environment variable in brackets):
//
//	--nats-url URL      NATS server (NATS_URL; default nats://127.0.0.1:4222)
//	--creds FILE        NATS credentials file (NATS_CREDS)
//	--ops-addr ADDR     /metrics and /healthz (FAILBUS_CLASSIFIER_OPS_ADDR; default 127.0.0.1:9401)
//	--policy FILE       policy file; its classify: section is used (FAILBUS_POLICY; default policy when empty)
//	--concurrency N     outcomes handled at once (default 4)
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

	"github.com/failbus/failbus/internal/service/classifier"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/policy"
)

type options struct {
	natsURL     string
	creds       string
	opsAddr     string
	policyFile  string
	concurrency int
	replicas    int
	apply       bool
	logLevel    string
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
		fmt.Fprintln(stderr, "classifier:", err)
		return 2
	}
	level, err := zerolog.ParseLevel(opts.logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "classifier: --log-level:", err)
		return 2
	}
	log := zerolog.New(stderr).Level(level).With().Timestamp().Logger()
	if err := serve(ctx, opts, log); err != nil {
		log.Error().Err(err).Msg("classifier failed")
		return 1
	}
	return 0
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("classifier", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.StringVar(&o.natsURL, "nats-url", env("NATS_URL", nats.DefaultURL), "NATS server URL (env NATS_URL)")
	fs.StringVar(&o.creds, "creds", env("NATS_CREDS", ""), "NATS credentials file (env NATS_CREDS)")
	fs.StringVar(&o.opsAddr, "ops-addr", env("FAILBUS_CLASSIFIER_OPS_ADDR", classifier.DefaultOpsAddr), "address of /metrics and /healthz")
	fs.StringVar(&o.policyFile, "policy", env("FAILBUS_POLICY", ""), "policy file (env FAILBUS_POLICY); default policy when empty")
	fs.IntVar(&o.concurrency, "concurrency", classifier.DefaultConcurrency, "outcomes handled at once")
	fs.IntVar(&o.replicas, "replicas", envInt("FAILBUS_REPLICAS", topology.DefaultReplicas), "stream replicas when applying the topology (env FAILBUS_REPLICAS)")
	fs.BoolVar(&o.apply, "apply-topology", true, "create or update the streams and consumers at start")
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
	pol := policy.Default()
	if o.policyFile != "" {
		p, err := policy.Load(o.policyFile)
		if err != nil {
			return err
		}
		pol = p
		log.Info().Str("policy", o.policyFile).Msg("policy loaded")
	}
	cf, err := pol.ClassifyFunc()
	if err != nil {
		return fmt.Errorf("%s: classify: %w", o.policyFile, err)
	}
	classify := classifier.ClassifyFunc(cf)

	nopts := []nats.Option{nats.Name("failbus-classifier"), nats.MaxReconnects(-1)}
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
	r, err := classifier.NewRunner(js, classifier.Options{
		Classify: classify,
		Runner:   consumer.Config{Concurrency: o.concurrency, Logger: log, Registerer: reg},
	})
	if err != nil {
		return err
	}
	if _, err := consumer.ServeOps(ctx, o.opsAddr, reg, r.Healthy, log); err != nil {
		return err
	}
	return r.Run(ctx)
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
