// Package cli is what every failbus command shares: the Command type and
// the dispatcher behind `failbus <command>` (help included), flag parsing
// that accepts flags after positional arguments, the shared flag sets
// (Conn, the bus connection), the JSON Lines reader of the offline
// commands, and the console logger. Each command lives in a package of its
// own under internal/cli/<command>; cmd/failbus/main.go only lists them.
//
// # Adding a command
//
// Write a package internal/cli/<name> that exports
//
//	var Command = cli.Command{Name: "<name>", Summary: "one line for failbus help", Run: run}
//
// where run parses its flags with NewFlagSet and Parse and returns the exit
// code (0 done, 1 failed, 2 unusable arguments: UsageError), then add
// <name>.Command to the list in cmd/failbus/main.go. `failbus help` lists
// it, and `failbus help <name>` (or `failbus <name> -h`) prints its usage
// and flags. Tests call Run directly, against a real server
// (internal/bustest) when the command talks to the bus.
//
// # Adding a shared flag set
//
// Flags that several commands take (the connection flags, say) are a
// struct with a Register(*flag.FlagSet) method that binds its fields,
// plus the methods that use them; Conn is the model. A command declares
// one, calls Register on its flag set before Parse, and uses it after:
//
//	var conn cli.Conn
//	fs := cli.NewFlagSet("tail", tailUsage, stderr)
//	conn.Register(fs)
//	...
//	nc, js, err := conn.JetStream(ctx, "tail")
//
// A new flag added to Conn reaches every connecting command at once.
package cli

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// RunFunc is a command: it gets the arguments after its name and the
// process's standard streams, and returns the exit code (0 done, 1 failed,
// 2 unusable arguments).
type RunFunc func(args []string, stdin io.Reader, stdout, stderr io.Writer) int

// Command is one subcommand of failbus.
type Command struct {
	// Name is the word after `failbus`.
	Name string
	// Summary is its line in `failbus help`.
	Summary string
	// Run runs it.
	Run RunFunc
}

// Main dispatches args (without the program name) to one of commands and
// returns the exit code. `failbus help` and `failbus help <command>` write
// to stdout and exit 0 (`failbus <command> -h` writes the same usage to
// stderr, as flag parsing does); an unknown command, with or without help,
// is named on stderr and exits 2.
func Main(commands []Command, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(commands, stderr)
		return 2
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" || name == "-help" {
		if len(args) > 1 {
			c, ok := lookup(commands, args[1])
			if !ok {
				fmt.Fprintf(stderr, "failbus help: unknown command %q\n\n", args[1])
				usage(commands, stderr)
				return 2
			}
			// Its usage goes where the help was asked for, like the
			// list of commands: stdout.
			return c.Run([]string{"-h"}, stdin, stdout, stdout)
		}
		usage(commands, stdout)
		return 0
	}
	c, ok := lookup(commands, name)
	if !ok {
		fmt.Fprintf(stderr, "failbus: unknown command %q\n\n", name)
		usage(commands, stderr)
		return 2
	}
	return c.Run(args[1:], stdin, stdout, stderr)
}

func lookup(commands []Command, name string) (Command, bool) {
	i := slices.IndexFunc(commands, func(c Command) bool { return c.Name == name })
	if i < 0 {
		return Command{}, false
	}
	return commands[i], true
}

func usage(commands []Command, w io.Writer) {
	fmt.Fprintln(w, "failbus — a failure bus for LLM agents, on NATS JetStream.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: failbus <command> [flags] [args]")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.Name, c.Summary)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'failbus help <command>' (or 'failbus <command> -h') for its flags.")
}
