package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/embedded"
)

// idle is a service that runs until its context ends.
type idle struct{}

func (idle) Run(ctx context.Context) error { <-ctx.Done(); return nil }
func (idle) Healthy() error                { return nil }

// run runs a service binary with args until it exits or ctx ends and
// returns its exit code and stderr; built reports whether Build was
// reached, and onBuild (when not nil) is called then.
func run(ctx context.Context, onBuild func(), args ...string) (code int, stderr string, built bool) {
	var buf lockedBuffer
	spec := daemon.Spec{
		Name: "probe", DefaultOpsAddr: "127.0.0.1:0",
		Build: func(context.Context, daemon.Env) (daemon.Service, error) {
			built = true
			if onBuild != nil {
				onBuild()
			}
			return idle{}, nil
		},
	}
	code = daemon.Run(ctx, spec, append(args, "--ops-addr", "127.0.0.1:0"), &buf)
	return code, buf.String(), built
}

// lockedBuffer is a bytes.Buffer safe for the logger's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// restricted starts a server with one nkey user that may only use its own
// inbox and ask for JetStream account info, like a role whose permissions
// leave the topology alone.
func restricted(t *testing.T) (url, seed string) {
	t.Helper()
	for _, v := range []string{connect.EnvServer, connect.EnvCreds, connect.EnvNkey, connect.EnvUser, connect.EnvPassword} {
		t.Setenv(v, "")
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	s, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	seed = filepath.Join(t.TempDir(), "classifier.nk")
	if err := os.WriteFile(seed, s, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := embedded.StartTestOpts(t, embedded.Options{Dir: t.TempDir(), Configure: func(o *server.Options) {
		o.Nkeys = []*server.NkeyUser{{Nkey: pub, Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"$JS.API.INFO", "$JS.API.STREAM.INFO.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{connect.InboxPrefixFor(pub) + ".>"}},
		}}}
	}})
	return srv.ClientURL(), seed
}

func TestConnectionFlags(t *testing.T) {
	url, seed := restricted(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	t.Run("without credentials the service says which flags to give", func(t *testing.T) {
		code, stderr, built := run(ctx, nil, "--server", url)
		if code != 1 || built || !strings.Contains(stderr, "requires credentials: give --creds, --nkey or --user/--password") {
			t.Errorf("exit %d, built %v, stderr:\n%s", code, built, stderr)
		}
	})
	t.Run("a role's credentials cannot apply the topology, and the error says what to do", func(t *testing.T) {
		code, stderr, built := run(ctx, nil, "--nats-url", url, "--nkey", seed)
		if code != 1 || built {
			t.Errorf("exit %d, built %v", code, built)
		}
		for _, want := range []string{"permission denied publishing $JS.API.STREAM.CREATE.", "as user classifier", "start it with --no-apply"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, stderr)
			}
		}
	})
	t.Run("with --no-apply it runs under the role's credentials", func(t *testing.T) {
		// It runs until stopped: stop it once it built its service.
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		code, stderr, built := run(rctx, stop, "--server", url, "--nkey", seed, "--no-apply")
		if code != 0 || !built {
			t.Errorf("exit %d, built %v, stderr:\n%s", code, built, stderr)
		}
		if !strings.Contains(stderr, `"user":"classifier"`) {
			t.Errorf("the start-up log does not name the user:\n%s", stderr)
		}
	})
	t.Run("unusable connection flags exit 2", func(t *testing.T) {
		code, stderr, _ := run(ctx, nil, "--server", url, "--nkey", seed, "--user", "x")
		if code != 2 || !strings.Contains(stderr, "give one kind of credentials") {
			t.Errorf("exit %d, stderr:\n%s", code, stderr)
		}
	})
}

// --check-health asks a running service's /healthz (the container health
// check), and says when nothing answers.
func TestCheckHealth(t *testing.T) {
	url, seed := restricted(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var buf lockedBuffer
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan int, 1)
	spec := daemon.Spec{
		Name: "probe", DefaultOpsAddr: "127.0.0.1:0",
		Build: func(context.Context, daemon.Env) (daemon.Service, error) { return idle{}, nil },
	}
	// Find a free port for the service's ops address.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, port, _ := net.SplitHostPort(addr)
	go func() {
		done <- daemon.Run(rctx, spec, []string{"--server", url, "--nkey", seed, "--no-apply", "--ops-addr", addr}, &buf)
	}()
	check := func() int {
		var out bytes.Buffer
		return daemon.Run(ctx, spec, []string{"--check-health", "--ops-addr", "0.0.0.0:" + port}, &out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for check() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the running service never answered healthy:\n%s", buf.String())
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("service exit %d", code)
	}
	// The stopped service's port is free again, and another test's service
	// may be given it (that answered healthy once: exit 0). Hold it with a
	// server whose /healthz says 503, as a service that is not ready does;
	// if someone took the port first, any other free port does as well.
	l, err = net.Listen("tcp", addr)
	if err != nil {
		if l, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	unhealthy := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	})}
	go func() { _ = unhealthy.Serve(l) }()
	defer unhealthy.Close()
	var out bytes.Buffer
	if code := daemon.Run(ctx, spec, []string{"--check-health", "--ops-addr", l.Addr().String()}, &out); code != 1 || !strings.Contains(out.String(), "/healthz") {
		t.Errorf("check of a service answering 503: exit %d, %q", code, out.String())
	}
}

// stuck is a service whose Run never ends once started, as one stuck on a
// store that does not answer.
type stuck struct{ release chan struct{} }

func (s stuck) Run(context.Context) error { <-s.release; return nil }
func (stuck) Healthy() error              { return errors.New("stuck on a write") }

// TestRunBoundedStopsWaitingAtTheTimeout: a service that has not drained
// by the shutdown timeout after its context ended is left running and
// ErrShutdownTimeout returned, naming its health; one that drains in time
// returns what Run returned.
func TestRunBoundedStopsWaitingAtTheTimeout(t *testing.T) {
	t.Parallel()
	s := stuck{release: make(chan struct{})}
	defer close(s.release)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := daemon.RunBounded(ctx, s, 50*time.Millisecond, zerolog.Nop())
	if !errors.Is(err, daemon.ErrShutdownTimeout) || !strings.Contains(err.Error(), "stuck on a write") {
		t.Errorf("a stuck drain: %v, want ErrShutdownTimeout with its health", err)
	}
	done := stuck{release: make(chan struct{})}
	close(done.release)
	if err := daemon.RunBounded(ctx, done, time.Minute, zerolog.Nop()); err != nil {
		t.Errorf("a drain in time: %v", err)
	}
	if code := daemon.Run(context.Background(), daemon.Spec{Name: "x"}, []string{"--shutdown-timeout", "0s"}, io.Discard); code != 2 {
		t.Errorf("--shutdown-timeout 0s: exit %d, want 2", code)
	}
}
