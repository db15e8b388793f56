package agent

// What an agent reports so the bus can run the post-outage checklist
// (docs/CONTRACT.md § "Recovery"), and what it gets back: its subagents'
// heartbeats, its crons' schedules and runs, its memory writes, the tasks it
// submits (held during an outage), and the dispatches and control commands
// recovery sends.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/failbus/failbus/pkg/events"
)

// defaultHeartbeatInterval is how often a Subagent says it is running.
const defaultHeartbeatInterval = events.DefaultHeartbeatIntervalMS * time.Millisecond

// Heartbeat publishes one heartbeat of a subagent; Agent and At are filled
// when empty. Most callers use StartSubagent, which sends them on time.
func (a *Agent) Heartbeat(ctx context.Context, h events.Heartbeat) error {
	if h.Agent == "" {
		h.Agent = a.name
	}
	if h.At.IsZero() {
		h.At = events.At(a.opts.now())
	}
	id := "hb:" + h.Agent + ":" + h.Subagent + ":" + strconv.FormatInt(h.At.UnixNano(), 10) + ":" + h.State()
	if err := a.publish(ctx, events.HeartbeatSubject(h.Agent), &h, id); err != nil {
		return fmt.Errorf("agent %s: heartbeat of %s: %w", a.name, h.Subagent, err)
	}
	return nil
}

// SubagentConfig describes a subagent to StartSubagent.
type SubagentConfig struct {
	// Name identifies the subagent within the agent; required.
	Name string
	// TaskID is the task it works on: recovery re-dispatches it (attempt
	// + 1) if it kills the subagent.
	TaskID string
	// Provider, Model and Session say what it calls; a subagent without a
	// provider belongs to every provider's checklist.
	Provider, Model, Session string
	// Interval is how often it says it is running. Defaults to
	// 10 seconds. Recovery kills a subagent whose last
	// heartbeat is older than 3 intervals (recovery.stale_after) after an
	// outage, so pick what the subagent can keep.
	Interval time.Duration
	// Checkpoint is where the task resumes from, when it starts from one
	// (Dispatch.Checkpoint of a re-dispatch); Subagent.Checkpoint moves it.
	Checkpoint string
}

// Subagent is a running subagent's heartbeat: a goroutine sends `running`
// every interval until Done, Failed or Stop, or until recovery kills it
// (see HandleControls), which cancels Context.
type Subagent struct {
	a      *Agent
	cfg    SubagentConfig
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once

	mu         sync.Mutex
	checkpoint string
}

// ErrKilled is the cause of a Subagent's Context when recovery killed it.
var ErrKilled = errors.New("agent: subagent killed by recovery")

// StartSubagent sends the subagent's first heartbeat and keeps sending one
// every interval from a goroutine. A heartbeat that fails to publish is
// reported to the error handler (WithErrorHandler) and the next one is
// tried on time. ctx bounds the subagent's life: when it ends, the
// heartbeats stop (without a final status: like a process that died).
func (a *Agent) StartSubagent(ctx context.Context, cfg SubagentConfig) (*Subagent, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("agent %s: subagent without a name", a.name)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = defaultHeartbeatInterval
	}
	sctx, cancel := context.WithCancelCause(ctx)
	s := &Subagent{a: a, cfg: cfg, ctx: sctx, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{}), checkpoint: cfg.Checkpoint}
	if err := s.beat(ctx, events.HeartbeatRunning); err != nil {
		cancel(err)
		return nil, err
	}
	a.mu.Lock()
	a.subagents[cfg.Name] = s
	a.mu.Unlock()
	go s.loop()
	return s, nil
}

func (s *Subagent) beat(ctx context.Context, status string) error {
	s.mu.Lock()
	checkpoint := s.checkpoint
	s.mu.Unlock()
	return s.a.Heartbeat(ctx, events.Heartbeat{
		Subagent: s.cfg.Name, TaskID: s.cfg.TaskID, Provider: s.cfg.Provider, Model: s.cfg.Model,
		Session: s.cfg.Session, Status: status, IntervalMS: s.cfg.Interval.Milliseconds(), Checkpoint: checkpoint,
	})
}

// Checkpoint records where the subagent's task can resume from (at most
// events.MaxCheckpointBytes: a reference, such as a file or an offset),
// sending a heartbeat with it now; every later heartbeat carries it. If
// recovery kills the subagent, the task's re-dispatch carries the last
// one recorded (Dispatch.Checkpoint), so the work done is not thrown away.
func (s *Subagent) Checkpoint(ctx context.Context, checkpoint string) error {
	if len(checkpoint) > events.MaxCheckpointBytes {
		return fmt.Errorf("agent %s: subagent %s: a checkpoint of %d bytes exceeds %d", s.a.name, s.cfg.Name, len(checkpoint), events.MaxCheckpointBytes)
	}
	s.mu.Lock()
	s.checkpoint = checkpoint
	s.mu.Unlock()
	return s.beat(ctx, events.HeartbeatRunning)
}

