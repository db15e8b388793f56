package drill

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// busFleet is the fleet on the bus: each agent submits its tasks through
// the bus, runs every call under agent.Call (its SDKs' retries off),
// carries out the decisions, heartbeats and checkpoints its subagents, and
// obeys recovery's controls.
type busFleet struct {
	r       *run
	bus     *devbus.Bus // nil when Config.Connect names a bus
	conns   []*nats.Conn
	agents  map[string]*busAgent
	errs    atomic.Int64 // errors the agents' readers reported
	lastErr atomic.Value

	redispatched atomic.Int64
}

func newBusFleet(r *run) *busFleet { return &busFleet{r: r, agents: map[string]*busAgent{}} }

// busAgent is one agent on the bus.
type busAgent struct {
	f    *busFleet
	plan AgentPlan
	a    *agent.Agent

	mu       sync.Mutex
	profile  map[string]string        // provider -> the profile it calls now
	inflight map[string]int           // provider -> Calls in flight
	runs     map[string]*taskRun      // task id -> the attempt running it
	notes    map[string]*taskNotes    // task id -> what its steps produced (the agent's disk)
	store    map[string]bool          // memory entries written
	failed   map[string]time.Time     // memory entries whose write failed -> their cron time
	keyRuns  map[string]chan struct{} // memory entries being written now
}

// taskRun is the attempt of a task a subagent runs now.
type taskRun struct {
	sub    *agent.Subagent
	cancel context.CancelFunc
}

// taskNotes are a task's results so far, kept where its checkpoint points.
type taskNotes struct {
	answers  []string
	provider string // where its segment goes (the other provider after a refusal)
}

func (f *busFleet) begin(ctx context.Context) error {
	r := f.r
	connect := r.cfg.Connect
	if connect == nil {
		pol, err := BusPolicy(r.cfg.Scale)
		if err != nil {
			return err
		}
		b, err := devbus.Start(devbus.Options{Server: embedded.Options{}, Policy: pol, Log: r.cfg.Log})
		if err != nil {
			return fmt.Errorf("start the bus: %w", err)
		}
		f.bus = b
		connect = func(name string) (*nats.Conn, error) { return b.Srv.Connect(nats.Name(name)) }
	}
	for _, p := range r.plan.Agents {
		nc, err := connect("drill " + p.Name)
		if err != nil {
			return fmt.Errorf("connect agent %s: %w", p.Name, err)
		}
		f.conns = append(f.conns, nc)
		ag := &busAgent{
			f: f, plan: p, profile: map[string]string{}, inflight: map[string]int{}, runs: map[string]*taskRun{},
			notes: map[string]*taskNotes{}, store: map[string]bool{}, failed: map[string]time.Time{}, keyRuns: map[string]chan struct{}{},
		}
		ag.a, err = agent.New(nc, p.Name, agent.WithErrorHandler(f.onError))
		if err != nil {
			return err
		}
		f.agents[p.Name] = ag
		i := len(f.agents) - 1
		err = ag.a.DeclareCron(ctx, events.CronSpec{
			At: events.At(r.cronStart(i)), Cron: "journal", Schedule: "@every " + r.cronWall().String(),
			Provider: p.Primary, Catchup: events.CatchupLatest,
		})
		if err != nil {
			return err
		}
		r.goFleet(func() {
			if err := ag.a.HandleDispatches(ctx, ag.dispatched); err != nil {
				f.onError(err)
			}
		})
		r.goFleet(func() {
			err := ag.a.HandleControls(ctx, agent.ControlHandlers{Kill: ag.kill, RunCron: ag.runCron, CheckWrite: ag.checkWrite, Probe: ag.probe})
			if err != nil {
				f.onError(err)
			}
		})
	}
	return nil
}

func (f *busFleet) onError(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	f.errs.Add(1)
	f.lastErr.Store(err.Error())
	f.r.cfg.Log.Debug().Err(err).Msg("drill agent")
}

