package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"
)

// failbusCmd runs the failbus binary with stdin and returns its stdout,
// stderr and exit code.
func failbusCmd(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, failbusBinary(t), args...)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("failbus %v: %v", args, err)
	}
	return stdout.String(), stderr.String(), code
}

func outcomeLines(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, `{"id":"cli-%03d","at":"2025-03-01T12:00:%02dZ","agent":"cli-agent","provider":"openai","status":%d}`+"\n", i, i%60, []int{200, 429, 503}[i%3])
	}
	return b.String()
}

// classifiedIDs returns how often each outcome id was classified.
func classifiedIDs(ctx context.Context, t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	waitIdle(ctx, t, js, "FAILBUS_OUTCOMES", "classifier")
	seen := map[string]int{}
	for _, m := range readAll(ctx, t, js, "FAILBUS_CLASSIFIED", "failbus.classified.>") {
		var c struct {
			OutcomeID string `msgpack:"outcome_id"`
		}
		if err := msgpack.Unmarshal(m.Data(), &c); err != nil {
			t.Fatal(err)
		}
		seen[c.OutcomeID]++
	}
	return seen
}

func checkExactlyOnce(t *testing.T, seen map[string]int, n int) {
	t.Helper()
	if len(seen) != n {
		t.Errorf("%d outcomes classified, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("%s classified %d times", id, c)
		}
	}
}

// failbus dev keeps its data across a SIGKILL, classifies nothing twice
// after the restart, and publish and tail work against it.
func TestCLIDevPublishTailAcrossSIGKILL(t *testing.T) {
	t.Parallel()
	port, dir := freePort(t), t.TempDir()
	dev := startDev(t, port, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	_, stderr, code := failbusCmd(t, outcomeLines(0, 20), "publish", "--server", dev.url)
	if code != 0 || !strings.Contains(stderr, "20 published, 0 duplicates, 0 invalid, 0 failed") {
		t.Fatalf("publish: exit %d, %s", code, stderr)
	}
	nc, err := nats.Connect(dev.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	checkExactlyOnce(t, classifiedIDs(ctx, t, js), 20)

	// SIGKILL: no drain, no goodbye.
	if err := dev.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("SIGKILLed dev exited cleanly?")
	}
	start := time.Now()
	dev = startDev(t, port, dir)
	t.Logf("restarted after SIGKILL in %v", time.Since(start))
	checkExactlyOnce(t, classifiedIDs(ctx, t, js), 20)
	t.Logf("classifier idle again after %v", time.Since(start))

	// The same 20 again are duplicates; 5 new ones are classified once.
	_, stderr, code = failbusCmd(t, outcomeLines(0, 25), "publish", "--server", dev.url)
	if code != 0 || !strings.Contains(stderr, "5 published, 20 duplicates") {
		t.Fatalf("publish again: exit %d, %s", code, stderr)
	}
	checkExactlyOnce(t, classifiedIDs(ctx, t, js), 25)

	// tail reads it back as JSON Lines.
	stdout, stderr, code := failbusCmd(t, "", "tail", "--server", dev.url, "--no-follow", "--last", "3", "failbus.classified.>")
	if code != 0 {
		t.Fatalf("tail: exit %d, %s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("tail --last 3 printed %d lines:\n%s", len(lines), stdout)
	}
	got := map[string]bool{}
	for i, l := range lines {
		var rec struct {
			Stream string `json:"stream"`
			Data   struct {
				OutcomeID string `json:"outcome_id"`
				Class     string `json:"class"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("tail line %q: %v", l, err)
		}
		if rec.Stream != "FAILBUS_CLASSIFIED" || rec.Data.Class == "" {
			t.Errorf("tail line %d: %+v", i, rec)
		}
		got[rec.Data.OutcomeID] = true
	}
	// The last three classifications the stream holds (the classifier
	// handles outcomes concurrently, so not necessarily those of the last
	// three outcomes).
	all := readAll(ctx, t, js, "FAILBUS_CLASSIFIED", "failbus.classified.>")
	for _, m := range all[len(all)-3:] {
		var c struct {
			OutcomeID string `msgpack:"outcome_id"`
		}
		if err := msgpack.Unmarshal(m.Data(), &c); err != nil {
			t.Fatal(err)
		}
		if !got[c.OutcomeID] {
			t.Errorf("tail --last 3 lacks %s: %v", c.OutcomeID, got)
		}
	}

	if err := dev.stop(t, os.Interrupt); err != nil {
		t.Fatalf("dev after SIGINT: %v\n%s", err, dev.stderr.String())
	}
}

// TestCLIReadmeStartsWithDemoAndTheCITestCommand: README.md opens with the
// two commands a new user needs (the demo and the test command), and .ci/run
// runs exactly that test command, so what CI checks is what the README
// promises.
func TestCLIReadmeStartsWithDemoAndTheCITestCommand(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```sh\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("README.md has no ```sh block")
	}
	var cmds []string
	for line := range strings.Lines(block) {
		cmd, _, _ := strings.Cut(line, "#")
		if cmd = strings.TrimSpace(cmd); cmd != "" {
			cmds = append(cmds, cmd)
		}
	}
	if len(cmds) != 2 || cmds[0] != "go run ./cmd/failbus demo" || !strings.HasPrefix(cmds[1], "go test -race ") {
		t.Fatalf("README's first block is %q, want the demo and a `go test -race` command", cmds)
	}
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	var ciTests []string
	for line := range strings.Lines(string(ci)) {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "go test") {
			ciTests = append(ciTests, line)
		}
	}
	if len(ciTests) != 1 || ciTests[0] != cmds[1] {
		t.Errorf(".ci/run runs %q, want exactly the README's %q", ciTests, cmds[1])
	}
	if !strings.Contains(string(ci), "go vet ./...") {
		t.Error(".ci/run does not run go vet ./...")
	}
}
