// Package embedded runs a nats-server with JetStream inside the current
// process. It is the one helper behind `failbus dev`, `failbus demo` and every
// integration test, so what the tests exercise is what a user runs: a real
// server storing in a real folder, never a mock.
//
// Durability on a host crash: JetStream writes every message to the store
// before it acknowledges a publish, but by default it asks the operating
// system to flush (fsync) its files only every 2 minutes (SyncInterval). A
// crash of the failbus process (SIGKILL, panic) loses nothing, because the
// data is in the kernel's page cache; a crash of the whole host (power loss,
// kernel panic) can lose what was acknowledged in the last sync interval.
// Set SyncAlways to fsync on every write (much slower) or lower SyncInterval
// to narrow that window.
package embedded

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// DefaultSyncInterval is JetStream's own default fsync interval, repeated
// here so it is visible in our docs and flags: acknowledged data younger than
// this can be lost on a host (not process) crash.
const DefaultSyncInterval = 2 * time.Minute

// Store and message limits of an embedded server (Options).
const (
	// DefaultMaxStore is the JetStream file store limit: 16 GiB, room for
	// the default topology's reservations (topology.DefaultReservedBytes,
	// about 7.1 GiB) and more.
	DefaultMaxStore int64 = 16 << 30
	// DefaultMaxMemory is the JetStream memory store limit: 8 GiB.
	DefaultMaxMemory int64 = 8 << 30
	// DefaultMaxPayload is the largest message: 8 MiB (nats-server's own
	// default is 1 MiB), so large error bodies fit.
	DefaultMaxPayload int32 = 8 << 20
)

// DefaultHost is where the embedded server listens unless told otherwise:
// loopback only, since it has no authentication.
const DefaultHost = "127.0.0.1"

// Options configure an embedded server. The zero value is a server on a
// random loopback port storing in a new temporary folder.
type Options struct {
	// Dir is the JetStream store folder. Data there survives restarts,
	// including SIGKILL. Empty means a new temporary folder, removed on
	// Shutdown.
	Dir string
	// Host to listen on. Defaults to DefaultHost.
	Host string
	// Port to listen on; 0 picks a random free port.
	Port int
	// SyncInterval is how often the store is fsynced. Defaults to
	// DefaultSyncInterval. See the package doc for what it means for a host
	// crash.
	SyncInterval time.Duration
	// SyncAlways fsyncs after every write: no loss on host crash, at a large
	// cost in throughput.
	SyncAlways bool
	// ServerName names the server in logs and monitoring. Defaults to
	// "failbus-embedded".
	ServerName string
	// Logging enables nats-server's own log output on stderr.
	Logging bool
	// MaxStore is the JetStream file store limit in bytes (nats-server's
	// max_file_store). JetStream reserves every stream's max_bytes against
	// it, so it must hold topology.DefaultReservedBytes (about 7.1 GiB) for the
	// default topology. Defaults to DefaultMaxStore (16 GiB), whatever the
	// disk has free: the server's own default (75% of the free disk) makes
	// the topology fail on a nearly full disk instead of filling it.
	MaxStore int64
	// MaxMemory is the JetStream memory store limit in bytes, reserved
	// against the same way by memory-storage streams (only tests use them).
	// Defaults to DefaultMaxMemory (8 GiB); memory is used only as messages
	// are stored.
	MaxMemory int64
	// MaxPayload is the largest message the server accepts. Defaults to
	// DefaultMaxPayload (8 MiB).
	MaxPayload int32
	// ConfigFile is a nats-server configuration file read first (users and
	// permissions, TLS, cluster); the fields above then override what it
	// says about the store, host, port, name and sync. Empty: none.
	ConfigFile string
	// Configure, when set, adjusts the server options last, just before
	// the server starts (users, TLS, cluster routes).
	Configure func(*server.Options)
}

// Server is a running embedded nats-server.
type Server struct {
	ns      *server.Server
	dir     string
	tempDir bool
}

// Start starts a server and waits until it accepts connections.
func Start(opts Options) (*Server, error) {
	dir, temp := opts.Dir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "failbus-nats-")
		if err != nil {
			return nil, fmt.Errorf("embedded: create store folder: %w", err)
		}
		dir, temp = d, true
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("embedded: create store folder %s: %w", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("embedded: store folder %s: %w", dir, err)
	}
	host := opts.Host
	if host == "" {
		host = DefaultHost
	}
	port := opts.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	name := opts.ServerName
	if name == "" {
		name = "failbus-embedded"
	}
	sync := opts.SyncInterval
	if sync == 0 {
		sync = DefaultSyncInterval
	}
	so := &server.Options{}
	if opts.ConfigFile != "" {
		if so, err = server.ProcessConfigFile(opts.ConfigFile); err != nil {
			return nil, fmt.Errorf("embedded: %w", err)
		}
	}
	so.ServerName = name
	so.Host = host
	so.Port = port
	so.JetStream = true
	so.StoreDir = abs
	so.SyncInterval = sync
	so.SyncAlways = opts.SyncAlways
	so.NoSigs = true
	so.NoLog = !opts.Logging
	so.MaxPayload = DefaultMaxPayload
	if opts.MaxPayload > 0 {
		so.MaxPayload = opts.MaxPayload
	}
	so.JetStreamMaxStore = DefaultMaxStore
	if opts.MaxStore > 0 {
		so.JetStreamMaxStore = opts.MaxStore
	}
	so.JetStreamMaxMemory = DefaultMaxMemory
	if opts.MaxMemory > 0 {
		so.JetStreamMaxMemory = opts.MaxMemory
	}
	if opts.Configure != nil {
		opts.Configure(so)
	}
	ns, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("embedded: configure nats-server: %w", err)
	}
	if opts.Logging {
		ns.ConfigureLogger()
	}
	ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded: nats-server did not become ready within 30s")
	}
	return &Server{ns: ns, dir: abs, tempDir: temp}, nil
}

// ClientURL is the nats:// URL clients connect to.
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// Dir is the JetStream store folder.
func (s *Server) Dir() string { return s.dir }

// Connect opens a client connection to the server.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(s.ClientURL(), opts...)
	if err != nil {
		return nil, fmt.Errorf("embedded: connect %s: %w", s.ClientURL(), err)
	}
	return nc, nil
}

// NATS exposes the underlying server for tests that need to inspect it.
func (s *Server) NATS() *server.Server { return s.ns }

// Shutdown stops the server and waits for it; a temporary store folder is
// removed.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
	if s.tempDir {
		_ = os.RemoveAll(s.dir)
	}
}

// StartTest starts a server for one test in t.TempDir() on a random port and
// shuts it down when the test ends.
func StartTest(t testing.TB) *Server {
	t.Helper()
	return StartTestOpts(t, Options{Dir: t.TempDir()})
}

// StartTestOpts is StartTest with options (for tests that restart a server
// on the same folder).
func StartTestOpts(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := Start(opts)
	if err != nil {
		t.Fatalf("start embedded nats-server: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

// ConnectTest connects to s and closes the connection when the test ends.
func ConnectTest(t testing.TB, s *Server) *nats.Conn {
	t.Helper()
	nc, err := s.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
