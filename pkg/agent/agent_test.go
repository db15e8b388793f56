package agent_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/durable"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// bundle is what every test needs: a real server with the topology applied.
type bundle struct {
	srv *embedded.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	ctx context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	bus := bustest.Start(t, 30*time.Second)
	nc := bus.NC
	srv, js, ctx := bus.Srv, bus.JS, bus.Ctx
	return &bundle{srv: srv, nc: nc, js: js, ctx: ctx}
}

// last reads the last message stored on subject.
func (b *bundle) last(t *testing.T, stream, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := b.js.Stream(b.ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(b.ctx, subject)
	if err != nil {
		t.Fatalf("last message on %s: %v", subject, err)
	}
	return m
}

func (b *bundle) count(t *testing.T, stream, subject string) uint64 {
	t.Helper()
	s, err := b.js.Stream(b.ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(b.ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// publishDecision stands in for the scheduler service.
func (b *bundle) publishDecision(t *testing.T, d events.Decision) {
	t.Helper()
	data, hdr, err := events.Encode(&d)
	if err != nil {
		t.Fatal(err)
	}
	hdr.Set(events.HeaderMsgID, "decision:"+d.OutcomeID)
	if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: events.DecisionSubject(d.Agent), Header: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
}

func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatal("channel closed")
		}
		return v
	case <-time.After(20 * time.Second):
		t.Fatal("nothing received within 20s")
	}
	var zero T
	return zero
}

func TestAgentReport(t *testing.T) {
	t.Parallel()
	b := setup(t)
	fixed := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	ag, err := agent.New(b.nc, "bot/1", agent.WithClock(func() time.Time { return fixed }))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		in          events.Outcome
		wantSubject string
		wantAgent   string
		wantAt      time.Time
	}{
		{
			name:        "report a complete outcome as given",
			in:          events.Outcome{ID: "o-1", At: events.At(fixed.Add(-time.Hour)), Agent: "other", Provider: "openai", OK: true, Status: 200},
			wantSubject: "failbus.outcome.openai.other",
			wantAgent:   "other",
			wantAt:      fixed.Add(-time.Hour),
		},
		{
			name:        "report an outcome without agent and at, which are filled",
			in:          events.Outcome{ID: "o-2", Provider: "my.gateway", Status: 429},
			wantSubject: "failbus.outcome.my_gateway.bot_1",
			wantAgent:   "bot/1",
			wantAt:      fixed,
		},
		{
			name:        "report an outcome without id, which gets one",
			in:          events.Outcome{Provider: "anthropic", Status: 529},
			wantSubject: "failbus.outcome.anthropic.bot_1",
			wantAgent:   "bot/1",
			wantAt:      fixed,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.in
			if err := ag.Report(b.ctx, &o); err != nil {
				t.Fatal(err)
			}
			if o.ID == "" {
				t.Fatal("id not filled")
			}
			m := b.last(t, topology.StreamOutcomes, tt.wantSubject)
			if got := m.Header.Get(events.HeaderMsgID); got != o.ID {
				t.Errorf("Nats-Msg-Id = %q, want %q", got, o.ID)
			}
			got, err := events.DecodeAs[*events.Outcome](m.Subject, m.Header, m.Data)
			if err != nil {
				t.Fatal(err)
			}
			if got.ID != o.ID || got.Agent != tt.wantAgent || !got.At.Equal(tt.wantAt) {
				t.Errorf("stored id=%q agent=%q at=%v, want %q %q %v", got.ID, got.Agent, got.At, o.ID, tt.wantAgent, tt.wantAt)
			}
			// Reporting the same outcome again is kept once.
			before := b.count(t, topology.StreamOutcomes, tt.wantSubject)
			if err := ag.Report(b.ctx, &o); err != nil {
				t.Fatalf("report again: %v", err)
			}
			if after := b.count(t, topology.StreamOutcomes, tt.wantSubject); after != before {
				t.Errorf("republished outcome stored again: %d messages, want %d", after, before)
			}
		})
	}
}

func TestAgentReportInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ag, err := agent.New(b.nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	err = ag.Report(b.ctx, &events.Outcome{ID: "x"}) // no provider
	var fe *events.FieldError
	if !errors.As(err, &fe) || fe.Field != "provider" {
		t.Fatalf("Report without provider: err = %v, want a FieldError naming provider", err)
	}
	if err := ag.Report(b.ctx, nil); err == nil {
		t.Fatal("Report(nil) succeeded")
	}
}