func (f *busFleet) end(ctx context.Context) (*busFigures, error) {
	defer func() {
		for _, nc := range f.conns {
			nc.Close()
		}
		if f.bus != nil {
			_ = f.bus.Stop()
		}
	}()
	if len(f.conns) == 0 {
		return nil, nil
	}
	bf, err := countBus(ctx, f.conns[0], f.r.start)
	if err != nil {
		return nil, err
	}
	bf.AgentErrors = int(f.errs.Load())
	if s, ok := f.lastErr.Load().(string); ok {
		bf.LastAgentError = s
	}
	bf.Redispatched = int(f.redispatched.Load())
	return bf, nil
}

// arrive submits t through the bus: dispatched back at once while its
// provider is up, held while it is down.
func (f *busFleet) arrive(ctx context.Context, t TaskPlan) {
	ag := f.agents[t.Agent]
	if err := ag.a.SubmitTask(ctx, &events.Task{ID: t.ID, Provider: ag.plan.Primary, Kind: "work"}); err != nil && ctx.Err() == nil {
		f.r.track.lost(t.ID, "the bus did not take the task")
		f.onError(err)
	}
}

func (f *busFleet) cron(ctx context.Context, a AgentPlan, scheduled time.Time) {
	f.agents[a.Name].journal(ctx, scheduled)
}

// crash ends task id's subagent as a dying process would: its heartbeats
// stop without a final status and its work stops.
func (f *busFleet) crash(id string) bool {
	t, ok := f.r.plan.Task(id)
	if !ok {
		return false
	}
	ag := f.agents[t.Agent]
	ag.mu.Lock()
	tr := ag.runs[id]
	delete(ag.runs, id)
	ag.mu.Unlock()
	if tr == nil {
		return false
	}
	tr.sub.Stop()
	tr.cancel()
	return true
}

// dispatched runs a task the bus released (attempt 1, or a re-dispatch
// after recovery killed the subagent of the attempt before).
func (ag *busAgent) dispatched(ctx context.Context, d events.Dispatch) error {
	t, ok := ag.f.r.plan.Task(d.TaskID)
	if !ok {
		return fmt.Errorf("dispatch of unknown task %s", d.TaskID)
	}
	if d.Attempt > 1 {
		ag.f.redispatched.Add(1)
		ag.f.r.track.resume(t.ID, resumeStep(d.Checkpoint))
	}
	ag.f.r.goFleet(func() { ag.runTask(ctx, t, d) })
	return nil
}

// resumeStep is the last step a checkpoint says was done.
func resumeStep(checkpoint string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(checkpoint, "step="))
	return n
}

