package consumer_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/pkg/consumer"
)

// Environment of the child process of TestPipelinedRunnerSIGKILLMidWindow.
const (
	envChildURL  = "FAILBUS_TEST_PIPELINE_CHILD_URL"
	envChildKill = "FAILBUS_TEST_PIPELINE_CHILD_KILL_AFTER"
)

// pipelineInputs and pipelineOutputs size the SIGKILL test: every input
// has two outputs, so a window of inputs has twice as many async publishes
// in flight.
const (
	pipelineInputs  = 2000
	pipelineOutputs = 2
)

// pipelineConfig is the runner both processes of the SIGKILL test run: a
// keyed pipeline with several workers and a window far larger than one
// message, AckWait short so the dead process's inputs come back quickly.
func pipelineConfig() consumer.Config {
	cfg := config()
	cfg.ConsumerConfig.AckWait = 2 * time.Second
	cfg.ConsumerConfig.MaxAckPending = 512
	cfg.Concurrency = 4
	cfg.MaxInFlight = 256
	cfg.Key = func(m *consumer.Msg) string { return m.Subject }
	return cfg
}

// pipelineHandler publishes the input's outputs; onHandled counts calls.
func pipelineHandler(onHandled func(n int64)) consumer.Handler {
	var calls atomic.Int64
	return func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		for k := range pipelineOutputs {
			out.Publish("test.out."+m.Subject[len("test.in."):], note(m.ID()), strconv.Itoa(k))
		}
		if onHandled != nil {
			onHandled(calls.Add(1))
		}
		return nil
	}
}

// TestPipelinedRunnerChildProcess is the process the SIGKILL test kills; it
// runs only when that test starts it.
func TestPipelinedRunnerChildProcess(t *testing.T) {
	url := os.Getenv(envChildURL)
	if url == "" {
		t.Skip("run by TestPipelinedRunnerSIGKILLMidWindow")
	}
	killAfter, _ := strconv.ParseInt(os.Getenv(envChildKill), 10, 64)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r, err := consumer.New(js, pipelineConfig(), pipelineHandler(func(n int64) {
		if n == killAfter {
			// The parent kills this process on reading the line: the
			// outputs of this input and of the ones before it in the window
			// are being stored, their inputs not acknowledged.
			fmt.Println("handled", n)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = r.Run(ctx) // until SIGKILL
}

// TestPipelinedRunnerSIGKILLMidWindow: a process running the pipelined
// runner is SIGKILLed while a window of inputs is handled and their outputs'
// async publishes are in flight; a restarted runner completes the work.
// Counted by Nats-Msg-Id on the real server: every output of every input
// is stored exactly once — nothing lost, nothing doubled.
func TestPipelinedRunnerSIGKILLMidWindow(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts a child process")
	}
	b := setup(t)
	js, err := jetstream.New(b.nc, jetstream.WithPublishAsyncMaxPending(512))
	if err != nil {
		t.Fatal(err)
	}
	for i := range pipelineInputs {
		m := &nats.Msg{Subject: fmt.Sprintf("test.in.k%d", i%7), Data: []byte("x"), Header: nats.Header{}}
		m.Header.Set(nats.MsgIdHdr, fmt.Sprintf("in-%d", i))
		// A full window waits for room (the default stall wait, 200 ms,
		// fails the publish on a loaded machine: "stalled with too many
		// outstanding async published messages").
		if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-b.ctx.Done():
		t.Fatal("inputs not stored")
	}

	// The child process, killed once it has handled a third of the inputs.
	cmd := exec.CommandContext(b.ctx, os.Args[0], "-test.run=^TestPipelinedRunnerChildProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), envChildURL+"="+b.srv.ClientURL(), envChildKill+"="+strconv.Itoa(pipelineInputs/3))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	killed := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "handled ") {
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = true
			break
		}
	}
	_ = cmd.Wait()
	if !killed {
		t.Fatal("the child process ended before it was killed")
	}

	// Mid-window: inputs were held unacknowledged by the dead process, and
	// not every output was stored.
	cons, err := b.js.Consumer(b.ctx, inStream, service)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	stored := b.count(outStream)
	t.Logf("at the kill: %d inputs unacknowledged, %d acknowledged, %d of %d outputs stored",
		info.NumAckPending, info.AckFloor.Stream, stored, pipelineInputs*pipelineOutputs)
	if info.NumAckPending == 0 || stored >= pipelineInputs*pipelineOutputs {
		t.Fatalf("the kill did not land mid-window: %d inputs unacknowledged, %d outputs stored", info.NumAckPending, stored)
	}

	// The restart.
	b.start(pipelineConfig(), pipelineHandler(nil))
	b.waitFor("every input settled", func() bool { return b.settled(service) })
	seen := map[string]int{}
	for _, m := range b.read(outStream) {
		seen[m.Headers().Get(nats.MsgIdHdr)]++
	}
	var lost, doubled int
	for i := range pipelineInputs {
		for k := range pipelineOutputs {
			id := msgid.Output(service, fmt.Sprintf("in-%d", i), strconv.Itoa(k))
			switch seen[id] {
			case 0:
				lost++
			case 1:
			default:
				doubled++
			}
			delete(seen, id)
		}
	}
	if lost != 0 || doubled != 0 || len(seen) != 0 {
		t.Errorf("outputs: %d lost, %d doubled, %d unexpected", lost, doubled, len(seen))
	}
}

// BenchmarkRunnerPipeline measures the runner's hot path on a real
// embedded server: one input in, one output stored, the input
// acknowledged, with -benchmem showing the allocations per message
// (client side: the runner, nats.go and the test's publisher).
func BenchmarkRunnerPipeline(b *testing.B) {
	for _, conc := range []int{1, 4} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) {
			srv := embedded.StartTestOpts(b, embedded.Options{Dir: b.TempDir()})
			nc := embedded.ConnectTest(b, srv)
			js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1024))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			for name, subj := range map[string]string{inStream: "test.in.>", outStream: "test.out.>"} {
				if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, Duplicates: time.Minute}); err != nil {
					b.Fatal(err)
				}
			}
			data := []byte("payload")
			for i := range b.N {
				m := &nats.Msg{Subject: "test.in.x", Data: data, Header: nats.Header{}}
				m.Header.Set(nats.MsgIdHdr, "in-"+strconv.Itoa(i))
				if _, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute)); err != nil {
					b.Fatal(err)
				}
			}
			<-js.PublishAsyncComplete()
			cfg := config()
			cfg.Concurrency = conc
			done := make(chan struct{})
			var handled atomic.Int64
			r, err := consumer.New(js, cfg, func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
				out.Publish("test.out.x", note(m.ID()), "")
				if handled.Add(1) == int64(b.N) {
					close(done)
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			rctx, stop := context.WithCancel(ctx)
			ran := make(chan error, 1)
			go func() { ran <- r.Run(rctx) }()
			<-done
			stop()
			if err := <-ran; err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
		})
	}
}

