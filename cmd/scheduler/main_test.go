package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/service/scheduler"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

func TestUnusableFlagsExitTwo(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
	}{
		{"no poll interval", []string{"--policy-poll", "0s"}},
		{"negative poll interval", []string{"--policy-poll", "-1s"}},
		{"no concurrency", []string{"--concurrency", "0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if code := daemon.Run(t.Context(), spec(), tc.args, io.Discard); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
		})
	}
}

// logBuffer is the binary's stderr, read while it runs.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (w *logBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *logBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestPolicyFileIsFollowed runs the binary's whole start-up against an
// embedded server: the --policy file given to the binary is the one the
// scheduler polls, so a rewrite is in force without a restart.
func TestPolicyFileIsFollowed(t *testing.T) {
	t.Parallel()
	srv := embedded.StartTest(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	write := func(doc string) {
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("retry:\n  max_retries: 1\n")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	logs := &logBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- daemon.Run(rctx, spec(), []string{
			"--nats-url", srv.ClientURL(), "--policy", path, "--policy-poll", "10ms",
			"--ops-addr", "127.0.0.1:0", "--policy-kv=false", "--refusals=false",
		}, logs)
	}()
	poll := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case code := <-done:
				t.Fatalf("scheduler exited %d while waiting for %s; log:\n%s", code, what, logs)
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %s; log:\n%s", what, logs)
			case <-time.After(20 * time.Millisecond): // poll interval, bounded by ctx
			}
		}
	}
	poll("the scheduler to start", func() bool { return strings.Contains(logs.String(), "scheduler started") })

	const doc = "retry:\n  max_retries: 6\n"
	want, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	write(doc)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	audit, err := js.Stream(ctx, topology.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	poll("the rewritten file applied and audited", func() bool {
		m, err := audit.GetLastMsgForSubject(ctx, scheduler.PolicyAuditSubject())
		if err != nil {
			return false
		}
		var a scheduler.PolicyAudit
		if err := events.Unmarshal(m.Data, &a); err != nil {
			t.Fatal(err)
		}
		return a.Kind == scheduler.PolicyApplied && a.PolicyKey == want.RetryFor("").Key() && strings.HasPrefix(a.Source, "file "+path)
	})
	stop()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d after the drain, want 0; log:\n%s", code, logs)
		}
	case <-ctx.Done():
		t.Fatal("no exit after cancel")
	}
}