func (ag *busAgent) runTask(ctx context.Context, t TaskPlan, d events.Dispatch) {
	r := ag.f.r
	done := resumeStep(d.Checkpoint)
	ag.mu.Lock()
	notes := ag.notes[t.ID]
	if notes == nil {
		notes = &taskNotes{provider: ag.plan.Primary}
		ag.notes[t.ID] = notes
	}
	answers := append([]string(nil), notes.answers[:min(done, len(notes.answers))]...)
	provider := notes.provider
	ag.mu.Unlock()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub, err := ag.a.StartSubagent(sctx, agent.SubagentConfig{
		Name: fmt.Sprintf("%s.%d", t.ID, d.Attempt), TaskID: t.ID, Provider: ag.plan.Primary, Session: t.ID,
		Interval: r.cfg.heartbeatWall(), Checkpoint: d.Checkpoint,
	})
	if err != nil {
		if ctx.Err() == nil {
			r.track.lost(t.ID, "its subagent could not start")
			ag.f.onError(err)
		}
		return
	}
	ag.mu.Lock()
	ag.runs[t.ID] = &taskRun{sub: sub, cancel: cancel}
	ag.mu.Unlock()
	defer func() {
		ag.mu.Lock()
		if tr := ag.runs[t.ID]; tr != nil && tr.sub == sub {
			delete(ag.runs, t.ID)
		}
		ag.mu.Unlock()
	}()
	r.track.running(t.ID)
	sc := sub.Context()
	moved := provider != ag.plan.Primary
	for step := len(answers) + 1; step <= t.Steps; step++ {
		if step > 1 && !sleepUntil(sc, time.Now().Add(r.cfg.wall(stepGap))) {
			r.track.waiting(t.ID) // crashed or killed: the bus dispatches it again
			return
		}
		text, err := ag.step(sc, t, step, answers, provider)
		if sc.Err() != nil {
			r.track.waiting(t.ID)
			return
		}
		var de *agent.DecisionError
		if errors.As(err, &de) && de.Action() == events.ActionSkipProvider && !moved {
			// The provider refused the segment's history: the segment
			// goes to the other provider from now on.
			provider, moved = Other(provider), true
			ag.mu.Lock()
			notes.provider = provider
			ag.mu.Unlock()
			step--
			continue
		}
		if err != nil {
			why := "Call: " + err.Error()
			if de != nil {
				why = "the bus decided " + de.Action() + " (" + de.Decision.Class + ")"
			} else if i := strings.Index(why, " for outcome"); i > 0 {
				why = why[:i]
			}
			_ = sub.Failed(context.WithoutCancel(sc), err)
			r.track.lost(t.ID, why)
			return
		}
		answers = append(answers, text)
		ag.mu.Lock()
		notes.answers = append(notes.answers[:step-1], text)
		ag.mu.Unlock()
		if err := sub.Checkpoint(sc, "step="+strconv.Itoa(step)); err != nil && sc.Err() == nil {
			ag.f.onError(err)
		}
	}
	if err := sub.Done(context.WithoutCancel(sc)); err != nil {
		ag.f.onError(err)
	}
	r.track.done(t.ID)
}

// currentProfile is the profile the agent calls provider with now.
func (ag *busAgent) currentProfile(provider string) string {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	if p := ag.profile[provider]; p != "" {
		return p
	}
	return ag.plan.Profile
}

// call runs one logical call under agent.Call, sending conv, and keeps
// the profile switches the bus decided for the agent's next calls. When
// the bus gives up on a key (its quota, its credentials) knowing no
// other profile that works, the agent tries its other profile once: the
// bus cannot know a profile nobody has used yet.
func (ag *busAgent) call(ctx context.Context, req agent.Request, conv []message, in intent) (string, error) {
	text, err := ag.callOnce(ctx, req, conv, in)
	var de *agent.DecisionError
	if errors.As(err, &de) && de.Action() == events.ActionGiveUp && (de.Decision.Class == events.ClassQuotaExhausted || de.Decision.Class == events.ClassAuth) {
		p := de.Outcome.Provider
		ag.mu.Lock()
		other := ProfileBackup
		if de.Outcome.Profile == ProfileBackup {
			other = ProfileMain
		}
		ag.profile[p] = other
		ag.mu.Unlock()
		return ag.callOnce(ctx, req, conv, in)
	}
	return text, err
}

