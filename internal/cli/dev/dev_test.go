package dev

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

var devLine = regexp.MustCompile(`NATS_URL=(nats://\S+)\s.*/metrics,/healthz: (http://\S+)\)`)

// startDevInProcess runs dev with args until the returned stop is called,
// and returns the client and ops URLs it printed.
func startDevInProcess(t *testing.T, args ...string) (natsURL, opsURL string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &clitest.SyncBuffer{}, &clitest.SyncBuffer{}
	done := make(chan int, 1)
	go func() { done <- dev(ctx, args, out, errOut) }()
	var m []string
	clitest.WaitFor(t, "dev to print its URL", func() bool {
		select {
		case code := <-done:
			t.Fatalf("dev exited %d: %s", code, errOut.String())
		default:
		}
		m = devLine.FindStringSubmatch(out.String())
		return m != nil
	})
	return m[1], m[2], func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(60 * time.Second):
			t.Fatalf("dev did not stop: %s", errOut.String())
		}
		return -1
	}
}

func TestCLIDev(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "store")
	args := []string{"--port", "0", "--data", data, "--ops-addr", "127.0.0.1:0", "--sync-interval", "1s"}
	url, ops, stop := startDevInProcess(t, args...)

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	ag, err := agent.New(nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ag.Report(ctx, &events.Outcome{ID: "o-1", Provider: "openai", Status: 429}); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	clitest.WaitFor(t, "the classification", func() bool {
		s, err := js.Stream(ctx, "FAILBUS_CLASSIFIED")
		return err == nil && s.CachedInfo().State.Msgs == 1
	})
	for path, want := range map[string]string{
		"/healthz": "ok", "/metrics": "failbus_classifier_classified_total",
		// The live status page, its snapshot, and the consumers' lag.
		"/status": "failbus — live status", "/status.json": `"name":"classifier"`,
	} {
		resp, err := http.Get(ops + path)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %s %v", path, resp.StatusCode, body, err)
		}
	}
	nc.Close()
	if code := stop(); code != 0 {
		t.Fatalf("dev exit %d after cancel", code)
	}
	if _, err := os.Stat(filepath.Join(data, "jetstream")); err != nil {
		t.Fatalf("no store in --data: %v", err)
	}

	// Restarted on the same folder, the data is there and nothing is
	// classified again.
	url, _, stop = startDevInProcess(t, args...)
	nc, err = nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	for stream, want := range map[string]uint64{"FAILBUS_OUTCOMES": 1, "FAILBUS_CLASSIFIED": 1} {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().State.Msgs; got != want {
			t.Errorf("%s after restart: %d messages, want %d", stream, got, want)
		}
	}
	if code := stop(); code != 0 {
		t.Fatalf("dev exit %d after cancel", code)
	}
}

func TestCLIDevUsage(t *testing.T) {
	t.Parallel()
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("retry:\n  nonsense: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		has  string
	}{
		{"dev with a bad port", []string{"--port", "70000"}, "not a port"},
		{"dev with a policy that has an unknown key", []string{"--policy", policy}, "nonsense"},
		{"dev with a missing policy file", []string{"--policy", "/nonexistent/policy.yaml"}, "policy"},
		{"dev with a zero sync interval", []string{"--sync-interval", "0s"}, "sync-interval"},
		{"dev with an argument", []string{"extra"}, "unexpected"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut := &clitest.SyncBuffer{}, &clitest.SyncBuffer{}
			if code := dev(context.Background(), tt.args, out, errOut); code != 2 || !strings.Contains(errOut.String(), tt.has) {
				t.Errorf("exit %d, stderr %q; want 2 and %q", code, errOut.String(), tt.has)
			}
		})
	}
}

func TestCLIDevPortTaken(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	out, errOut := &clitest.SyncBuffer{}, &clitest.SyncBuffer{}
	code := dev(context.Background(), []string{"--port", strconv.Itoa(port), "--data", t.TempDir()}, out, errOut)
	if code != 1 || !strings.Contains(errOut.String(), fmt.Sprintf("port %d", port)) {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}

// A second dev on the same --data exits at once and names the first's
// PID, instead of both replaying one store.
func TestCLIDevDataFolderLocked(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "store")
	_, _, stop := startDevInProcess(t, "--port", "0", "--data", data, "--ops-addr", "127.0.0.1:0")
	out, errOut := &clitest.SyncBuffer{}, &clitest.SyncBuffer{}
	code := dev(context.Background(), []string{"--port", "0", "--data", data, "--ops-addr", "off"}, out, errOut)
	want := fmt.Sprintf("pid %d", os.Getpid())
	if code != 1 || !strings.Contains(errOut.String(), want) || !strings.Contains(errOut.String(), data) {
		t.Errorf("second dev: exit %d, stderr %q; want 1 naming %s and %q", code, errOut.String(), data, want)
	}
	if strings.Contains(errOut.String(), "consumer started") {
		t.Errorf("second dev started services: %s", errOut.String())
	}
	if code := stop(); code != 0 {
		t.Fatalf("first dev exit %d", code)
	}
}

// A taken ops address is found before any service starts.
func TestCLIDevOpsAddressTaken(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out, errOut := &clitest.SyncBuffer{}, &clitest.SyncBuffer{}
	code := dev(context.Background(), []string{"--port", "0", "--data", t.TempDir(), "--ops-addr", l.Addr().String()}, out, errOut)
	if code != 1 || !strings.Contains(errOut.String(), l.Addr().String()) {
		t.Errorf("exit %d, stderr %q; want 1 naming %s", code, errOut.String(), l.Addr())
	}
	if strings.Contains(errOut.String(), "consumer started") || strings.Contains(errOut.String(), "drain") {
		t.Errorf("services started before the ops address was checked:\n%s", errOut.String())
	}
}
