package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultPort is where `failbus dev` listens unless told otherwise: NATS's
// own default port, so every other command finds it with no flags.
const DefaultPort = 4222

// DefaultServer is the --server default of the commands that connect to a
// bus: $NATS_URL, or the URL `failbus dev` prints with its default port.
func DefaultServer() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", DefaultPort)
}

// NewFlagSet returns a flag set for one command that writes its usage to
// stderr and reports errors instead of exiting. synopsis follows
// `Usage: failbus <name>` and may go on with paragraphs of help.
func NewFlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: failbus %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// Parse parses flags that may come before, between or after positional
// arguments (`failbus tail failbus.> --count 3`), and returns the
// positionals. It returns (nil, 0, true) for -h, and an exit code 2 for
// unusable flags.
func Parse(fs *flag.FlagSet, args []string) (positional []string, code int, done bool) {
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

// UsageError prints a message and the command's usage, and returns 2.
func UsageError(fs *flag.FlagSet, stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "failbus %s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	fs.Usage()
	return 2
}

// Conn is the shared flag set of every command that connects to a bus:
// where the server is (and, as the contract's deployment section grows,
// how to authenticate). Register it, parse, then Connect or JetStream.
type Conn struct {
	// Server is --server: comma-separated NATS URLs.
	Server string
}

// Register binds the connection flags to fs.
func (c *Conn) Register(fs *flag.FlagSet) {
	fs.StringVar(&c.Server, "server", DefaultServer(), "NATS URL of the bus ($NATS_URL, else the default of failbus dev)")
}

// Connect opens a client connection for command, named so the server's
// monitoring shows who is connected; it reconnects for ever.
func (c *Conn) Connect(command string) (*nats.Conn, error) {
	nc, err := nats.Connect(c.Server, nats.Name("failbus "+command), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.Server, err)
	}
	return nc, nil
}

// JetStream connects and returns the connection (close it) and its
// JetStream context.
func (c *Conn) JetStream(_ context.Context, command string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := c.Connect(command)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}
