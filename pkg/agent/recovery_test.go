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

	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

func (b *bundle) heartbeats(t *testing.T, subject string) []*events.Heartbeat {
	t.Helper()
	c, err := b.js.OrderedConsumer(b.ctx, topology.StreamLiveness, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.js.DeleteConsumer(b.ctx, topology.StreamLiveness, c.CachedInfo().Name)
	var out []*events.Heartbeat
	for n := c.CachedInfo().NumPending; uint64(len(out)) < n; {
		m, err := c.Next(jetstream.FetchMaxWait(2 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		h, err := events.DecodeAs[*events.Heartbeat](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

// A subagent beats every interval until it ends; Done sends the final
// status and stops; Stop stops without one (like a process that died).
func TestSubagentHeartbeats(t *testing.T) {
	b := setup(t)
	ag, err := agent.New(b.nc, "coord")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ag.StartSubagent(b.ctx, agent.SubagentConfig{Name: "sub-1", TaskID: "job-1", Provider: "openai", Interval: 30 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.count(t, topology.StreamLiveness, events.HeartbeatSubject("coord")) < 4 {
		if time.Now().After(deadline) {
			t.Fatal("fewer than 4 heartbeats")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Done(b.ctx); err != nil {
		t.Fatal(err)
	}
	if s.Context().Err() == nil {
		t.Fatal("context still live after Done")
	}
	hbs := b.heartbeats(t, events.HeartbeatSubject("coord"))
	last := hbs[len(hbs)-1]
	if last.Status != events.HeartbeatDone || last.Subagent != "sub-1" || last.TaskID != "job-1" || last.IntervalMS != 30 || last.Provider != "openai" {
		t.Fatalf("last heartbeat %+v, want done with the subagent's fields", last)
	}
	for _, h := range hbs[:len(hbs)-1] {
		if h.State() != events.HeartbeatRunning {
			t.Fatalf("heartbeat %+v before the end is not running", h)
		}
	}
	// Done returns once the heartbeat goroutine has ended, so the done
	// record is the last one: checked above, and no later one can come.
}

// A cron spec with a schedule that does not parse, or a task without an
// agent-independent problem, fails before anything is published.
func TestDeclareCronChecksTheSchedule(t *testing.T) {
	b := setup(t)
	ag, _ := agent.New(b.nc, "coord")
	err := ag.DeclareCron(b.ctx, events.CronSpec{Cron: "digest", Schedule: "every morning"})
	var fe *events.FieldError
	if !errors.As(err, &fe) || fe.Field != "schedule" {
		t.Fatalf("DeclareCron: %v, want a FieldError on schedule", err)
	}
	if n := b.count(t, topology.StreamReports, "failbus.cron.>"); n != 0 {
		t.Fatalf("%d cron records published", n)
	}
	if err := ag.DeclareCron(b.ctx, events.CronSpec{Cron: "digest", Schedule: "0 9 * * *", Timezone: "Europe/Berlin"}); err != nil {
		t.Fatal(err)
	}
	if err := ag.CronRun(b.ctx, events.CronRun{Cron: "digest", ScheduledAt: events.At(time.Now()), Status: events.CronOK}); err != nil {
		t.Fatal(err)
	}
	if err := ag.Write(b.ctx, events.Write{Key: "memory/x.md", Error: "fetch failed"}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, topology.StreamReports, ">"); n != 3 {
		t.Fatalf("%d reports stored, want 3", n)
	}
}

// SubmitTask fills the id and writes it back: submitting the same task
// again after a lost acknowledgement stores it once.
func TestSubmitTaskOncePerID(t *testing.T) {
	b := setup(t)
	ag, _ := agent.New(b.nc, "coord")
	task := &events.Task{Provider: "openai", Kind: "research"}
	if err := ag.SubmitTask(b.ctx, task); err != nil {
		t.Fatal(err)
	}
	if task.ID == "" || task.Agent != "coord" {
		t.Fatalf("task not filled in: %+v", task)
	}
	if err := ag.SubmitTask(b.ctx, task); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, topology.StreamTasks, events.TaskSubject("openai", "coord")); n != 1 {
		t.Fatalf("%d tasks stored, want 1", n)
	}
	m := b.last(t, topology.StreamTasks, events.TaskSubject("openai", "coord"))
	if m.Header.Get(nats.MsgIdHdr) != task.ID {
		t.Fatalf("Nats-Msg-Id %q, want the task id", m.Header.Get(nats.MsgIdHdr))
	}
}

// Control commands reach their handlers; kill by default stops a subagent
// this process runs and cancels its context with ErrKilled.
func TestHandleControls(t *testing.T) {
	b := setup(t)
	var mu sync.Mutex
	var errs []error
	ag, _ := agent.New(b.nc, "coord", agent.WithErrorHandler(func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}))
	s, err := ag.StartSubagent(b.ctx, agent.SubagentConfig{Name: "sub-1", Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	got := make(chan events.Control, 10)
	done := make(chan error, 1)
	go func() {
		done <- ag.HandleControls(ctx, agent.ControlHandlers{
			RunCron: func(_ context.Context, c events.Control) error { got <- c; return nil },
			Probe:   func(_ context.Context, c events.Control) error { got <- c; return nil },
		})
	}()
	publish := func(c events.Control, id string) {
		data, h, err := events.Encode(&c)
		if err != nil {
			t.Fatal(err)
		}
		h.Set(events.HeaderMsgID, id)
		if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: events.ControlSubject(c.Agent), Header: h, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	// The consumer reads from the moment New was called: nothing published
	// after that is missed, however late it opens.
	publish(events.Control{Agent: "coord", Action: events.ControlProbe, Provider: "openai"}, "p1")
	publish(events.Control{Agent: "coord", Action: events.ControlRunCron, Cron: "digest", ScheduledAt: events.At(time.Now())}, "c1")
	publish(events.Control{Agent: "coord", Action: events.ControlKill, Subagent: "sub-1"}, "k1")
	publish(events.Control{Agent: "coord", Action: events.ControlCheckWrite, Key: "memory/x.md"}, "w1")
	for _, want := range []string{events.ControlProbe, events.ControlRunCron} {
		select {
		case c := <-got:
			if c.Action != want {
				t.Fatalf("handler got %s, want %s", c.Action, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s", want)
		}
	}
	select {
	case <-s.Context().Done():
		if !errors.Is(context.Cause(s.Context()), agent.ErrKilled) {
			t.Fatalf("cause %v, want ErrKilled", context.Cause(s.Context()))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("subagent not killed")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(errs)
		mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("errors %v, want one for check_write without handler", errs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !errors.Is(errs[0], agent.ErrNoHandler) || !strings.Contains(errs[0].Error(), "check_write") {
		t.Fatalf("error %v", errs[0])
	}
	if ag.Subagent("sub-1") != nil {
		t.Fatal("killed subagent still listed")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A task whose payload holds JSON bytes instead of msgpack is refused by
// SubmitTask, saying so, and nothing reaches the bus (it would be a dead
// letter there: "trailing bytes after the message").
func TestSubmitTaskRefusesAJSONPayload(t *testing.T) {
	b := setup(t)
	ag, _ := agent.New(b.nc, "coord")
	err := ag.SubmitTask(b.ctx, &events.Task{Provider: "openai", Kind: "research", Payload: events.Raw(`{"q":"why"}`)})
	if !errors.Is(err, events.ErrRawNotMsgpack) || !strings.Contains(err.Error(), "events.RawJSON") {
		t.Fatalf("SubmitTask with JSON bytes: %v; want ErrRawNotMsgpack naming the helper", err)
	}
	payload, err := events.RawOf(map[string]string{"q": "why"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ag.SubmitTask(b.ctx, &events.Task{Provider: "openai", Kind: "research", Payload: payload}); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, topology.StreamTasks, events.TaskSubject("openai", "coord")); n != 1 {
		t.Fatalf("%d tasks stored, want only the msgpack one", n)
	}
}
