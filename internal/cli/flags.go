package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/connect"
)

// DefaultPort is where `failbus dev` listens unless told otherwise: NATS's
// own default port, so every other command finds it with no flags.
const DefaultPort = 4222

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
// where the server is and how to log in (internal/connect: --server list,
// --creds, --nkey, --user/--password, --tls-ca/--tls-cert/--tls-key,
// --inbox-prefix, each with its NATS_* environment variable). Register it,
// parse, then Connect or JetStream.
type Conn struct {
	connect.Options
}

// Register binds the connection flags to fs.
func (c *Conn) Register(fs *flag.FlagSet) { c.Options.Register(fs) }

// Connect opens a client connection for command, named so the server's
// monitoring shows who is connected; it reconnects for ever. Its errors
// name the server, the user and the flag to check; wrap the errors of
// what is done with it in its Explain, so a permission the user lacks is
// named instead of reported as a timeout.
func (c *Conn) Connect(command string) (*connect.Conn, error) {
	return connect.Connect(c.Options.WithEnv(), command)
}

// JetStream connects and returns the connection (close it) and its
// JetStream context.
func (c *Conn) JetStream(_ context.Context, command string) (*connect.Conn, jetstream.JetStream, error) {
	nc, err := c.Connect(command)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}
