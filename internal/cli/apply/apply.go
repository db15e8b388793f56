// Package apply is `failbus apply`: create or update every stream, durable
// consumer and KV bucket of the topology on a bus, as the admin, so the
// services can run with --no-apply under their own roles.
package apply

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/daemon"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/policy"
)

// Command is `failbus apply`.
var Command = cli.Command{Name: "apply", Summary: "create or update the streams, consumers and buckets on a bus (as admin; --replicas 3 on a cluster)", Run: run}

const usage = `[--server URLS] [--nkey admin.nk | --creds FILE | --user U --password P] [--tls-ca FILE] [--replicas N] [--ack-wait D] [--policy FILE]

Makes the bus hold every stream, durable consumer and KV bucket failbus
uses, with N replicas each (1 by default; 3 on a 3-node cluster; more than
1 on a single server is refused before anything changes). Existing ones
are updated in place (messages and consumer positions kept); one that
cannot be is reported and nothing is changed. --policy gives the settings
that follow from the policy (the refusal bucket's TTL), as the services
would apply them. Run it as the admin user; the services then start with
--no-apply under their own roles. --ack-wait shortens every consumer's
lease on a first delivery (30s): on a cluster it bounds how long
classification stalls when a node is lost (docs/DEPLOY.md).`

// applyTimeout bounds applying the whole topology.
const applyTimeout = time.Minute

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("apply", usage, stderr)
	var conn cli.Conn
	conn.Register(fs)
	replicas := fs.Int("replicas", topology.DefaultReplicas, "copies of every stream and bucket (1-5)")
	ackWait := fs.Duration("ack-wait", 0, "every consumer's lease on a first delivery: how long a message in flight to a lost node or a dead service waits to be redelivered (default 30s; 5s on a cluster bounds a node loss's stall, docs/DEPLOY.md)")
	policyFile := fs.String("policy", "", "policy file whose settings shape the topology (default: the built-in policy)")
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	if *replicas < 1 || *replicas > 5 {
		return cli.UsageError(fs, stderr, "--replicas %d: must be between 1 and 5", *replicas)
	}
	pol := policy.Default()
	if *policyFile != "" {
		var err error
		if pol, err = policy.Load(*policyFile); err != nil {
			return cli.UsageError(fs, stderr, "--policy %s: %v", *policyFile, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	nc, js, err := conn.JetStream(ctx, "apply")
	if err != nil {
		fmt.Fprintf(stderr, "failbus apply: %v\n", err)
		return 1
	}
	defer nc.Close()
	actx, stop := nc.FailFast(ctx)
	err = topology.Apply(actx, js, daemon.TopologyOptions(pol, *replicas, *ackWait))
	stop()
	if err != nil {
		err = nc.Explain(err)
		if errors.Is(err, nats.ErrPermissionViolation) {
			err = fmt.Errorf("%w; the topology is the admin's: connect with the admin user (--nkey admin.nk)", err)
		}
		fmt.Fprintf(stderr, "failbus apply: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "failbus apply: %d streams, %d consumers, %d buckets at %d replica(s) on %s\n",
		len(topology.Streams()), len(topology.Consumers()), len(topology.Buckets()), *replicas, nc.ConnectedUrlRedacted())
	return 0
}
