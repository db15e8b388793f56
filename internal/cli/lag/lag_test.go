package lag

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/durable"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// publishOutcomes stores n outcomes with ids from o-<from> on and returns
// the store time of the first.
func publishOutcomes(t *testing.T, b *bustest.Bus, from, n int) time.Time {
	t.Helper()
	var first time.Time
	for i := range n {
		data, hdr, err := events.Encode(&events.Outcome{ID: fmt.Sprintf("o-%d", from+i), Agent: "bot", Provider: "openai", Status: 500})
		if err != nil {
			t.Fatal(err)
		}
		ack, err := b.JS.PublishMsg(b.Ctx, &nats.Msg{Subject: events.OutcomeSubject("openai", "bot"), Header: hdr, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			s, err := b.JS.Stream(b.Ctx, topology.StreamOutcomes)
			if err != nil {
				t.Fatal(err)
			}
			m, err := s.GetMsg(b.Ctx, ack.Sequence)
			if err != nil {
				t.Fatal(err)
			}
			first = m.Time
		}
	}
	return first
}

// readPending reads the lags until the classifier's pending is want, or a
// deadline passes (then returns the last read, for the test to report):
// nats-server counts a stored message into a consumer's pending from
// another goroutine (the stream's signalConsumersLoop) than the one that
// acknowledged the publish, so a read right after the ack may not count
// it yet (1 run in about 15 failed so).
func readPending(t *testing.T, b *bustest.Bus, opts Options, now time.Time, want uint64) []Lag {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		lags, err := Read(b.Ctx, b.JS, opts, now)
		if err != nil {
			t.Fatal(err)
		}
		if find(t, lags, topology.ConsumerClassifier).Pending == want || time.Now().After(deadline) {
			return lags
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func find(t *testing.T, lags []Lag, name string) Lag {
	t.Helper()
	for _, l := range lags {
		if l.Durable == name {
			return l
		}
	}
	t.Fatalf("no consumer %s in %+v", name, lags)
	return Lag{}
}

// TestLagOfAConsumerNobodyReads: outcomes stored while no classifier runs
// are pending on the classifier's durable; fetching without acking moves
// them to ack pending, a nak makes one redelivered, and the oldest
// unprocessed message stays the first until it is acknowledged.
func TestLagOfAConsumerNobodyReads(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	first := publishOutcomes(t, b, 0, 3)

	now := first.Add(90 * time.Second)
	lags := readPending(t, b, Options{}, now, 3)
	if len(lags) != len(topology.Consumers()) {
		t.Errorf("%d consumers reported, want every durable of the topology (%d)", len(lags), len(topology.Consumers()))
	}
	c := find(t, lags, topology.ConsumerClassifier)
	if c.Pending != 3 || c.AckPending != 0 || c.Redelivered != 0 || c.OldestSeq != 1 || c.OldestAgeMS != 90_000 {
		t.Errorf("classifier before any read: %+v, want 3 pending, oldest seq 1 aged 90000 ms", c)
	}
	if b := find(t, lags, topology.ConsumerRefusalBoundaries); !b.CaughtUp() || b.OldestSeq != 0 || b.OldestAgeMS != 0 {
		t.Errorf("refusals-boundaries (filter failbus.segment.>, nothing stored) reports %+v, want caught up", b)
	}

	// A process takes all three and dies holding them; one is handed back
	// (after a millisecond: the consumer's backoff would make it a minute)
	// and taken again.
	cons, err := b.JS.Consumer(b.Ctx, topology.StreamOutcomes, topology.ConsumerClassifier)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(3)
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	if len(got) != 3 {
		t.Fatalf("fetched %d, want 3", len(got))
	}
	if err := got[0].NakWithDelay(time.Millisecond); err != nil {
		t.Fatal(err)
	}
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var redelivered jetstream.Msg
	for m := range again.Messages() {
		redelivered = m
		if md, _ := m.Metadata(); md.NumDelivered != 2 {
			t.Fatalf("refetched seq %d delivered %d times, want the nak'd one again", md.Sequence.Stream, md.NumDelivered)
		}
	}
	publishOutcomes(t, b, 3, 2) // two more arrive
	lags = readPending(t, b, Options{Stream: topology.StreamOutcomes, Consumers: []string{topology.ConsumerClassifier}}, now, 2)
	if len(lags) != 1 {
		t.Fatalf("asked for one consumer, got %+v", lags)
	}
	c = lags[0]
	if c.Pending != 2 || c.AckPending != 3 || c.Redelivered != 1 || c.OldestSeq != 1 || c.AckFloorSeq != 0 {
		t.Errorf("classifier holding 3 (one redelivered): %+v, want pending 2, ack pending 3, redelivered 1, oldest seq 1", c)
	}

	// Acknowledging the other two leaves seq 1 as the oldest.
	for _, m := range got[1:] {
		if err := m.DoubleAck(b.Ctx); err != nil {
			t.Fatal(err)
		}
	}
	lags, err = Read(b.Ctx, b.JS, Options{Consumers: []string{topology.ConsumerClassifier}}, now)
	if err != nil {
		t.Fatal(err)
	}
	c = lags[0]
	if c.AckPending != 1 || c.OldestSeq != 1 {
		t.Errorf("seq 1 still unacknowledged: %+v, want it as the oldest", c)
	}

	// Acknowledging seq 1 too: the ack floor is 3, the oldest the first
	// of the two that arrived later.
	if redelivered == nil {
		t.Fatal("the nak'd message was not redelivered")
	}
	if err := redelivered.DoubleAck(b.Ctx); err != nil {
		t.Fatal(err)
	}
	lags, err = Read(b.Ctx, b.JS, Options{Consumers: []string{topology.ConsumerClassifier}}, now)
	if err != nil {
		t.Fatal(err)
	}
	c = lags[0]
	if c.AckFloorSeq != 3 || c.AckPending != 0 || c.Redelivered != 0 || c.Pending != 2 || c.OldestSeq != 4 || c.LastAckAt.IsZero() {
		t.Errorf("first three acknowledged: %+v, want ack floor 3, 2 pending, oldest seq 4", c)
	}
}

func TestLagCommand(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	publishOutcomes(t, b, 0, 3)
	url := b.Srv.ClientURL()

	tests := []struct {
		name     string
		args     []string
		code     int
		stdout   []string // each must appear
		stderr   string
		jsonRows int
	}{
		{"table of every consumer", []string{"--server", url}, 0,
			[]string{"STREAM", "OLDEST", "FAILBUS_OUTCOMES", "classifier", "notifier"}, "", 0},
		{"json of one consumer", []string{"--server", url, "--json", "classifier"}, 0, nil, "", 1},
		{"watch twice", []string{"--server", url, "--json", "--watch", "--interval", "10ms", "--count", "2", "classifier"}, 0, nil, "", 2},
		{"a consumer that does not exist", []string{"--server", url, "nope"}, 1, nil, "no durable consumer nope on any stream", 0},
		{"count without watch", []string{"--server", url, "--count", "2"}, 2, nil, "--count needs --watch", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tc.args, nil, &stdout, &stderr); code != tc.code {
				t.Fatalf("exit %d, want %d; stderr: %s", code, tc.code, stderr.String())
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.stderr)
			}
			if tc.jsonRows > 0 {
				dec := json.NewDecoder(&stdout)
				n := 0
				for dec.More() {
					var l Lag
					if err := dec.Decode(&l); err != nil {
						t.Fatalf("not JSON Lines: %v", err)
					}
					if l.Durable != topology.ConsumerClassifier || l.Pending != 3 || l.OldestSeq != 1 {
						t.Errorf("row %+v, want classifier with 3 pending from seq 1", l)
					}
					n++
				}
				if n != tc.jsonRows {
					t.Errorf("%d rows, want %d", n, tc.jsonRows)
				}
			}
		})
	}
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second:                  "0ms",
		850 * time.Millisecond:        "850ms",
		42 * time.Second:              "42s",
		3*time.Minute + 5*time.Second: "3m05s",
		2*time.Hour + 7*time.Minute:   "2h07m",
		76 * time.Hour:                "3d04h",
	} {
		if got := Age(d); got != want {
			t.Errorf("Age(%s) = %q, want %q", d, got, want)
		}
	}
}

// TestLagMarksARetiredConsumer: a durable an earlier version left behind
// (an old recovery replica heals it back during a rolling upgrade) is
// reported as retired, in the JSON and the table, and the topology's own
// durables are not.
func TestLagMarksARetiredConsumer(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	if _, err := b.JS.CreateConsumer(b.Ctx, topology.StreamDecisions, jetstream.ConsumerConfig{
		Durable: durable.RetiredRecoveryDecisions, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "failbus.decision.>",
	}); err != nil {
		t.Fatal(err)
	}
	lags, err := Read(b.Ctx, b.JS, Options{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range lags {
		if want := l.Durable == durable.RetiredRecoveryDecisions; l.Retired != want {
			t.Errorf("%s/%s: retired %v, want %v", l.Stream, l.Durable, l.Retired, want)
		}
	}
	var out strings.Builder
	if err := Table(&out, lags); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), durable.RetiredRecoveryDecisions+" (retired: failbus apply deletes it)") {
		t.Errorf("the table does not say the consumer is retired:\n%s", out.String())
	}
}
