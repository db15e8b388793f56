// Command failbus is the operator CLI of failbus: run the whole bus in one
// process (dev), walk through the main scenarios (demo), put outcomes on the
// bus (publish), watch or replay any subject (tail), run the decision core
// offline (classify, simulate), measure it (bench), and try agents against
// a provider that fails on a script (chaos).
//
// Usage:
//
//	failbus <command> [flags] [args]
//	failbus help <command>
//
// This file only dispatches: each command is a package under internal/cli
// (see its package doc for how to add one), listed once in commands.
package main

import (
	"os"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/cli/apply"
	"github.com/failbus/failbus/internal/cli/auth"
	"github.com/failbus/failbus/internal/cli/bench"
	"github.com/failbus/failbus/internal/cli/chaos"
	"github.com/failbus/failbus/internal/cli/classify"
	"github.com/failbus/failbus/internal/cli/decode"
	"github.com/failbus/failbus/internal/cli/demo"
	"github.com/failbus/failbus/internal/cli/dev"
	"github.com/failbus/failbus/internal/cli/dlq"
	"github.com/failbus/failbus/internal/cli/health"
	"github.com/failbus/failbus/internal/cli/lag"
	"github.com/failbus/failbus/internal/cli/publish"
	"github.com/failbus/failbus/internal/cli/report"
	"github.com/failbus/failbus/internal/cli/shadow"
	"github.com/failbus/failbus/internal/cli/simulate"
	clistatus "github.com/failbus/failbus/internal/cli/status"
	"github.com/failbus/failbus/internal/cli/tail"
	"github.com/failbus/failbus/internal/cli/version"
)

// commands is the CLI, in the order of `failbus help`.
var commands = []cli.Command{
	dev.Command,
	demo.Command,
	auth.Command,
	apply.Command,
	publish.Command,
	tail.Command,
	health.Command,
	lag.Command,
	clistatus.Command,
	dlq.Command,
	decode.Command,
	report.Command,
	shadow.Command,
	classify.Command,
	simulate.Command,
	bench.Command,
	chaos.Command,
	version.Command,
}

func main() {
	os.Exit(cli.Main(commands, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
