package e2e

import (
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// quickStartPublish finds the README's quick-start publish commands.
var quickStartPublish = regexp.MustCompile(`(?m)^echo '(\{.*\})' \| go run \./cmd/failbus publish`)

// The README's quick start, run as written against failbus dev
// (each publish command run to completion, then the next, as a person
// types them), gives each of its failures its own retry episode: retry 1
// each, distinct retry ids — not retries 1, 2, … of one lifetime budget.
func TestReadmeQuickStartEachFailureItsOwnRetryEpisode(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, m := range quickStartPublish.FindAllStringSubmatch(string(readme), -1) {
		lines = append(lines, m[1])
	}
	if len(lines) < 3 {
		t.Fatalf("README's quick start has %d publish commands, want a failure, a success and a failure", len(lines))
	}
	port, dir := freePort(t), t.TempDir()
	dev := startDev(t, port, dir)
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
	failures := map[string]bool{}
	for _, line := range lines {
		var o events.Outcome
		if err := events.UnmarshalJSON([]byte(line), &o); err != nil {
			t.Fatalf("README publish line %s: %v", line, err)
		}
		if !o.OK {
			failures[o.ID] = true
		}
		if _, stderr, code := failbusCmd(t, line+"\n", "publish", "--server", dev.url); code != 0 {
			t.Fatalf("publish %s: exit %d: %s", line, code, stderr)
		}
		waitCaughtUp(ctx, t, js, topology.StreamOutcomes, topology.ConsumerClassifier)
		waitCaughtUp(ctx, t, js, topology.StreamClassified, topology.ConsumerScheduler)
	}
	decisions := map[string]events.Decision{}
	for len(decisions) < len(failures) {
		decisions = readDecisions(ctx, t, js)
		if ctx.Err() != nil {
			t.Fatalf("decisions %v, want one per failure %v", decisions, failures)
		}
	}
	ids := map[string]bool{}
	for id := range failures {
		d, ok := decisions[id]
		if !ok || d.Action != events.ActionRetry || d.Retry != 1 {
			t.Errorf("%s: %+v, want retry 1 of its own retry episode", id, d)
			continue
		}
		if ids[d.RetryID] {
			t.Errorf("%s: retry id %s issued twice", id, d.RetryID)
		}
		ids[d.RetryID] = true
	}
}

// waitCaughtUp polls until the consumer has handled everything stored.
func waitCaughtUp(ctx context.Context, t *testing.T, js jetstream.JetStream, stream, consumer string) {
	t.Helper()
	for {
		ok, err := embedded.CaughtUp(ctx, js, stream, consumer)
		if err == nil && ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s/%s did not catch up: %v", stream, consumer, err)
		case <-time.After(50 * time.Millisecond): // poll interval, bounded by ctx
		}
	}
}

// readDecisions reads every decision stored, by outcome id.
func readDecisions(ctx context.Context, t *testing.T, js jetstream.JetStream) map[string]events.Decision {
	t.Helper()
	c, err := js.OrderedConsumer(ctx, topology.StreamDecisions, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.DecisionPrefix + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]events.Decision{}
	pending := c.CachedInfo().NumPending
	for uint64(len(out)) < pending {
		batch, err := c.Fetch(int(pending), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			var d events.Decision
			if err := events.Unmarshal(m.Data(), &d); err != nil {
				t.Fatal(err)
			}
			out[d.OutcomeID] = d
			n++
		}
		if n == 0 {
			break
		}
	}
	return out
}
