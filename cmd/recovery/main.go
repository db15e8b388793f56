// Command recovery is the recovery service (docs/CONTRACT.md §
// "Recovery"): it reads provider health (FAILBUS_HEALTH),
// subagent heartbeats (FAILBUS_LIVENESS), cron specs and runs and memory
// writes (FAILBUS_REPORTS), decisions (FAILBUS_DECISIONS) and tasks
// (FAILBUS_TASKS). Tasks of a provider in an outage are held in
// FAILBUS_TASKS and released after recovery at recovery.drain_rate; while a
// provider is down an agent that used it is asked for a probe every
// recovery.probe_interval; once it recovered, the checklist runs: confirm,
// subagents, kill, crons, writes, redispatch, release, each step recorded
// on failbus.recovery.<provider> before the next. Commands go to
// failbus.control.<agent>, tasks to failbus.dispatch.<agent>, one
// notification per recovery to failbus.notify.normal, junk to
// failbus.dlq.<consumer> with the reason. Several replicas may run: a lease
// in each provider's record (KV FAILBUS_RECOVERY) keeps one driving it, and
// the command ledger keeps every command to one. SIGINT/SIGTERM drain: no
// new messages, in-flight ones finish, exit 0.
//
// Flags (each also read from the environment variable in brackets):
//
//	--server URLS       NATS servers (NATS_URL; default nats://127.0.0.1:4222); --creds, --nkey, --user/--password, --tls-* as every binary
//	--ops-addr ADDR     /metrics and /healthz (FAILBUS_RECOVERY_OPS_ADDR; default 127.0.0.1:9406)
//	--policy FILE       policy file (FAILBUS_POLICY; default policy when empty)
//	--replica NAME      replica name in the lease (FAILBUS_RECOVERY_REPLICA; default a new unique id)
//	--lease D           how long a replica keeps a provider after its last step (FAILBUS_RECOVERY_LEASE; default 5s)
//	--replicas N        stream replicas when applying the topology (FAILBUS_REPLICAS; default 1)
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
	code := daemon.Run(ctx, servicespec.Recovery(), os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
