// Package status is `failbus status`: the live status page
// (internal/status) against any bus, with the consumers' lag on /metrics
// for Prometheus; or, with --json, one snapshot of it printed.
package statuscmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/internal/status"
)

// Command is `failbus status`.
var Command = cli.Command{Name: "status", Summary: "serve the live status page (providers, held tasks, checklist, lag, dead letters, notifications) for any bus", Run: run}

// DefaultAddr is where the page is served unless --addr says otherwise.
const DefaultAddr = "127.0.0.1:9500"

const usage = `[--server URL] [--addr ADDR] [--interval 2s] [--json]

Serves the live status page on http://ADDR/status until interrupted: each
provider's health (since when, why), the tasks held for it and its
recovery checklist's progress, every durable consumer's lag, the dead
letters of the last hour by reason, and the notifications of the last hour
sent and held by the budget. It refreshes itself every --interval
(server-sent events, or polling), has no external asset and works offline.

It only reads, with the operator role's rights (--nkey operator.nk): the
latest records and pages of streams by direct gets, stream and consumer
info. No consumer is created, nothing is published.

Beside the page: /status.json (one snapshot), /metrics (every durable
consumer's lag as Prometheus gauges, read at each scrape:
failbus_consumer_pending_messages, failbus_consumer_ack_pending_messages,
failbus_consumer_oldest_unprocessed_age_seconds,
failbus_consumer_waiting_pulls) and /healthz.

--json prints one snapshot as JSON and exits (1 when a part could not be
read: its "problems" say which).`

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("status", usage, stderr)
	var conn cli.Conn
	conn.Register(fs)
	addr := fs.String("addr", DefaultAddr, "address to serve the page on")
	interval := fs.Duration("interval", status.DefaultInterval, "how often the page refreshes")
	asJSON := fs.Bool("json", false, "print one snapshot as JSON and exit")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	if *interval < 100*time.Millisecond {
		return cli.UsageError(fs, stderr, "--interval %s: at least 100ms", *interval)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, js, err := conn.JetStream(ctx, "status")
	if err != nil {
		fmt.Fprintf(stderr, "failbus status: %v\n", err)
		return 1
	}
	defer nc.Close()
	c := status.NewCollector(js, nil)
	if *asJSON {
		snap, err := c.Collect(ctx)
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if eerr := enc.Encode(snap); eerr != nil {
			fmt.Fprintf(stderr, "failbus status: %v\n", eerr)
			return 1
		}
		if err != nil || len(snap.Problems) > 0 {
			return 1
		}
		return 0
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(status.NewLagCollector(js))
	page := status.NewServer(ctx, c, *interval, "")
	routes := append(page.Routes(), ops.Endpoint{Pattern: "GET /{$}", Handler: page.Handler()})
	health := func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected to NATS")
		}
		return nil
	}
	log := cli.ConsoleLogger(stderr)
	bound, err := ops.Serve(ctx, *addr, reg, health, log, routes...)
	if err != nil {
		fmt.Fprintf(stderr, "failbus status: %v (use --addr)\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "failbus status: http://%s%s (metrics: http://%s/metrics)\n", bound, status.Path, bound)
	<-ctx.Done()
	return 0
}