func TestAgentBoundaryAndRetryMarks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ag, err := agent.New(b.nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	bd := events.Boundary{Session: "s1", Segment: 3, Reason: "compaction"}
	for range 2 {
		if err := ag.Boundary(b.ctx, bd); err != nil {
			t.Fatal(err)
		}
	}
	subj := events.SegmentSubject("bot")
	if n := b.count(t, topology.StreamOutcomes, subj); n != 1 {
		t.Errorf("boundary reported twice stored %d times, want 1", n)
	}
	m := b.last(t, topology.StreamOutcomes, subj)
	got, err := events.DecodeAs[*events.Boundary](m.Subject, m.Header, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if got.Agent != "bot" || got.Session != "s1" || got.Segment != 3 || got.At.IsZero() {
		t.Errorf("boundary = %+v", got)
	}

	if err := ag.Started(b.ctx, "r-1"); err != nil {
		t.Fatal(err)
	}
	if err := ag.Cancel(b.ctx, "r-2"); err != nil {
		t.Fatal(err)
	}
	for subj, want := range map[string]string{
		events.RetryStartedSubject("bot"): `"retry_id":"r-1"`,
		events.RetryCancelSubject("bot"):  `"retry_id":"r-2"`,
	} {
		m := b.last(t, topology.StreamRetries, subj)
		js, err := events.ToJSON(m.Subject, m.Header, m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(js), want) || !strings.Contains(string(js), `"agent":"bot"`) {
			t.Errorf("%s: %s, want it to contain %s", subj, js, want)
		}
	}
	if err := ag.Started(b.ctx, ""); err == nil {
		t.Error("Started with an empty retry id succeeded")
	}
}

func TestAgentDecisions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	var errs []error
	ag, err := agent.New(b.nc, "bot", agent.WithErrorHandler(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	ch, err := ag.Decisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Another agent's decision, junk, then ours: only ours arrives, and the
	// junk is reported.
	b.publishDecision(t, events.Decision{OutcomeID: "o-other", Agent: "other", Action: events.ActionGiveUp})
	if _, err := b.js.Publish(b.ctx, events.DecisionSubject("bot"), []byte("not msgpack")); err != nil {
		t.Fatal(err)
	}
	b.publishDecision(t, events.Decision{OutcomeID: "o-1", Agent: "bot", Action: events.ActionRetry, DelayMS: 1500})
	d := receive(t, ch)
	if d.OutcomeID != "o-1" || d.Action != events.ActionRetry || d.DelayMS != 1500 {
		t.Errorf("decision = %+v", d)
	}
	mu.Lock()
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "undecodable") {
		t.Errorf("errors = %v, want one undecodable message", errs)
	}
	mu.Unlock()
	cancel()
	for range ch {
	}
}

func TestAgentDurableResumesAfterRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// open starts an agent process: its own connection, a durable reader.
	open := func() (<-chan events.Decision, func()) {
		t.Helper()
		nc, err := b.srv.Connect()
		if err != nil {
			t.Fatal(err)
		}
		ag, err := agent.New(nc, "bot", agent.WithDurable())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(b.ctx)
		ch, err := ag.Decisions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ch, func() {
			// Stop cleanly: cancel, wait for the channel to close, close.
			cancel()
			for range ch {
			}
			nc.Close()
		}
	}
	ch, stop := open()
	b.publishDecision(t, events.Decision{OutcomeID: "o-1", Agent: "bot", Action: events.ActionRetry})
	if d := receive(t, ch); d.OutcomeID != "o-1" {
		t.Fatalf("first run got %s, want o-1", d.OutcomeID)
	}
	stop()
	// While no process reads, two more decisions are published.
	b.publishDecision(t, events.Decision{OutcomeID: "o-2", Agent: "bot", Action: events.ActionSwitchProfile})
	b.publishDecision(t, events.Decision{OutcomeID: "o-3", Agent: "bot", Action: events.ActionGiveUp})
	// A restarted agent of the same name gets exactly those, in order.
	ch, stop = open()
	defer stop()
	for _, want := range []string{"o-2", "o-3"} {
		if d := receive(t, ch); d.OutcomeID != want {
			t.Fatalf("restarted agent got %s, want %s", d.OutcomeID, want)
		}
	}
	info, err := b.js.Consumer(b.ctx, topology.StreamDecisions, durable.Name("bot", "decisions"))
	if err != nil {
		t.Fatal(err)
	}
	if p := info.CachedInfo().NumAckPending; p > 1 {
		t.Errorf("ack pending = %d", p)
	}
}

func TestAgentDueRetriesWrittenByTheScheduler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ag, err := agent.New(b.nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	ch, err := ag.DueRetries(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// What the scheduler service does: a JetStream message schedule that
	// fires into failbus.retry.due.<agent>.
	due := events.RetryDue{RetryID: "r-1", OutcomeID: "o-1", Agent: "bot", Retry: 1, DueAt: events.At(time.Now().Add(500 * time.Millisecond))}
	data, hdr, err := events.Encode(&due)
	if err != nil {
		t.Fatal(err)
	}
	hdr.Set("Nats-Schedule", "@at "+due.DueAt.UTC().Format(time.RFC3339Nano))
	hdr.Set("Nats-Schedule-Target", events.RetryDueSubject("bot"))
	if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: events.RetryScheduleSubject("bot", "r-1"), Header: hdr, Data: data}); err != nil {
		t.Fatalf("publish schedule: %v", err)
	}
	got := receive(t, ch)
	if got.RetryID != "r-1" || got.OutcomeID != "o-1" || got.Retry != 1 {
		t.Errorf("due retry = %+v", got)
	}
}

func TestAgentNewRejects(t *testing.T) {
	t.Parallel()
	if _, err := agent.New(nil, "bot"); err == nil {
		t.Error("New(nil conn) succeeded")
	}
	b := setup(t)
	if _, err := agent.New(b.nc, ""); err == nil {
		t.Error("New with an empty name succeeded")
	}
}
