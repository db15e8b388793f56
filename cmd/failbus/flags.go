package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
)

// DefaultPort is where `failbus dev` listens unless told otherwise: NATS's
// own default port, so every other command finds it with no flags.
const DefaultPort = 4222

// defaultServer is the --server default of the commands that connect to a
// bus: $NATS_URL, or the URL `failbus dev` prints with its default port.
func defaultServer() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", DefaultPort)
}

// newFlagSet returns a flag set for one command that writes its usage to
// stderr and reports errors instead of exiting.
func newFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: failbus %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses flags that may come before, between or after positional
// arguments (`failbus tail failbus.> --count 3`), and returns the
// positionals. It returns (nil, 0, true) for -h, and an exit code 2 for
// unusable flags.
func parseArgs(fs *flag.FlagSet, args []string) (positional []string, code int, done bool) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, 0, true
			}
			return nil, 2, true
		}
		rest := fs.Args()
		i := 0
		for i < len(rest) && !strings.HasPrefix(rest[i], "-") {
			i++
		}
		positional = append(positional, rest[:i]...)
		if i == len(rest) {
			return positional, 0, false
		}
		if rest[i] == "--" {
			return append(positional, rest[i+1:]...), 0, false
		}
		args = rest[i:]
	}
}

// usageError prints a message and the command's usage, and returns 2.
func usageError(fs *flag.FlagSet, stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "failbus %s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	fs.Usage()
	return 2
}

// connect opens a client connection for a CLI command, named so the server's
// monitoring shows who is connected.
func connect(url, command string) (*nats.Conn, error) {
	nc, err := nats.Connect(url, nats.Name("failbus "+command), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", url, err)
	}
	return nc, nil
}
