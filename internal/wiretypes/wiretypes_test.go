package wiretypes_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/retrymark"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/watch"
	"github.com/failbus/failbus/internal/wiretypes"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// TestEveryRecordTheBusWritesDecodes runs every service on a real bus,
// drives each kind of record out of them (classifications, decisions,
// retry ledger, schedules, due retries, started and cancel marks, refusal
// state, notification requests and audits, policy audits, dead letters),
// then reads every stream and decodes every message by its subject and
// headers. A record type some service writes without registering it fails
// here with its subject.
func TestEveryRecordTheBusWritesDecodes(t *testing.T) {
	t.Parallel()
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nc, err := bus.Srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	bot, err := agent.New(nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	due, err := bot.DueRetries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	decisions, err := bot.Decisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, o := range []*events.Outcome{
		{ID: "rate", Provider: "openai", Status: 429, Headers: map[string]string{"retry-after-ms": "100"}, Turn: 1},
		{ID: "cancelled", Provider: "anthropic", Status: 500, Turn: 2},
		{ID: "refused", Provider: "openai", Status: 200, StopReason: "refusal", RefusalScope: "history", Session: "s", Segment: 1, Turn: 3},
		{ID: "fine", Provider: "openai", OK: true, Status: 200, Turn: 4},
	} {
		o.Agent, o.At = "bot", events.At(now)
		if err := bot.Report(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if err := bot.Boundary(ctx, events.Boundary{At: events.At(now), Agent: "bot", Session: "s", Segment: 2, Reason: "compaction"}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.OutcomeSubject("openai", "bot"), []byte("junk")); err != nil {
		t.Fatal(err) // dead-lettered by the classifier
	}
	seen := map[string]events.Decision{}
	for len(seen) < 3 {
		select {
		case d := <-decisions:
			seen[d.OutcomeID] = d
		case <-ctx.Done():
			t.Fatalf("decisions so far: %v", seen)
		}
	}
	if err := bot.Cancel(ctx, seen["cancelled"].RetryID); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-due:
		if err := bot.Started(ctx, r.RetryID); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("no retry came due")
	}
	kv, err := js.KeyValue(ctx, topology.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, scheduler.PolicyKVKey, []byte("retry:\n  max_retries: 3\n")); err != nil {
		t.Fatal(err)
	}

	want := map[string]bool{ // schemas this scenario must have produced
		events.SchemaOutcome: true, events.SchemaBoundary: true, events.SchemaClassification: true,
		events.SchemaDecision: true, events.SchemaRetryDue: true, events.SchemaNotification: true,
		events.SchemaDeadLetter: true, scheduler.SchemaLedgerEntry: true, scheduler.SchemaPolicyAudit: true,
		delivery.SchemaAudit: true, retrymark.SchemaStarted: true, retrymark.SchemaCancel: true,
	}
	var got map[string]int
	clitest.WaitFor(t, "every kind of record stored", func() bool {
		got = readAll(t, ctx, js)
		for s := range want {
			if got[s] == 0 {
				return false
			}
		}
		return true
	})
	t.Logf("records by schema: %v", got)
}

// readAll decodes every message of every failbus stream and counts them by
// schema; a message that does not decode fails the test, except the junk
// the test itself published.
func readAll(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, s := range topology.Streams() {
		err := watch.Read(ctx, js, watch.Config{Stream: s.Name}, func(m jetstream.Msg) error {
			if string(m.Data()) == "junk" {
				return nil
			}
			v, err := wiretypes.Bus.Decode(m.Subject(), m.Headers(), m.Data())
			if err != nil {
				t.Errorf("%s on %s (headers %v) does not decode: %v", s.Name, m.Subject(), m.Headers(), err)
				return nil
			}
			got[v.SchemaName()]++
			return nil
		})
		if err != nil && !strings.Contains(err.Error(), "not found") {
			t.Fatal(err)
		}
	}
	return got
}
