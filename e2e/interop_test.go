package e2e

// An agent written with nothing but nats.go and msgpack — no failbus package
// is imported in this file — following CONTRACT.md "On the bus", against a
// real `failbus dev` process. It is what an agent in any other language does.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"
)

// buildOnce builds the failbus binary once for every test in this package.
var buildOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "failbus-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "failbus")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/failbus/failbus/cmd/failbus").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/failbus: %v\n%s", err, out)
	}
	return bin, nil
})

// failbusBinary returns the path of a freshly built failbus binary.
func failbusBinary(t *testing.T) string {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// devProcess is a running `failbus dev`.
type devProcess struct {
	cmd    *exec.Cmd
	url    string
	stderr *lockedBuffer
	exited chan error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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

var urlLine = regexp.MustCompile(`nats://127\.0\.0\.1:\d+`)

// startDev runs `failbus dev --port <port> --data <dir>` and waits for the
// line that prints its client URL.
func startDev(t *testing.T, port int, dir string, extra ...string) *devProcess {
	t.Helper()
	args := append([]string{"dev", "--port", fmt.Sprint(port), "--data", dir, "--ops-addr", "127.0.0.1:0"}, extra...)
	cmd := exec.Command(failbusBinary(t), args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &devProcess{cmd: cmd, stderr: &lockedBuffer{}, exited: make(chan error, 1)}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u := urlLine.FindString(sc.Text()); u != "" {
				select {
				case found <- u:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case p.url = <-found:
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("failbus dev exited before printing its URL: %v\n%s", err, p.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("failbus dev printed no URL within 60s\n%s", p.stderr.String())
	}
	if want := fmt.Sprintf("nats://127.0.0.1:%d", port); p.url != want {
		t.Fatalf("failbus dev printed %s, want %s", p.url, want)
	}
	return p
}

// stop sends sig and waits for the exit.
func (p *devProcess) stop(t *testing.T, sig os.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("failbus dev did not exit within 60s of %v\n%s", sig, p.stderr.String())
	}
	return nil
}

// junk is what a broken agent might publish; each must be dead-lettered
// with a reason that says what is wrong.
type junk struct {
	name   string
	data   []byte
	header nats.Header
	reason *regexp.Regexp
}

func mustMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestInteropPlainAgent(t *testing.T) {
	t.Parallel()
	dev := startDev(t, freePort(t), t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	nc, err := nats.Connect(dev.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	// N outcomes, as plain maps with snake_case keys. They vary in every way
	// the contract allows: time as epoch ms, as RFC 3339, as a msgpack
	// timestamp; with and without the schema header; JetStream publish with
	// ack, and fire-and-forget core publish; unknown extra fields.
	const n = 60
	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	want := map[string]string{} // outcome id -> the class its evidence calls for
	for i := range n {
		id := fmt.Sprintf("interop-%03d", i)
		o := map[string]any{
			"id":       id,
			"agent":    "plain-agent",
			"session":  "s1",
			"turn":     i,
			"provider": []string{"openai", "anthropic", "my-gateway"}[i%3],
			"model":    "m-1",
			"profile":  fmt.Sprintf("key-%d", i%2),
		}
		switch i % 3 {
		case 0:
			o["at"] = base.Add(time.Duration(i) * time.Second).UnixMilli()
		case 1:
			o["at"] = base.Add(time.Duration(i) * time.Second).Format(time.RFC3339Nano)
		case 2:
			o["at"] = base.Add(time.Duration(i) * time.Second) // msgpack timestamp
		}
		switch i % 4 {
		case 0:
			o["ok"], o["status"], o["body"] = true, 200, `{"choices":[{"message":{"content":"hi"}}]}`
			want[id] = "ok"
		case 1:
			o["status"], o["headers"] = 429, map[string]string{"retry-after": "3"}
			o["body"] = `{"error":{"type":"rate_limit_error","message":"Too many requests"}}`
			want[id] = "rate_limit"
		case 2:
			o["status"], o["transport_error"] = 0, "read tcp 10.0.0.2:443: ECONNRESET"
			want[id] = "transport"
		case 3:
			o["status"], o["body"], o["x_vendor_extra"] = 401, `{"error":{"message":"invalid api key"}}`, []int{1, 2}
			want[id] = "auth"
		}
		subject := "failbus.outcome." + o["provider"].(string) + ".plain-agent"
		msg := &nats.Msg{Subject: subject, Data: mustMsgpack(t, o), Header: nats.Header{}}
		msg.Header.Set("Nats-Msg-Id", id)
		if i%5 != 0 { // every fifth has no schema header at all
			msg.Header.Set("Failbus-Schema", "outcome/1")
			msg.Header.Set("Content-Type", "application/msgpack")
		}
		if i%2 == 0 {
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				t.Fatalf("publish %s: %v", id, err)
			}
		} else if err := nc.PublishMsg(msg); err != nil {
			t.Fatalf("core publish %s: %v", id, err)
		}
	}
	// The same outcomes again (an agent retrying after a lost ack) change
	// nothing.
	for i := 0; i < n; i += 7 {
		id := fmt.Sprintf("interop-%03d", i)
		msg := &nats.Msg{Subject: "failbus.outcome.openai.plain-agent", Header: nats.Header{}, Data: mustMsgpack(t, map[string]any{"id": id, "agent": "plain-agent", "provider": "openai", "status": 500})}
		msg.Header.Set("Nats-Msg-Id", id)
		ack, err := js.PublishMsg(ctx, msg)
		if err != nil {
			t.Fatal(err)
		}
		if !ack.Duplicate {
			t.Errorf("republished %s was not recognised as a duplicate", id)
		}
	}

	junks := []junk{
		{name: "not msgpack", data: []byte("this is not msgpack"), reason: regexp.MustCompile(`(?i)msgpack`)},
		{name: "no id", data: mustMsgpack(t, map[string]any{"agent": "plain-agent", "provider": "openai", "status": 500}), reason: regexp.MustCompile(`"id"`)},
		{name: "unreadable time", data: mustMsgpack(t, map[string]any{"id": "junk-time", "agent": "plain-agent", "provider": "openai", "at": "last tuesday"}), reason: regexp.MustCompile(`"at"`)},
		{name: "status of the wrong type", data: mustMsgpack(t, map[string]any{"id": "junk-status", "agent": "plain-agent", "provider": "openai", "status": "five hundred"}), reason: regexp.MustCompile(`"status"`)},
		{name: "an unknown schema", data: mustMsgpack(t, map[string]any{"id": "junk-schema"}), header: nats.Header{"Failbus-Schema": {"telemetry/1"}}, reason: regexp.MustCompile(`telemetry`)},
	}
	for _, j := range junks {
		msg := &nats.Msg{Subject: "failbus.outcome.openai.plain-agent", Data: j.data, Header: j.header}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatalf("publish junk %s: %v", j.name, err)
		}
	}

	// Every outcome is classified exactly once: wait until the classifier's
	// durable consumer has nothing pending and nothing unacknowledged, then
	// read everything FAILBUS_CLASSIFIED holds.
	waitIdle(ctx, t, js, "FAILBUS_OUTCOMES", "classifier")
	classified := readAll(ctx, t, js, "FAILBUS_CLASSIFIED", "failbus.classified.>")
	seen := map[string]int{}
	for _, m := range classified {
		var c map[string]any
		if err := msgpack.Unmarshal(m.Data(), &c); err != nil {
			t.Fatalf("classification on %s is not msgpack: %v", m.Subject(), err)
		}
		id, _ := c["outcome_id"].(string)
		seen[id]++
		class, _ := c["class"].(string)
		if w, ok := want[id]; ok && class != w {
			t.Errorf("%s classified %q (rule %v), want %q", id, class, c["rule"], w)
		}
		if rule, _ := c["rule"].(string); rule == "" {
			t.Errorf("%s: classification names no rule", id)
		}
		parts := strings.Split(m.Subject(), ".")
		if len(parts) != 4 || parts[3] != class {
			t.Errorf("%s: subject %s does not end in its class %q", id, m.Subject(), class)
		}
	}
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("%s classified %d times, want exactly once", id, seen[id])
		}
	}
	if len(classified) != n {
		t.Errorf("%d classifications, want %d", len(classified), n)
	}

	// The junk is dead-lettered, each with a reason, the original subject
	// and the original bytes.
	dead := readAll(ctx, t, js, "FAILBUS_DLQ", "failbus.dlq.classifier")
	if len(dead) != len(junks) {
		t.Errorf("%d dead letters, want %d", len(dead), len(junks))
	}
	for _, j := range junks {
		found := false
		for _, m := range dead {
			var d struct {
				Reason  string `msgpack:"reason"`
				Subject string `msgpack:"subject"`
				Data    []byte `msgpack:"data"`
			}
			if err := msgpack.Unmarshal(m.Data(), &d); err != nil {
				t.Fatalf("dead letter is not msgpack: %v", err)
			}
			if string(d.Data) == string(j.data) {
				found = true
				if !j.reason.MatchString(d.Reason) {
					t.Errorf("junk %q: reason %q does not match %s", j.name, d.Reason, j.reason)
				}
				if d.Subject != "failbus.outcome.openai.plain-agent" {
					t.Errorf("junk %q: original subject %q", j.name, d.Subject)
				}
			}
		}
		if !found {
			t.Errorf("junk %q was not dead-lettered", j.name)
		}
	}

	// SIGTERM drains and exits 0.
	if err := dev.stop(t, syscall.SIGTERM); err != nil {
		t.Fatalf("failbus dev after SIGTERM: %v\n%s", err, dev.stderr.String())
	}
}

// waitIdle waits until a durable consumer has delivered and had acknowledged
// everything its stream holds.
func waitIdle(ctx context.Context, t *testing.T, js jetstream.JetStream, stream, consumer string) {
	t.Helper()
	for {
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			t.Fatalf("consumer %s: %v", consumer, err)
		}
		info := c.CachedInfo()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= s.CachedInfo().State.LastSeq {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("consumer %s not idle: pending %d, ack pending %d", consumer, info.NumPending, info.NumAckPending)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// readAll reads every message a stream holds on filter, with an ordered
// consumer (no state left on the server).
func readAll(ctx context.Context, t *testing.T, js jetstream.JetStream, stream, filter string) []jetstream.Msg {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for {
		batch, err := c.FetchNoWait(500)
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			out = append(out, m)
			got++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			t.Fatal(err)
		}
		if got == 0 {
			return out
		}
	}
}
