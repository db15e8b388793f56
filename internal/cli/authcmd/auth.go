// Package auth is `failbus auth init`: the NATS users of failbus, one nkey
// per role with only that role's permissions (internal/auth), written as a
// nats-server configuration fragment and one seed file per role.
package authcmd

import (
	"fmt"
	"io"
	"strings"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/cli"
)

// Command is `failbus auth`.
var Command = cli.Command{Name: "auth", Summary: "write the NATS users of failbus: one nkey per role, each allowed only its own subjects (auth init)", Run: run}

const usage = `init --out DIR [--agents NAME,...]

Writes DIR/auth.conf, a nats-server configuration fragment to include
(include "auth.conf"), with one nkey user per role: classifier, scheduler,
notifier, recovery, agent, operator, admin; and each role's seed in
DIR/<role>.nk (mode 0600), the --nkey of whoever runs as that role. Each
user may publish and read only what its role needs; a connection without
credentials is refused. --agents adds users agent-<name> whose subjects
carry only that agent's name.

Seeds already in DIR are kept, and so are agent users of earlier runs:
running it again (after an upgrade of failbus, or to add agents) rewrites
auth.conf and adds what is missing, without locking anyone out. Delete a seed file to give that role a new key.
Reload or restart nats-server after auth.conf changes.`

func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("auth", usage, stderr)
	out := fs.String("out", "", "directory to write auth.conf and the seeds into (created if missing)")
	agents := fs.String("agents", "", "comma-separated agent names that get a user of their own (agent-<name>)")
	rest, code, done := cli.Parse(fs, args)
	if done {
		return code
	}
	if len(rest) != 1 || rest[0] != "init" {
		return cli.UsageError(fs, stderr, "want the subcommand init, got %q", rest)
	}
	if *out == "" {
		return cli.UsageError(fs, stderr, "--out DIR is required")
	}
	var names []string
	for n := range strings.SplitSeq(*agents, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	set, err := auth.Init(*out, names)
	if err != nil {
		fmt.Fprintf(stderr, "failbus auth init: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "failbus auth init: wrote %s with %d users\n", set.ConfPath(), len(set.Users))
	for _, u := range set.Users {
		fmt.Fprintf(stdout, "  %-12s %s  --nkey %s\n", u.Role.Name, u.Public, u.SeedFile)
	}
	fmt.Fprintf(stdout, "Include it from the nats-server configuration: include %q\n", auth.ConfFile)
	return 0
}
