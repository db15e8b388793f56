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
//	--server URLS           NATS server(s), comma-separated; alias --nats-url (NATS_URL; default nats://127.0.0.1:4222)
//	--creds FILE            NATS credentials file (NATS_CREDS)
//	--nkey FILE             nkey seed file, e.g. from `failbus auth init` (NATS_NKEY)
//	--user, --password      user name and password (NATS_USER, NATS_PASSWORD)
//	--tls-ca FILE           CA of the server certificate; --tls-cert, --tls-key for mutual TLS (NATS_CA, NATS_CERT, NATS_KEY)
//	--inbox-prefix P        reply subject prefix (NATS_INBOX_PREFIX; default _INBOX.<nkey public key> with --nkey)
//	--ops-addr ADDR         /metrics and /healthz (FAILBUS_NOTIFIER_OPS_ADDR; default 127.0.0.1:9404)
//	--policy FILE           policy file; its notify: section is used (FAILBUS_POLICY; default policy when empty: budget 20, log sink)
//	--concurrency N         requests handled at once (default 8)
//	--dedupe-lifetime D     how long a sent dedupe key suppresses repeats (FAILBUS_NOTIFY_DEDUPE_LIFETIME; default 168h, at most the bucket TTL)
//	--replica NAME          replica name in the ledger and audit records (default host-pid-random)
//	--replicas N            stream replicas when applying the topology (FAILBUS_REPLICAS; default 1)
//	--apply-topology        create/update streams, consumers and buckets at start (default true)
//	--no-apply              same as --apply-topology=false: with a role's own credentials, the admin applies
//	--log-level LEVEL       debug, info, warn, error (FAILBUS_LOG_LEVEL; default info)
//	--shutdown-timeout D    after SIGINT/SIGTERM, exit 1 if the drain has not ended by then (FAILBUS_SHUTDOWN_TIMEOUT; default 40s)
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/servicespec"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole command; it returns the exit code (2: unusable flags or
// policy).
func run(ctx context.Context, args []string, stderr io.Writer) int {
	return daemon.Run(ctx, servicespec.Notifier(), args, stderr)
}
