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
// FAILBUS_POLICY holds key "active" (YAML, the same format); both are
// reloaded when they change: the file is polled every --policy-poll
// (default 2s; a change is in force once two looks agree, so write a new
// file and rename it over the old one), and deleting the KV key brings the
// file's current content back. An invalid change is logged, counted and audited, and the last
// good policy stays in force. --policy-kv=false ignores KV. The refusal
// tiers read the `refusal:` section of --policy once, at start.
//
// Flags (each also read from the environment variable in brackets):
//
//	--server URLS       NATS server(s), comma-separated; alias --nats-url (NATS_URL; default nats://127.0.0.1:4222)
//	--creds FILE        NATS credentials file (NATS_CREDS)
//	--nkey FILE         nkey seed file, e.g. from `failbus auth init` (NATS_NKEY)
//	--user, --password  user name and password (NATS_USER, NATS_PASSWORD)
//	--tls-ca FILE       CA of the server certificate; --tls-cert, --tls-key for mutual TLS (NATS_CA, NATS_CERT, NATS_KEY)
//	--inbox-prefix P    reply subject prefix (NATS_INBOX_PREFIX; default _INBOX.<nkey public key> with --nkey)
//	--ops-addr ADDR     /metrics and /healthz (FAILBUS_SCHEDULER_OPS_ADDR; default 127.0.0.1:9402)
//	--policy FILE       policy file (FAILBUS_POLICY; default policy when empty)
//	--policy-kv         follow FAILBUS_POLICY/active in KV (default true)
//	--policy-poll D     how often --policy is checked for changes (default 2s)
//	--concurrency N     classifications handled at once (default 16)
//	--refusals          also run the refusal tiers and the failbus-refusals route service (default true)
//	--replicas N        stream replicas when applying the topology (FAILBUS_REPLICAS; default 1)
//	--apply-topology    create/update streams and consumers at start (default true)
//	--no-apply          same as --apply-topology=false: with a role's own credentials, the admin applies
//	--log-level LEVEL   debug, info, warn, error (FAILBUS_LOG_LEVEL; default info)
//	--shutdown-timeout  after SIGINT/SIGTERM, exit 1 if the drain has not ended by then (FAILBUS_SHUTDOWN_TIMEOUT; default 40s)
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/servicespec"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := daemon.Run(ctx, spec(), os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

// spec is the scheduler's spec in the registry that failbus dev shares.
func spec() daemon.Spec { return servicespec.Scheduler() }
