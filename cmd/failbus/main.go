// Command failbus is the operator CLI of failbus: run the whole bus in one
// process (dev), walk through the main scenarios (demo), put outcomes on the
// bus (publish), watch or replay any subject (tail), run the decision core
// offline (classify, simulate), measure it (bench), try agents against a
// provider that fails on a script (chaos), and run a fleet through one with
// and without the bus (drill).
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
	"github.com/failbus/failbus/internal/cli/authcmd"
	"github.com/failbus/failbus/internal/cli/bench"
	"github.com/failbus/failbus/internal/cli/chaoscmd"
	"github.com/failbus/failbus/internal/cli/classifycmd"
	"github.com/failbus/failbus/internal/cli/decode"
	"github.com/failbus/failbus/internal/cli/demo"
	"github.com/failbus/failbus/internal/cli/dev"
	"github.com/failbus/failbus/internal/cli/dlq"
	"github.com/failbus/failbus/internal/cli/drillcmd"
	"github.com/failbus/failbus/internal/cli/health"
	"github.com/failbus/failbus/internal/cli/lag"
	"github.com/failbus/failbus/internal/cli/publish"
	"github.com/failbus/failbus/internal/cli/report"
	"github.com/failbus/failbus/internal/cli/shadow"
	"github.com/failbus/failbus/internal/cli/simulatecmd"
	"github.com/failbus/failbus/internal/cli/statuscmd"
	"github.com/failbus/failbus/internal/cli/tail"
	"github.com/failbus/failbus/internal/cli/version"
)

// commands is the CLI, in the order of `failbus help`.
var commands = []cli.Command{
	dev.Command,
	demo.Command,
	authcmd.Command,
	apply.Command,
	publish.Command,
	tail.Command,
	health.Command,
	lag.Command,
	statuscmd.Command,
	dlq.Command,
	decode.Command,
	report.Command,
	shadow.Command,
	classifycmd.Command,
	simulatecmd.Command,
	bench.Command,
	chaoscmd.Command,
	drillcmd.Command,
	version.Command,
}

func main() {
	os.Exit(cli.Main(commands, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