func (s *Subagent) loop() {
	defer close(s.done)
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.ctx.Done():
			return
		case <-t.C:
			// A beat may take up to its interval, or 2s for short ones
			// (a loaded bus); a late beat only delays the next.
			bctx, cancel := context.WithTimeout(s.ctx, max(s.cfg.Interval, 2*time.Second))
			if err := s.beat(bctx, events.HeartbeatRunning); err != nil && s.ctx.Err() == nil {
				s.a.opts.onError(err)
			}
			cancel()
		}
	}
}

// Name is the subagent's name.
func (s *Subagent) Name() string { return s.cfg.Name }

// Context ends when the subagent ends: Done, Failed, Stop, the context
// given to StartSubagent, or a kill from recovery (cause ErrKilled). Its
// work should run under it.
func (s *Subagent) Context() context.Context { return s.ctx }

// Done stops the heartbeats and reports the subagent finished.
func (s *Subagent) Done(ctx context.Context) error {
	return s.end(ctx, events.HeartbeatDone, errors.New("subagent done"))
}

// Failed stops the heartbeats and reports the subagent failed.
func (s *Subagent) Failed(ctx context.Context, cause error) error {
	if cause == nil {
		cause = errors.New("subagent failed")
	}
	return s.end(ctx, events.HeartbeatFailed, cause)
}

// Stop stops the heartbeats without a final status, as if the process had
// died: after an outage recovery will find it stale and kill it.
func (s *Subagent) Stop() { s.halt(errors.New("subagent stopped")) }

func (s *Subagent) halt(cause error) {
	s.once.Do(func() {
		close(s.stop)
		<-s.done
		s.cancel(cause)
		s.a.mu.Lock()
		if s.a.subagents[s.cfg.Name] == s {
			delete(s.a.subagents, s.cfg.Name)
		}
		s.a.mu.Unlock()
	})
}

func (s *Subagent) end(ctx context.Context, status string, cause error) error {
	s.halt(cause)
	return s.beat(ctx, status)
}

// DeclareCron publishes a cron's schedule (CronSpec); Agent and At are
// filled when empty. Declare every cron when the agent starts and whenever
// its schedule changes: recovery re-runs the times an outage made it miss.
// The schedule is checked here, so a typo fails at once.
func (a *Agent) DeclareCron(ctx context.Context, c events.CronSpec) error {
	if c.Agent == "" {
		c.Agent = a.name
	}
	if c.At.IsZero() {
		c.At = events.At(a.opts.now())
	}
	id := "cron-spec:" + c.Agent + ":" + c.Cron + ":" + strconv.FormatInt(c.At.UnixNano(), 10)
	if err := a.publish(ctx, events.CronSpecSubject(c.Agent), &c, id); err != nil {
		return fmt.Errorf("agent %s: declare cron %s: %w", a.name, c.Cron, err)
	}
	return nil
}

// CronRun reports a run of a cron for one scheduled time: `started`, then
// `ok` or `failed`. Only an ok run keeps recovery from re-running that
// time. Agent and At are filled when empty; one record per (cron,
// scheduled time, status) is kept however often it is reported.
func (a *Agent) CronRun(ctx context.Context, r events.CronRun) error {
	if r.Agent == "" {
		r.Agent = a.name
	}
	if r.At.IsZero() {
		r.At = events.At(a.opts.now())
	}
	id := "cron-run:" + r.Agent + ":" + r.Cron + ":" + strconv.FormatInt(r.ScheduledAt.UnixMilli(), 10) + ":" + r.Status
	if err := a.publish(ctx, events.CronRunSubject(r.Agent), &r, id); err != nil {
		return fmt.Errorf("agent %s: cron run %s: %w", a.name, r.Cron, err)
	}
	return nil
}

// Write reports a memory write and whether it reached its store. After an
// outage recovery asks (check_write) about each write that failed during it
// and was not written again. Agent and At are filled when empty.
func (a *Agent) Write(ctx context.Context, w events.Write) error {
	if w.Agent == "" {
		w.Agent = a.name
	}
	if w.At.IsZero() {
		w.At = events.At(a.opts.now())
	}
	id := "write:" + w.Agent + ":" + w.Key + ":" + strconv.FormatInt(w.At.UnixNano(), 10)
	if err := a.publish(ctx, events.WriteSubject(w.Agent), &w, id); err != nil {
		return fmt.Errorf("agent %s: write %s: %w", a.name, w.Key, err)
	}
	return nil
}

// SubmitTask submits work for a provider: recovery dispatches it back at
// once (Dispatches) while the provider is up, and holds it — durably, in
// FAILBUS_TASKS — while the provider is down, releasing it after recovery.
// It fills ID (a new unique id; written back, so a retry after an error is
// one task), Agent and At when empty. The id is the Nats-Msg-Id: a task
// submitted twice is dispatched once.
func (a *Agent) SubmitTask(ctx context.Context, t *events.Task) error {
	if t == nil {
		return errors.New("agent: submit a nil task")
	}
	if t.ID == "" {
		t.ID = nuid.Next()
	}
	if t.Agent == "" {
		t.Agent = a.name
	}
	if t.At.IsZero() {
		t.At = events.At(a.opts.now())
	}
	if err := a.publish(ctx, events.TaskSubject(t.Provider, t.Agent), t, t.ID); err != nil {
		return fmt.Errorf("agent %s: submit task %s: %w", a.name, t.ID, err)
	}
	return nil
}
