package tail

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// bundle is a real server with the topology applied, for tail to read.
type bundle struct{ *bustest.Bus }

func setup(t *testing.T) *bundle { return &bundle{bustest.Start(t, time.Minute)} }

// fill publishes n outcomes for provider, a classification of each, one
// junk payload on the DLQ subject, and returns the outcome ids.
func (b *bundle) fill(t *testing.T, provider string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		o := &events.Outcome{ID: fmt.Sprintf("%s-%d", provider, i), Agent: "bot", Provider: provider, Status: 500}
		b.pub(t, events.OutcomeSubject(provider, "bot"), o)
		b.pub(t, events.ClassifiedSubject(provider, events.ClassServerError),
			&events.Classification{OutcomeID: o.ID, Class: events.ClassServerError, Rule: "test"})
		ids = append(ids, o.ID)
	}
	return ids
}

func (b *bundle) pub(t *testing.T, subject string, m events.Message) {
	t.Helper()
	data, hdr, err := events.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.JS.PublishMsg(b.Ctx, &nats.Msg{Subject: subject, Header: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
}

// parseTail reads tail output and returns the lines and, for each, the id
// of its payload (id or outcome_id).
func parseTail(t *testing.T, out string) ([]tailLine, []string) {
	t.Helper()
	var lines []tailLine
	var ids []string
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var l tailLine
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("output is not JSON Lines: %v\n%s", err, out)
		}
		var payload struct {
			ID        string `json:"id"`
			OutcomeID string `json:"outcome_id"`
		}
		_ = json.Unmarshal(l.Data, &payload)
		lines = append(lines, l)
		ids = append(ids, payload.ID+payload.OutcomeID)
	}
	return lines, ids
}

func TestCLITailNoFollow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fill(t, "openai", 5)
	b.fill(t, "anthropic", 3)
	if _, err := b.JS.Publish(b.Ctx, events.DLQSubject("classifier"), []byte{0xc1, 0xff}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		args      []string
		wantIDs   []string // nil: check only the count
		wantCount int
	}{
		{
			name:    "tail one subject without following prints what is stored, in order",
			args:    []string{"--no-follow", "failbus.outcome.openai.>"},
			wantIDs: []string{"openai-0", "openai-1", "openai-2", "openai-3", "openai-4"},
		},
		{
			name:    "tail the last 2 of a filter that matches part of a stream",
			args:    []string{"--no-follow", "--last", "2", "failbus.outcome.openai.*"},
			wantIDs: []string{"openai-3", "openai-4"},
		},
		{
			name:    "tail the last 10 when fewer match",
			args:    []string{"--no-follow", "--last", "10", "failbus.classified.anthropic.>"},
			wantIDs: []string{"anthropic-0", "anthropic-1", "anthropic-2"},
		},
		{
			name:    "tail from a stream sequence",
			args:    []string{"--no-follow", "--start-seq", "5", "failbus.outcome.>"},
			wantIDs: []string{"openai-4", "anthropic-0", "anthropic-1", "anthropic-2"},
		},
		{
			name:    "tail two filters on one stream",
			args:    []string{"--no-follow", "failbus.outcome.anthropic.bot", "failbus.outcome.openai.>", "failbus.outcome.openai.bot"},
			wantIDs: []string{"openai-0", "openai-1", "openai-2", "openai-3", "openai-4", "anthropic-0", "anthropic-1", "anthropic-2"},
		},
		{
			name:      "tail everything: the default failbus.> spans streams",
			args:      []string{"--no-follow"},
			wantCount: 8 + 8 + 1,
		},
		{
			name:      "tail with flags after the subject and a count",
			args:      []string{"failbus.>", "--no-follow", "--count", "3"},
			wantCount: 3,
		},
		{
			name:      "tail since a duration",
			args:      []string{"--since", "1h", "--no-follow", "failbus.classified.>"},
			wantCount: 8,
		},
		{
			name:      "tail one named stream",
			args:      []string{"--stream", topology.StreamClassified, "--no-follow", "failbus.>"},
			wantCount: 8,
		},
		{
			name:    "tail the latest message of each subject",
			args:    []string{"--no-follow", "--last-per-subject", "failbus.outcome.>"},
			wantIDs: []string{"openai-4", "anthropic-2"},
		},
		{
			name:    "tail the latest of each subject of two filters",
			args:    []string{"--no-follow", "--last-per-subject", "failbus.outcome.anthropic.*", "failbus.outcome.openai.bot"},
			wantIDs: []string{"openai-4", "anthropic-2"},
		},
		{
			name:      "tail a subject with nothing stored",
			args:      []string{"--no-follow", "failbus.decision.>"},
			wantCount: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			args := append([]string{"--server", b.Srv.ClientURL()}, tt.args...)
			if code := run(args, nil, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			lines, ids := parseTail(t, stdout.String())
			if tt.wantIDs != nil {
				if !slices.Equal(ids, tt.wantIDs) {
					t.Errorf("ids %v, want %v", ids, tt.wantIDs)
				}
			} else if len(lines) != tt.wantCount {
				t.Errorf("%d lines, want %d:\n%s", len(lines), tt.wantCount, stdout.String())
			}
			for _, l := range lines {
				if l.Stream == "" || l.Seq == 0 || l.Subject == "" || l.Time.IsZero() {
					t.Errorf("incomplete envelope %+v", l)
				}
			}
		})
	}
}

