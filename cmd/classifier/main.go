// Command classifier is the classifier service: it reads every outcome from
// FAILBUS_OUTCOMES (durable consumer `classifier`), classifies it with
// pkg/policy and publishes one classification to
// failbus.classified.<provider>.<class>; junk goes to failbus.dlq.classifier
// with the reason. SIGINT/SIGTERM drain: no new messages, in-flight ones
// finish, exit 0.
//
// Flags (each also read from the environment variable in brackets):
//
//	--server URLS       NATS server(s), comma-separated; alias --nats-url (NATS_URL; default nats://127.0.0.1:4222)
//	--creds FILE        NATS credentials file (NATS_CREDS)
//	--nkey FILE         nkey seed file, e.g. from `failbus auth init` (NATS_NKEY)
//	--user, --password  user name and password (NATS_USER, NATS_PASSWORD)
//	--tls-ca FILE       CA of the server certificate; --tls-cert, --tls-key for mutual TLS (NATS_CA, NATS_CERT, NATS_KEY)
//	--inbox-prefix P    reply subject prefix (NATS_INBOX_PREFIX; default _INBOX.<nkey public key> with --nkey)
//	--ops-addr ADDR     /metrics and /healthz (FAILBUS_CLASSIFIER_OPS_ADDR; default 127.0.0.1:9401)
//	--policy FILE       policy file; its classify: section is used (FAILBUS_POLICY; default policy when empty)
//	--concurrency N     outcomes handled at once (default 4)
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
	code := daemon.Run(ctx, servicespec.Classifier(), os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