func (ag *busAgent) callOnce(ctx context.Context, req agent.Request, conv []message, in intent) (string, error) {
	r := ag.f.r
	req.Model = r.sdks.models[req.Provider]
	req.Profile = ag.currentProfile(req.Provider)
	req.Describe = describe
	req.StallAfter = r.cfg.stallWall()
	req.ResumeWindow = max(r.cfg.wall(resumeWindow), time.Millisecond)
	req.RequestTokens = tokens(conv)
	req.OnRestart = func(agent.Restart) { r.track.add(&r.track.restarts, 1) }
	ag.mu.Lock()
	ag.inflight[req.Provider]++
	ag.mu.Unlock()
	defer func() {
		ag.mu.Lock()
		ag.inflight[req.Provider]--
		ag.mu.Unlock()
	}()
	text, trail, err := agent.Call(ctx, ag.a, req, func(ctx context.Context, at *agent.Attempt) (string, error) {
		profile := at.Profile
		if profile == "" {
			profile = ag.currentProfile(at.Provider)
		}
		c, i := conv, in
		if at.Probe {
			c, i = probeConversation, intent{Kind: kindProbe, Agent: ag.plan.Name}
		}
		i.Began = time.Now()
		if i.Task != "" {
			r.track.call(i.Task, 1)
			defer r.track.call(i.Task, -1)
		}
		ans, err := r.sdks.stream(withIntent(ctx, i), at.Provider, at.Model, r.sdks.keys(ag.plan.Name, at.Provider, profile), c, func(s string) {
			at.Emit(s)
			if i.Task != "" {
				r.track.touch(i.Task)
			}
		})
		if err != nil {
			return "", err
		}
		if ans.refused != "" {
			// The task's content is in every prompt of the segment: a
			// refusal of it is a refusal of accepted history.
			at.Observe(agent.Evidence{Status: 200, StopReason: ans.refused, RefusalScope: "history"})
			return "", nil
		}
		return ans.text, nil
	})
	ag.mu.Lock()
	for _, s := range trail {
		if d := s.Decision; d != nil && d.Action == events.ActionSwitchProfile && d.Profile != "" {
			ag.profile[s.Target.Provider] = d.Profile
		}
	}
	ag.mu.Unlock()
	for _, s := range trail {
		if s.Decision != nil {
			r.track.decided(s.Decision.Action)
		}
	}
	return text, err
}

// step runs step of task t on provider.
func (ag *busAgent) step(ctx context.Context, t TaskPlan, step int, answers []string, provider string) (string, error) {
	return ag.call(ctx, agent.Request{
		Provider: provider, Session: t.ID, Segment: 1, Turn: step, Step: 1,
		Origin: &events.Origin{Kind: "subagent", Name: t.ID, Parent: ag.plan.Name},
	}, stepConversation(t, step, answers), intent{Kind: kindStep, Agent: t.Agent, Task: t.ID, Step: step})
}

// journal is the cron's run for scheduled: one call, one memory entry,
// each reported to the bus. A run that cannot finish before the next one
// is due fails (the bus re-runs it after an outage).
func (ag *busAgent) journal(ctx context.Context, scheduled time.Time) bool {
	r := ag.f.r
	key := journalKey(ag.plan.Name, scheduled)
	return ag.once(key, func() bool {
		a, p := ag.a, ag.plan.Primary
		sa := events.At(scheduled)
		_ = a.CronRun(ctx, events.CronRun{Cron: "journal", ScheduledAt: sa, Status: events.CronStarted, Provider: p})
		cctx, cancel := context.WithTimeout(ctx, r.cronWall())
		defer cancel()
		_, err := ag.call(cctx, agent.Request{
			Provider: p, Session: ag.plan.Name + "/journal", Segment: 1, Turn: int(scheduled.Unix()), Step: 1,
			Origin: &events.Origin{Kind: "cron", Name: "journal", Parent: ag.plan.Name},
		}, cronConversation(ag.plan.Name, scheduled), intent{Kind: kindCron, Agent: ag.plan.Name})
		if ctx.Err() != nil {
			r.track.add(&r.track.cronsCut, 1)
			return false
		}
		if err != nil {
			ag.mu.Lock()
			ag.failed[key] = scheduled
			ag.mu.Unlock()
			_ = a.CronRun(ctx, events.CronRun{Cron: "journal", ScheduledAt: sa, Status: events.CronFailed, Provider: p})
			_ = a.Write(ctx, events.Write{Key: key, OK: false, Error: err.Error(), Provider: p})
			return false
		}
		r.track.cronRan(key)
		ag.mu.Lock()
		ag.store[key] = true
		delete(ag.failed, key)
		ag.mu.Unlock()
		_ = a.Write(ctx, events.Write{Key: key, OK: true, Provider: p})
		_ = a.CronRun(ctx, events.CronRun{Cron: "journal", ScheduledAt: sa, Status: events.CronOK, Provider: p})
		return true
	})
}