func TestCLITailEnvelope(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fill(t, "openai", 1)
	if _, err := b.JS.Publish(b.Ctx, events.DLQSubject("x"), []byte{0xc1, 0xff}); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--server", b.Srv.ClientURL(), "--no-follow", "failbus.classified.>", "failbus.dlq.>"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines, _ := parseTail(t, stdout.String())
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), stdout.String())
	}
	slices.SortFunc(lines, func(x, y tailLine) int { return strings.Compare(x.Stream, y.Stream) })
	c, junk := lines[0], lines[1]
	if c.Stream != topology.StreamClassified || c.Schema != "classification/1" || !strings.Contains(string(c.Data), `"class":"server_error"`) {
		t.Errorf("classification line %+v (data %s)", c, c.Data)
	}
	if junk.Stream != topology.StreamDLQ || junk.Data != nil || !bytes.Equal(junk.Raw, []byte{0xc1, 0xff}) || junk.Error == "" {
		t.Errorf("junk line %+v", junk)
	}
}

func TestCLITailFollow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.fill(t, "openai", 2)
	out := &clitest.SyncBuffer{}
	done := make(chan int, 1)
	go func() {
		var stderr bytes.Buffer
		done <- run([]string{"--server", b.Srv.ClientURL(), "--since", "1h", "--count", "4", "failbus.outcome.>"}, nil, out, &stderr)
	}()
	clitest.WaitFor(t, "the stored messages", func() bool { return strings.Count(out.String(), "\n") == 2 })
	b.fill(t, "anthropic", 3) // the 4th outcome ends it; the 5th is never printed
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tail --count 4 did not exit")
	}
	_, ids := parseTail(t, out.String())
	if want := []string{"openai-0", "openai-1", "anthropic-0", "anthropic-1"}; !slices.Equal(ids, want) {
		t.Errorf("ids %v, want %v", ids, want)
	}
	// An ordered consumer leaves nothing behind on the server: only the
	// topology's durables remain.
	clitest.WaitFor(t, "no ephemeral consumers left", func() bool {
		s, err := b.JS.Stream(context.Background(), topology.StreamOutcomes)
		if err != nil {
			t.Fatal(err)
		}
		for c := range s.ListConsumers(context.Background()).Info() {
			if c.Config.Durable == "" {
				return false
			}
		}
		return true
	})
}

func TestCLITailUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	noJS := embedded.StartTestOpts(t, embedded.Options{Configure: func(o *server.Options) { o.JetStream = false }})
	noTopology := embedded.StartTest(t)
	tests := []struct {
		name string
		args []string
		want int
		has  string
	}{
		{"two start options", []string{"--last", "2", "--since", "1h"}, 2, "exclude each other"},
		{"last and last per subject", []string{"--last", "2", "--last-per-subject"}, 2, "exclude each other"},
		{"a bad start time", []string{"--start-time", "yesterday"}, 2, "RFC 3339"},
		{"a bad subject", []string{"failbus..x"}, 2, "empty token"},
		{"'>' in the middle", []string{"failbus.>.x"}, 2, "last token"},
		{"a negative count", []string{"--count", "-1"}, 2, "positive"},
		{"start-seq across streams", []string{"--start-seq", "3"}, 1, "--stream"},
		{"a subject no stream holds", []string{"nothing.here"}, 1, "no stream holds"},
		{"a stream that does not exist", []string{"--stream", "NOPE"}, 1, "NOPE"},
		{"a stream without the subject", []string{"--stream", topology.StreamDLQ, "failbus.outcome.>"}, 1, "holds none"},
		{"a server without JetStream", []string{"--server", noJS.ClientURL()}, 1, "has no JetStream"},
		{"a server without the topology", []string{"--server", noTopology.ClientURL(), "failbus.health.>"}, 1, "topology is not applied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			args := append([]string{"--server", b.Srv.ClientURL(), "--no-follow"}, tt.args...)
			if got := run(args, nil, &stdout, &stderr); got != tt.want || !strings.Contains(stderr.String(), tt.has) {
				t.Errorf("exit %d, stderr %q; want %d and %q", got, stderr.String(), tt.want, tt.has)
			}
		})
	}
}

func TestCLISubjectMatching(t *testing.T) {
	t.Parallel()
	if got := minimalFilters([]string{"a.b", "a.>", "a.b", "c.*", "c.*"}); !slices.Equal(got, []string{"a.>", "c.*"}) {
		t.Errorf("minimalFilters = %v", got)
	}
}

// Payloads that are not msgpack are never read as a number (the first byte
// of "this is not msgpack" is msgpack's 116): they are "raw" with an
// "error", or "data" with an "error" when they are JSON. A dead letter shows
// the payload it carries decoded: msgpack as JSON, UTF-8 text as text,
// anything else as base64, and says which in "data_as".
func TestCLITailPayloadsThatAreNotMsgpack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	junk := []byte("this is not msgpack")
	jsonOutcome := []byte(`{"id":"j-1","agent":"bot","provider":"openai","status":503}`)
	binary := []byte{0xc1, 0xff, 0x00}
	mp, err := msgpack.Marshal(map[string]any{"id": "m-1", "status": 503})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][]byte{junk, jsonOutcome} {
		if _, err := b.JS.Publish(b.Ctx, events.OutcomeSubject("openai", "bot"), p); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range [][]byte{junk, mp, binary} {
		b.pub(t, events.DLQSubject("classifier"), &events.DeadLetter{
			Service: "classifier", Reason: "test", Subject: events.OutcomeSubject("openai", "bot"), Seq: uint64(i + 1), Data: p,
		})
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--server", b.Srv.ClientURL(), "--no-follow", "failbus.outcome.>"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines, _ := parseTail(t, stdout.String())
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2:\n%s", len(lines), stdout.String())
	}
	if l := lines[0]; l.Data != nil || !bytes.Equal(l.Raw, junk) || !strings.Contains(l.Error, "not msgpack") {
		t.Errorf("text payload: data %s, raw %q, error %q; want raw and an error", l.Data, l.Raw, l.Error)
	}
	if l := lines[1]; string(l.Data) != string(jsonOutcome) || l.Raw != nil || !strings.Contains(l.Error, "JSON, not msgpack") {
		t.Errorf("JSON payload: data %s, raw %q, error %q; want the JSON as data and an error", l.Data, l.Raw, l.Error)
	}

	stdout.Reset()
	if code := run([]string{"--server", b.Srv.ClientURL(), "--no-follow", "failbus.dlq.>"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	lines, _ = parseTail(t, stdout.String())
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), stdout.String())
	}
	want := []struct{ data, as string }{
		{`"this is not msgpack"`, "text"},
		{`{"id":"m-1","status":503}`, "msgpack"},
		{`"wf8A"`, "base64"},
	}
	for i, l := range lines {
		var dl struct {
			Reason string          `json:"reason"`
			Data   json.RawMessage `json:"data"`
			DataAs string          `json:"data_as"`
		}
		if err := json.Unmarshal(l.Data, &dl); err != nil || l.Error != "" {
			t.Fatalf("dead letter %d: %s (%v, %q)", i, l.Data, err, l.Error)
		}
		if dl.Reason != "test" || string(dl.Data) != want[i].data || dl.DataAs != want[i].as {
			t.Errorf("dead letter %d: data %s as %q; want %s as %q", i, dl.Data, dl.DataAs, want[i].data, want[i].as)
		}
	}
}
