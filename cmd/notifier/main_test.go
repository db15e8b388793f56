package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/pkg/events"
)

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The command applies the topology, delivers a request to the policy's
// webhook, and exits 0 when told to stop.
func TestRunDeliversAndDrains(t *testing.T) {
	srv := embedded.StartTest(t)
	got := make(chan string, 4)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- string(b)
	}))
	t.Cleanup(hook.Close)
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("notify:\n  sinks:\n    - {name: ops, type: webhook, url: \""+hook.URL+"\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"--nats-url", srv.ClientURL(), "--ops-addr", "127.0.0.1:0", "--policy", pol}, &stderr)
	}()

	nc := embedded.ConnectTest(t, srv)
	n := &events.Notification{DedupeKey: "cmd-test", Severity: events.SeverityCritical, Title: "from the command test"}
	data, hdr, err := events.Encode(n)
	if err != nil {
		t.Fatal(err)
	}
	// The stream exists once the command has applied the topology.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := nc.RequestMsg(&nats.Msg{Subject: events.NotifySubject(n.Severity), Header: hdr, Data: data}, time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish: %v\n%s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case body := <-got:
		if !strings.Contains(body, `"dedupe_key":"cmd-test"`) {
			t.Errorf("webhook got %s", body)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no delivery\n%s", stderr.String())
	}
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("exit code %d\n%s", c, stderr.String())
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag"}, {"extra"}, {"--log-level", "loud"}} {
		if c := run(context.Background(), args, io.Discard); c != 2 {
			t.Errorf("run(%q) = %d, want 2", args, c)
		}
	}
}