// TestKeyedInputsNeverWaitBehindAnotherKey: with Key, one key's inputs are
// handled one at a time and in order, and an input of another key goes to
// a free worker while the first key's input is still in its handler. (Keys
// hashed onto workers put "k-a" and "k-c" on one worker of two: k-c then
// waited for k-a's slow handler.)
func TestKeyedInputsNeverWaitBehindAnotherKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := config()
	cfg.Concurrency = 2
	cfg.Key = func(m *consumer.Msg) string { return m.Subject[len("test.in."):] }
	release := make(chan struct{})
	var mu sync.Mutex
	var order []string // "key/id" as handlers start
	inA := 0           // k-a handlers running
	b.start(cfg, func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
		key := m.Subject[len("test.in."):]
		mu.Lock()
		order = append(order, key+"/"+m.ID())
		if key == "k-a" {
			inA++
			if inA > 1 {
				t.Errorf("two k-a inputs in handlers at once")
			}
		}
		mu.Unlock()
		if m.ID() == "a-1" {
			select { // slow: until the test has seen k-c through
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		mu.Lock()
		if key == "k-a" {
			inA--
		}
		mu.Unlock()
		out.Publish("test.out."+key, note(m.ID()), "")
		return nil
	})
	b.publishIn("test.in.k-a", "a-1", []byte("x"))
	b.publishIn("test.in.k-a", "a-2", []byte("x"))
	for i := range 5 {
		b.publishIn("test.in.k-c", fmt.Sprintf("c-%d", i), []byte("x"))
	}
	b.waitFor("k-c's five inputs handled while a-1 is in its handler", func() bool { return b.count(outStream) == 5 })
	mu.Lock()
	for _, o := range order {
		if o == "k-a/a-2" {
			t.Errorf("a-2 started while a-1 was in its handler: %v", order)
		}
	}
	mu.Unlock()
	close(release)
	b.waitFor("every input handled", func() bool { return b.count(outStream) == 7 && b.settled(service) })
	mu.Lock()
	defer mu.Unlock()
	var a, c []string
	for _, o := range order {
		switch {
		case strings.HasPrefix(o, "k-a/"):
			a = append(a, o)
		case strings.HasPrefix(o, "k-c/"):
			c = append(c, o)
		}
	}
	if strings.Join(a, ",") != "k-a/a-1,k-a/a-2" {
		t.Errorf("k-a handled as %v, want a-1 then a-2", a)
	}
	for i, o := range c {
		if want := fmt.Sprintf("k-c/c-%d", i); o != want {
			t.Errorf("k-c handled as %v, want c-0 … c-4 in order", c)
			break
		}
	}
}
