package drill

import (
	"context"
	"sync"
	"time"
)

// sdkFleet is the fleet on its SDKs' own retries, as agents without a bus
// are written: a task runs its steps at once; an error the SDK gives back
// (or an answer the provider refused) fails the task, and it is lost; a
// failed cron run (and the memory write it makes) is not redone; a
// crashed subagent's task is not noticed. Every failure the agent sees
// pages a human.
type sdkFleet struct {
	r *run

	mu      sync.Mutex
	cancels map[string]context.CancelFunc // running tasks' subagents
}

func newSDKFleet(r *run) *sdkFleet { return &sdkFleet{r: r, cancels: map[string]context.CancelFunc{}} }

func (f *sdkFleet) begin(context.Context) error { return nil }

func (f *sdkFleet) end(context.Context) (*busFigures, error) { return nil, nil }

func (f *sdkFleet) agent(name string) AgentPlan {
	for _, a := range f.r.plan.Agents {
		if a.Name == name {
			return a
		}
	}
	return AgentPlan{}
}

// arrive starts a subagent on t at once.
func (f *sdkFleet) arrive(ctx context.Context, t TaskPlan) {
	a := f.agent(t.Agent)
	sctx, cancel := context.WithCancel(ctx)
	f.mu.Lock()
	f.cancels[t.ID] = cancel
	f.mu.Unlock()
	f.r.track.running(t.ID)
	f.r.goFleet(func() {
		defer cancel()
		f.runTask(sctx, a, t)
		f.mu.Lock()
		delete(f.cancels, t.ID)
		f.mu.Unlock()
	})
}

func (f *sdkFleet) runTask(ctx context.Context, a AgentPlan, t TaskPlan) {
	r := f.r
	var answers []string
	for step := 1; step <= t.Steps; step++ {
		if step > 1 && !sleepUntil(ctx, time.Now().Add(r.cfg.wall(stepGap))) {
			return // crashed: nobody notices
		}
		cctx := withIntent(ctx, intent{Kind: kindStep, Agent: t.Agent, Task: t.ID, Step: step, Began: time.Now()})
		r.track.call(t.ID, 1)
		ans, err := r.sdks.stream(cctx, a.Primary, "", r.sdks.keys(a.Name, a.Primary, a.Profile), stepConversation(t, step, answers),
			func(string) { r.track.touch(t.ID) })
		r.track.call(t.ID, -1)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil:
			r.track.lost(t.ID, "the SDK returned an error")
			r.track.add(&r.track.pages, 1)
			return
		case ans.refused != "":
			r.track.lost(t.ID, "the provider refused the task's content")
			r.track.add(&r.track.pages, 1)
			return
		}
		answers = append(answers, ans.text)
	}
	r.track.done(t.ID)
}

// cron makes the run's one call and writes the journal entry; a failure
// is paged and the entry is missing for good.
func (f *sdkFleet) cron(ctx context.Context, a AgentPlan, scheduled time.Time) {
	r := f.r
	cctx, cancel := context.WithTimeout(withIntent(ctx, intent{Kind: kindCron, Agent: a.Name, Began: time.Now()}), r.cronWall())
	defer cancel()
	ans, err := r.sdks.stream(cctx, a.Primary, "", r.sdks.keys(a.Name, a.Primary, a.Profile), cronConversation(a.Name, scheduled), nil)
	if ctx.Err() != nil {
		r.track.add(&r.track.cronsCut, 1)
		return
	}
	if err != nil || ans.refused != "" {
		r.track.add(&r.track.pages, 1)
		return
	}
	r.track.cronRan(journalKey(a.Name, scheduled))
}

// crash ends task id's subagent without a word.
func (f *sdkFleet) crash(id string) bool {
	f.mu.Lock()
	cancel := f.cancels[id]
	f.mu.Unlock()
	if cancel == nil {
		return false
	}
	cancel()
	f.r.track.lost(id, "its subagent crashed, and nobody noticed")
	return true
}
