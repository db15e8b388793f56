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
//	--refusals          also run the refusal tiers and the failbus-refusals route service (default true)
//	--replicas N        stream replicas when applying the topology (FAILBUS_REPLICAS; default 1)
//	--apply-topology    create/update streams and consumers at start (default true)
//	--log-level LEVEL   debug, info, warn, error (FAILBUS_LOG_LEVEL; default info)
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/failbus/failbus/internal/service/refusals"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/servicemain"
	"github.com/failbus/failbus/pkg/consumer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := servicemain.Run(ctx, spec(), os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

func spec() servicemain.Spec {
	var (
		concurrency    int
		policyKV, tier bool
	)
	return servicemain.Spec{
		Name:           scheduler.Service,
		DefaultOpsAddr: scheduler.DefaultOpsAddr,
		Flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&policyKV, "policy-kv", true, "let FAILBUS_POLICY/"+scheduler.PolicyKVKey+" in KV override --policy, reloaded on change")
			fs.IntVar(&concurrency, "concurrency", scheduler.DefaultConcurrency, "classifications handled at once")
			fs.BoolVar(&tier, "refusals", true, "also run the refusal tiers (consumers refusals and refusals-boundaries, micro service failbus-refusals)")
		},
		Check: func() error {
			if concurrency < 1 {
				return fmt.Errorf("--concurrency %d: must be at least 1", concurrency)
			}
			return nil
		},
		Build: func(_ context.Context, env servicemain.Env) (servicemain.Service, error) {
			s, err := scheduler.New(env.JS, scheduler.Options{
				Policy:      env.Policy,
				WatchPolicy: policyKV,
				Runner:      consumer.Config{Concurrency: concurrency, Logger: env.Log, Registerer: env.Registry},
			})
			if err != nil {
				return nil, err
			}
			if !tier {
				return s, nil
			}
			// Refusal tiers live beside the scheduler (DESIGN.md: "in
			// scheduler or its own consumer"): same policy file, own
			// consumers and the route micro service.
			r, err := refusals.New(env.JS, refusals.Options{
				Policy: env.Policy.Refusal,
				Runner: consumer.Config{Logger: env.Log, Registerer: env.Registry},
			})
			if err != nil {
				return nil, err
			}
			return servicemain.Group{s, r}, nil
		},
	}
}
