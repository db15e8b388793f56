package bench

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/pkg/events"
)

// TestPlumbing runs the plumbing twice (two rounds) and checks what the
// row stands for: every outcome classified, a decision stored for each,
// a ledger entry and a schedule for each retry the default policy allows,
// every message acknowledged; and that it leaves nothing for
// the measurements after it (its consumers, its messages, its pending
// schedules).
func TestPlumbing(t *testing.T) {
	t.Parallel()
	corpus, _, err := loadBenchCorpus("")
	if err != nil {
		t.Fatal(err)
	}
	b, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-bench-plumbing"}, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	nc, err := b.Srv.Connect(nats.Name("failbus-bench"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 300
	r := &benchRunner{cfg: benchConfig{n: n, window: 64}, b: b, js: js, corpus: corpus}
	if err := r.scratchStreams(ctx); err != nil {
		t.Fatal(err)
	}
	pol := retry.Default().Resolve("")
	for round := range 2 {
		raw, _, err := r.ingestMsgs(round)
		if err != nil {
			t.Fatal(err)
		}
		retries := 0
		for _, m := range raw {
			o, err := events.DecodeAs[*events.Outcome](m.Subject, m.Header, m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if pol.IsRetryable(classify.Classify(o).Class) {
				retries++
			}
		}
		if retries == 0 || retries == n {
			t.Fatalf("round %d: %d retries of %d: the corpus should mix", round, retries, n)
		}
		before := streamTotals(t, ctx, js)
		_, use, err := r.plumbing(ctx, plumbMsgs(raw))
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if _, ok := cpuTime(); ok && use.cpu <= 0 {
			t.Errorf("round %d: the plumbing's CPU time is %v", round, use.cpu)
		}
		if use.allocs <= 0 || use.allocBytes < use.allocs {
			t.Errorf("round %d: the plumbing allocated %v objects, %v bytes", round, use.allocs, use.allocBytes)
		}
		after := streamTotals(t, ctx, js)
		// Purged after the run, so what was stored shows in the
		// streams' last sequence; nothing is left in them.
		for stream, want := range map[string]uint64{
			benchRawStream:       n,
			benchPlumbClassified: n,
			benchPlumbDecisions:  n,
			benchSchedStream:     uint64(2 * retries),
		} {
			if got := after[stream].LastSeq - before[stream].LastSeq; got != want {
				t.Errorf("round %d: %s stored %d messages, want %d", round, stream, got, want)
			}
			if after[stream].Msgs != 0 {
				t.Errorf("round %d: %s keeps %d messages after the plumbing", round, stream, after[stream].Msgs)
			}
		}
		for _, c := range []struct{ stream, name string }{
			{benchRawStream, "bench-plumb-classify"}, {benchPlumbClassified, "bench-plumb-decide"},
		} {
			if _, err := js.Consumer(ctx, c.stream, c.name); err == nil {
				t.Errorf("round %d: consumer %s/%s left behind", round, c.stream, c.name)
			}
		}
	}
}

// streamTotals is the state of the plumbing's streams.
func streamTotals(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]jetstream.StreamState {
	t.Helper()
	out := map[string]jetstream.StreamState{}
	for _, name := range []string{benchRawStream, benchPlumbClassified, benchPlumbDecisions, benchSchedStream} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = info.State
	}
	return out
}
