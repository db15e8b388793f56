// Command failbus is the operator CLI of failbus: run the whole bus in one
// process (dev), walk through the main scenarios (demo), put outcomes on the
// bus (publish), watch or replay any subject (tail), and run the decision
// core offline (classify, simulate).
//
// Usage:
//
//	failbus <command> [flags] [args]
//	failbus help <command>
//
// Every command is a function with the same signature, listed once in
// commands; adding one is one line there.
package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
)

// runFunc is a subcommand: it gets the arguments after its name and the
// process's standard streams, and returns the exit code. 2 means unusable
// arguments.
type runFunc func(args []string, stdin io.Reader, stdout, stderr io.Writer) int

// command is one subcommand of the CLI.
type command struct {
	name    string
	summary string
	run     runFunc
}

// commands is the CLI. Order is the order of `failbus help`.
var commands = []command{
	{"dev", "run an embedded NATS server with JetStream and every service in one process", runDev},
	{"demo", "walk through the main scenarios on a temporary embedded bus", runDemo},
	{"publish", "publish Outcome (and boundary) JSON Lines from stdin to the bus", runPublish},
	{"tail", "print messages of any subject as JSON Lines; follow, or replay from a sequence or time", runTail},
	{"classify", "classify Outcome JSON Lines from stdin offline (no bus)", runClassify},
	{"simulate", "run the whole decision core over JSON Lines from stdin on a virtual clock (no bus)", runSimulate},
	{"bench", "measure throughput and retry lateness against raw JetStream on a temporary embedded bus", runBench},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run dispatches to a subcommand.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" || name == "-help" {
		if len(args) > 1 {
			if c, ok := lookup(args[1]); ok {
				return c.run([]string{"-h"}, stdin, stdout, stderr)
			}
		}
		usage(stdout)
		return 0
	}
	c, ok := lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "failbus: unknown command %q\n\n", name)
		usage(stderr)
		return 2
	}
	return c.run(args[1:], stdin, stdout, stderr)
}

func lookup(name string) (command, bool) {
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == name })
	if i < 0 {
		return command{}, false
	}
	return commands[i], true
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "failbus — a failure bus for LLM agents, on NATS JetStream.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: failbus <command> [flags] [args]")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'failbus help <command>' (or 'failbus <command> -h') for its flags.")
}
