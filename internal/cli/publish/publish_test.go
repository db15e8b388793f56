package publish

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/embedded"

	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

func TestCLIPublish(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	input := strings.Join([]string{
		`{"id":"o-1","at":"2025-03-01T12:00:00Z","agent":"bot","provider":"openai","status":429,"headers":{"retry-after":"2"}}`,
		`{"id":"o-2","at":1740830400000,"agent":"bot","provider":"my gateway","status":400,"upstream_code":"CONTEXT_WINDOW_EXCEEDED","future_field":1}`,
		``,
		`{"id":"o-1","agent":"bot","provider":"openai","status":429}`,
		`not json`,
		`{"agent":"bot","provider":"openai"}`,
		`{"id":"o-3","agent":"bot","provider":"openai","at":"yesterday"}`,
		`{"type":"boundary","agent":"bot","session":"s1","segment":2,"reason":"compaction","at":"2025-03-01T12:00:00Z"}`,
		`{"type":"boundary","agent":"bot","session":"s1","segment":2}`,
		`{"type":"route","agent":"bot"}`,
		`{"id":"o-4","agent":"bot","provider":"anthropic","ok":true,"status":200}`, // no final newline
	}, "\n")
	var stdout, stderr bytes.Buffer
	before := time.Now()
	code := run([]string{"--server", b.Srv.ClientURL()}, strings.NewReader(input), &stdout, &stderr)
	after := time.Now()
	// Lines were not published: exit 1, after the summary.
	if code != 1 {
		t.Fatalf("exit %d, want 1; stderr: %s", code, stderr.String())
	}

	// Error records, in input order, each naming its line and the problem.
	wantErrors := []struct {
		line int
		has  string
	}{
		{5, "not a JSON object"},
		{6, `"id"`},
		{7, `"at"`},
		{10, `unknown type "route"`},
	}
	dec := json.NewDecoder(&stdout)
	for _, want := range wantErrors {
		var rec errorRecord
		if err := dec.Decode(&rec); err != nil {
			t.Fatalf("error record for line %d: %v", want.line, err)
		}
		if rec.Type != "error" || rec.Line != want.line || !strings.Contains(rec.Error, want.has) {
			t.Errorf("record %+v, want line %d with %s", rec, want.line, want.has)
		}
	}
	if dec.More() {
		t.Errorf("unexpected extra output")
	}
	if got, want := stderr.String(), "4 published, 2 duplicates, 4 invalid, 0 failed; 1 published without \"at\" carries the time of publishing"; !strings.Contains(got, want) {
		t.Errorf("summary %q, want %q", got, want)
	}
	if got := stderr.String(); !strings.HasSuffix(got, "4 lines not published (see the error records on stdout)\n") {
		t.Errorf("stderr %q does not end by saying lines were not published", got)
	}
	var one bytes.Buffer
	if code := run([]string{"--server", b.Srv.ClientURL()}, strings.NewReader("not json\n"), &bytes.Buffer{}, &one); code != 1 ||
		!strings.HasSuffix(one.String(), "failbus publish: 1 line not published (see the error records on stdout)\n") {
		t.Errorf("one bad line: exit %d, stderr %q; want it counted in the singular", code, one.String())
	}

	// What is on the bus.
	s, err := b.JS.Stream(b.Ctx, topology.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		subject string
		msgID   string
		check   func(m events.Message) bool
	}{
		{"failbus.outcome.openai.bot", "o-1", func(m events.Message) bool {
			o := m.(*events.Outcome)
			return o.Status == 429 && o.Headers["retry-after"] == "2"
		}},
		{"failbus.outcome.my_gateway.bot", "o-2", func(m events.Message) bool {
			o := m.(*events.Outcome)
			return o.Provider == "my gateway" && o.At.UnixMilli() == 1740830400000
		}},
		{"failbus.segment.bot", "boundary:bot:s1#2", func(m events.Message) bool {
			return m.(*events.Boundary).Reason == "compaction"
		}},
		{"failbus.outcome.anthropic.bot", "o-4", func(m events.Message) bool {
			// No "at" in the line: the time of publishing, never null.
			o := m.(*events.Outcome)
			return o.OK && !o.At.Before(before.Truncate(time.Millisecond)) && !o.At.After(after)
		}},
	}
	for _, tt := range tests {
		m, err := s.GetLastMsgForSubject(b.Ctx, tt.subject)
		if err != nil {
			t.Errorf("%s: %v", tt.subject, err)
			continue
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != tt.msgID {
			t.Errorf("%s: Nats-Msg-Id %q, want %q", tt.subject, got, tt.msgID)
		}
		v, err := events.Decode(m.Subject, m.Header, m.Data)
		if err != nil || !tt.check(v) {
			t.Errorf("%s: decoded %+v, %v", tt.subject, v, err)
		}
	}
	if n := s.CachedInfo().State.Msgs; n != 4 {
		t.Errorf("stream holds %d messages, want 4", n)
	}
}

func TestCLIPublishUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"publish with an unknown flag", []string{"--nope"}, 2},
		{"publish with a positional argument", []string{"file.jsonl"}, 2},
		{"publish to a server that is not there", []string{"--server", "nats://127.0.0.1:1"}, 1},
		{"publish nothing", []string{"--server", bustest.Start(t, time.Minute).Srv.ClientURL()}, 0},
		{"publish -h", []string{"-h"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := run(tt.args, strings.NewReader(""), &stdout, &stderr); got != tt.want {
				t.Errorf("exit %d, want %d; stderr: %s", got, tt.want, stderr.String())
			}
		})
	}
}

// A bus that cannot store outcomes is named as the problem, with the
// command that fixes it, instead of "nats: no response from stream" per
// line.
func TestCLIPublishToABusThatCannotStore(t *testing.T) {
	t.Parallel()
	noJS := embedded.StartTestOpts(t, embedded.Options{Configure: func(o *server.Options) { o.JetStream = false }})
	noTopology := embedded.StartTest(t)
	tests := []struct {
		name string
		url  string
		has  []string
	}{
		{"a server without JetStream", noJS.ClientURL(), []string{"has no JetStream", "failbus dev", "-js"}},
		{"a server without the topology", noTopology.ClientURL(), []string{"topology is not applied", "FAILBUS_OUTCOMES", "--apply-topology"}},
	}
	input := `{"id":"o-1","agent":"bot","provider":"openai","status":503}` + "\n" + `{"id":"o-2","agent":"bot","provider":"openai","status":503}`
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run([]string{"--server", tt.url}, strings.NewReader(input), &stdout, &stderr)
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			for _, want := range append(tt.has, tt.url, "0 published") {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
				}
			}
			if strings.Contains(stderr.String(), "no response from stream") {
				t.Errorf("stderr still says only what nats.go says:\n%s", stderr.String())
			}
		})
	}
}

// TestPublishSummaryCountsInWords: one line, one duplicate: singular.
func TestPublishSummaryCountsInWords(t *testing.T) {
	t.Parallel()
	got := publishStats{published: 3, duplicates: 1, invalid: 1}.summary()
	if want := "3 published, 1 duplicate, 1 invalid, 0 failed"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}
