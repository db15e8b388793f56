package devbus_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// TestHealthFailsWhileAStreamRefusesWritesAndRecovers: with every service
// running, FAILBUS_CLASSIFIED made to refuse writes (its limit reached,
// discarding new ones: "cannot store" without a full disk), an outcome
// makes the bus's /healthz fail, naming the classifier and the server's
// refusal; with room again the same services, not restarted, classify it
// and /healthz is ok.
func TestHealthFailsWhileAStreamRefusesWritesAndRecovers(t *testing.T) {
	t.Parallel()
	b, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-devbus-health"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := b.Srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ag, err := agent.New(nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.JS.Stream(ctx, topology.StreamClassified)
	if err != nil {
		t.Fatal(err)
	}
	was := st.CachedInfo().Config
	full := was
	// One byte more than it holds (0 would mean no limit): the next
	// classification does not fit.
	full.MaxBytes, full.Discard = int64(st.CachedInfo().State.Bytes)+1, jetstream.DiscardNew
	if _, err := b.JS.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	if err := ag.Report(ctx, &events.Outcome{ID: "o-1", Provider: "openai", Status: 503, Turn: 1, Step: 1}); err != nil {
		t.Fatal(err)
	}
	poll(ctx, t, "unhealthy", func() bool { return errors.Is(b.Healthy(), consumer.ErrCannotStore) })
	herr := b.Healthy()
	t.Logf("/healthz while FAILBUS_CLASSIFIED refuses writes: %v", herr)
	if !strings.Contains(herr.Error(), "classifier") || !strings.Contains(herr.Error(), "maximum bytes exceeded") {
		t.Errorf("health %q does not name the classifier and the server's refusal", herr)
	}
	if _, err := b.JS.UpdateStream(ctx, was); err != nil {
		t.Fatal(err)
	}
	poll(ctx, t, "healthy, o-1 classified", func() bool {
		done, err := embedded.CaughtUp(ctx, b.JS, topology.StreamOutcomes, topology.ConsumerClassifier)
		return err == nil && done && b.Healthy() == nil
	})
	select {
	case <-b.Failed():
		t.Fatal("a service stopped")
	default:
	}
}

func poll(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(20 * time.Millisecond): // poll interval, bounded by ctx
		}
	}
}