// once runs fn for memory entry key unless it is written already or
// being written (then it waits for that write); true when fn ran and
// succeeded.
func (ag *busAgent) once(key string, fn func() bool) bool {
	for {
		ag.mu.Lock()
		if ag.store[key] {
			ag.mu.Unlock()
			return false
		}
		ch, busy := ag.keyRuns[key]
		if !busy {
			ch = make(chan struct{})
			ag.keyRuns[key] = ch
			ag.mu.Unlock()
			defer func() {
				ag.mu.Lock()
				delete(ag.keyRuns, key)
				ag.mu.Unlock()
				close(ch)
			}()
			return fn()
		}
		ag.mu.Unlock()
		<-ch
	}
}

// kill obeys recovery: stop the named subagent if it runs here. One that
// runs was not crashed: killing it is a wrong kill, counted.
func (ag *busAgent) kill(_ context.Context, c events.Control) error {
	r := ag.f.r
	r.track.add(&r.track.killed, 1)
	if s := ag.a.Subagent(c.Subagent); s != nil {
		r.track.add(&r.track.wronglyKilled, 1)
		s.Stop()
	}
	return nil
}

// runCron re-runs the journal for a time the outage made it miss (on a
// goroutine of its own: a kill must not wait behind a call).
func (ag *busAgent) runCron(ctx context.Context, c events.Control) error {
	r := ag.f.r
	r.goFleet(func() {
		if ag.journal(ctx, c.ScheduledAt.Time) {
			r.track.add(&r.track.cronsRerun, 1)
		}
	})
	return nil
}

// checkWrite redoes a memory entry whose write failed, if it is still
// missing.
func (ag *busAgent) checkWrite(ctx context.Context, c events.Control) error {
	r := ag.f.r
	ag.mu.Lock()
	scheduled, ok := ag.failed[c.Key]
	ag.mu.Unlock()
	if !ok {
		return nil // written since, or not ours
	}
	r.goFleet(func() {
		if ag.journal(ctx, scheduled) {
			r.track.add(&r.track.writesRedone, 1)
		}
	})
	return nil
}

// probe answers the bus's probe of a provider in an outage with one real
// call, unless a Call of this agent holds on that provider: Call answers
// it then.
func (ag *busAgent) probe(ctx context.Context, c events.Control) error {
	r := ag.f.r
	ag.mu.Lock()
	busy := ag.inflight[c.Provider] > 0
	ag.mu.Unlock()
	if busy {
		return nil
	}
	profile := ag.currentProfile(c.Provider)
	pctx, cancel := context.WithTimeout(withIntent(ctx, intent{Kind: kindProbe, Agent: ag.plan.Name, Began: time.Now()}), r.cfg.stallWall())
	defer cancel()
	ans, err := r.sdks.stream(pctx, c.Provider, "", r.sdks.keys(ag.plan.Name, c.Provider, profile), probeConversation, nil)
	if ctx.Err() != nil {
		return nil
	}
	o := &events.Outcome{Provider: c.Provider, Model: r.sdks.models[c.Provider], Profile: profile, OK: err == nil && ans.refused == "", Status: 200,
		Origin: &events.Origin{Kind: "probe", Name: c.RecoveryID}}
	if err != nil {
		ev, ok := describe(err)
		if !ok {
			ev = agent.Evidence{TransportError: err.Error()}
		}
		o.Status, o.Body, o.Headers, o.TransportError, o.UpstreamCode = ev.Status, ev.Body, ev.Headers, ev.TransportError, ev.UpstreamCode
	}
	return ag.a.Report(ctx, o)
}

// tokens estimates a prompt's tokens as the chaos provider does.
func tokens(conv []message) int {
	n := 0
	for _, m := range conv {
		n += len(m.text) + 1
	}
	return (n + 3) / 4
}
