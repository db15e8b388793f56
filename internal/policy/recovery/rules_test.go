package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/memstore"
	"github.com/failbus/failbus/internal/policy/recovery/simulate"
	"github.com/failbus/failbus/pkg/events"
)

func health(at time.Time, state string) recovery.Input {
	return recovery.Input{Health: &events.Health{At: events.At(at), Provider: down, State: state}}
}

func taskIn(at time.Time, id, agent string) recovery.Input {
	return recovery.Input{Task: &events.Task{ID: id, At: events.At(at), Agent: agent, Provider: down}}
}

type feed struct {
	t   *testing.T
	sim *simulate.Sim
	out []simulate.Output
}

func newFeed(t *testing.T, cfg recovery.Config) *feed {
	sim, err := simulate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &feed{t: t, sim: sim}
}

func (f *feed) step(at time.Time, in recovery.Input) {
	f.t.Helper()
	o, err := f.sim.Step(context.Background(), in, at)
	if err != nil {
		f.t.Fatalf("step at %s: %v", at, err)
	}
	f.out = append(f.out, o...)
}

func (f *feed) tick(at time.Time) {
	f.t.Helper()
	o, err := f.sim.Tick(context.Background(), at)
	if err != nil {
		f.t.Fatal(err)
	}
	f.out = append(f.out, o...)
}

func (f *feed) count(typ string) (n int) {
	for _, o := range f.out {
		if o.Type == typ {
			n++
		}
	}
	return n
}

// Flapping (the scope's hysteresis at work): outage, then degraded and
// outage again every 2 s for 30 s. Nothing is released and no checklist
// starts until recovered; one episode, one run, one notification.
func TestFlappingStartsNoDrainUntilRecovered(t *testing.T) {
	f := newFeed(t, recovery.DefaultConfig())
	f.step(t0, health(t0, events.HealthOutage))
	for i := range 10 {
		f.step(t0.Add(time.Duration(i)*time.Second), taskIn(t0.Add(time.Duration(i)*time.Second), fmt.Sprintf("t%d", i), "a"))
	}
	for s := 2; s <= 30; s += 2 {
		state := events.HealthDegraded
		if s%4 == 0 {
			state = events.HealthOutage
		}
		f.step(t0.Add(time.Duration(s)*time.Second), health(t0.Add(time.Duration(s)*time.Second), state))
	}
	f.tick(t0.Add(40 * time.Second))
	if n := f.count(simulate.OutputDispatch) + f.count(simulate.OutputRecovery); n != 0 {
		t.Fatalf("%d dispatches or records while flapping", n)
	}
	r, _, _ := f.sim.Store.LoadProvider(context.Background(), down)
	if len(r.Episodes) != 1 || r.Episodes[0].OutageStartedAt.Time != t0 {
		t.Fatalf("episodes %+v, want the one outage that began at %s", r.Episodes, t0)
	}
	f.step(t0.Add(45*time.Second), health(t0.Add(45*time.Second), events.HealthRecovered))
	f.tick(t0.Add(50 * time.Second))
	if n := f.count(simulate.OutputDispatch); n != 10 {
		t.Fatalf("%d dispatches after recovery, want 10", n)
	}
	if n := f.count(simulate.OutputNotification); n != 1 {
		t.Fatalf("%d notifications, want 1", n)
	}
	if n := f.count(simulate.OutputRecovery); n != len(events.Steps) {
		t.Fatalf("%d records, want %d", n, len(events.Steps))
	}
}

// The provider goes down again while held tasks are being released: the
// release stops at once and resumes after the second outage; each task
// still goes out once, in order, and each outage gets its own checklist.
func TestOutageDuringReleasePausesIt(t *testing.T) {
	cfg := recovery.DefaultConfig()
	cfg.DrainRate = 1
	f := newFeed(t, cfg)
	f.step(t0, health(t0, events.HealthOutage))
	for i := range 20 {
		f.step(t0.Add(time.Second), taskIn(t0.Add(time.Second), fmt.Sprintf("t%02d", i), "a"))
	}
	r1 := t0.Add(time.Minute)
	f.step(r1, health(r1, events.HealthRecovered))
	t2 := r1.Add(5500 * time.Millisecond) // 6 released (1/s from r1)
	f.step(t2, health(t2, events.HealthOutage))
	f.tick(t2.Add(time.Hour))
	if n := f.count(simulate.OutputDispatch); n != 6 {
		t.Fatalf("%d dispatches before the second outage ended, want 6", n)
	}
	r2 := t2.Add(time.Hour)
	f.step(r2, health(r2, events.HealthRecovered))
	f.tick(r2.Add(time.Minute))
	var order []string
	for _, o := range f.out {
		if d, ok := o.Msg.(*events.Dispatch); ok {
			order = append(order, d.TaskID)
			if d.At.After(t2) && d.At.Before(r2) {
				t.Errorf("%s dispatched at %s, during the second outage", d.TaskID, d.At)
			}
		}
	}
	for i, id := range order {
		if id != fmt.Sprintf("t%02d", i) {
			t.Fatalf("dispatch order %v", order)
		}
	}
	if len(order) != 20 {
		t.Fatalf("%d dispatches, want 20", len(order))
	}
	if n := f.count(simulate.OutputNotification); n != 2 {
		t.Fatalf("%d notifications, want one per outage (2)", n)
	}
	var finals []string
	for _, o := range f.out {
		if r, ok := o.Msg.(*events.Recovery); ok && r.Done {
			finals = append(finals, fmt.Sprintf("%s released %d", r.RecoveryID, r.Released))
		}
	}
	want := []string{
		fmt.Sprintf("%s released 20", recovery.RunID(down, t0)),
		fmt.Sprintf("%s released 0", recovery.RunID(down, t2)),
	}
	if fmt.Sprint(finals) != fmt.Sprint(want) {
		t.Fatalf("final records %v, want %v", finals, want)
	}
}

// A task whose provider is up goes out at once as attempt 1, also when the
// same id comes again after the stream's dedupe window (the ledger).
func TestHealthyTaskDispatchedAtOnceOncePerID(t *testing.T) {
	f := newFeed(t, recovery.DefaultConfig())
	f.step(t0, taskIn(t0, "x", "a"))
	f.step(t0.Add(time.Hour), taskIn(t0.Add(time.Hour), "x", "a"))
	if n := f.count(simulate.OutputDispatch); n != 1 {
		t.Fatalf("%d dispatches, want 1", n)
	}
	d := f.out[0].Msg.(*events.Dispatch)
	if d.Attempt != 1 || !d.At.Equal(t0) || f.out[0].ID != recovery.DispatchID("x", 1) {
		t.Fatalf("dispatch %+v id %s", d, f.out[0].ID)
	}
}

// A task without a provider belongs to every provider: held while any is
// down, released once all are back.
func TestTaskWithoutProviderWaitsForEveryProvider(t *testing.T) {
	f := newFeed(t, recovery.DefaultConfig())
	f.step(t0, health(t0, events.HealthOutage))
	f.step(t0.Add(time.Second), recovery.Input{Task: &events.Task{ID: "anywhere", Agent: "a"}})
	f.tick(t0.Add(time.Hour))
	if n := f.count(simulate.OutputDispatch); n != 0 {
		t.Fatalf("dispatched during an outage")
	}
	f.step(t0.Add(time.Hour), health(t0.Add(time.Hour), events.HealthRecovered))
	f.tick(t0.Add(time.Hour + time.Minute))
	if n := f.count(simulate.OutputDispatch); n != 1 {
		t.Fatalf("%d dispatches after recovery, want 1", n)
	}
}

// Input the core cannot use is an error naming the field, wrapping
// ErrInvalid; the core goes on.
func TestBadInputNamesTheField(t *testing.T) {
	sim, _ := simulate.New(recovery.DefaultConfig())
	for _, c := range []struct {
		in    recovery.Input
		field string
	}{
		{recovery.Input{Heartbeat: &events.Heartbeat{Agent: "a"}}, "subagent"},
		{recovery.Input{CronSpec: &events.CronSpec{Agent: "a", Cron: "c", Schedule: "at dawn"}}, "schedule"},
		{recovery.Input{CronSpec: &events.CronSpec{Agent: "a", Cron: "c", Schedule: "@daily", Catchup: "most"}}, "catchup"},
		{recovery.Input{Task: &events.Task{Agent: "a"}}, "id"},
	} {
		_, err := sim.Step(context.Background(), c.in, t0)
		var fe *events.FieldError
		if !errors.Is(err, recovery.ErrInvalid) || !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%+v: %v, want ErrInvalid naming %q", c.in, err, c.field)
		}
	}
	f := &feed{t: t, sim: sim}
	f.step(t0, taskIn(t0, "ok", "a"))
	if f.count(simulate.OutputDispatch) != 1 {
		t.Fatal("the core stopped after bad input")
	}
}

// Replicas: several cores on one store, advancing the same provider at the
// same time, send each command once (compare-and-set and the ledger; no
// lease here, so they really race).
func TestRacingCoresSendEachCommandOnce(t *testing.T) {
	ctx := context.Background()
	cfg := recovery.DefaultConfig()
	cfg.DrainRate = 1000
	mem, rec := memstore.New(), &simulate.Recorder{}
	var cores []*recovery.Core
	for range 4 {
		c, err := recovery.New(cfg, mem, rec, recovery.Options{})
		if err != nil {
			t.Fatal(err)
		}
		cores = append(cores, c)
	}
	lines := eightHourStory(200)
	var end time.Time
	for _, l := range lines {
		if l.in.Health != nil && l.in.Health.State == events.HealthRecovered {
			end = l.at
			break
		}
		if err := cores[0].Step(ctx, l.in, l.at); err != nil {
			t.Fatal(err)
		}
	}
	if err := cores[0].Step(ctx, health(end, events.HealthRecovered), end); err != nil {
		t.Fatal(err)
	}
	rec.Take()
	var wg sync.WaitGroup
	for _, c := range cores {
		wg.Go(func() {
			for ms := range 1000 {
				if err := c.Advance(ctx, down, end.Add(time.Duration(ms)*time.Millisecond)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	out := rec.Take()
	seen := map[string]int{}
	dispatches := 0
	var last *events.Dispatch
	for _, o := range out {
		seen[o.ID]++
		if o.Type == simulate.OutputDispatch {
			dispatches++
		}
		// The releases (attempt 1; the redispatches are attempt 2), in
		// the order stored, are 1/drain_rate apart, whichever core sent
		// them.
		if d, ok := o.Msg.(*events.Dispatch); ok && d.Attempt == 1 {
			if last != nil && d.At.Sub(last.At.Time) < time.Second/time.Duration(cfg.DrainRate) {
				t.Errorf("%s released %s after %s", d.TaskID, d.At.Sub(last.At.Time), last.TaskID)
			}
			last = d
		}
	}
	if dispatches != 205 {
		t.Errorf("%d dispatches, want 205 (200 released, 5 redispatched)", dispatches)
	}
	if n := len(out); n != len(seen) {
		t.Errorf("%d outputs for %d ids", n, len(seen))
	}
	t.Logf("%d commands sent once each by 4 racing cores (%d publish attempts)", len(out), rec.Attempts())
}

// A subagent and a write without a provider belong to every provider's
// checklist: with two providers down at once, whichever recovers first
// kills the subagent, re-dispatches its task and checks the write; the
// other's run does none of it again.
func TestTwoOutagesKillASubagentWithoutProviderOnce(t *testing.T) {
	f := newFeed(t, recovery.DefaultConfig())
	f.step(t0.Add(-time.Hour), recovery.Input{Task: &events.Task{ID: "job", At: events.At(t0.Add(-time.Hour)), Agent: "a"}})
	f.step(t0.Add(-time.Hour), recovery.Input{Heartbeat: &events.Heartbeat{At: events.At(t0.Add(-time.Hour)), Agent: "a", Subagent: "s", TaskID: "job", IntervalMS: 1000}})
	for _, p := range []string{"openai", "anthropic"} {
		f.step(t0, recovery.Input{Health: &events.Health{At: events.At(t0), Provider: p, State: events.HealthOutage}})
	}
	f.step(t0.Add(time.Minute), recovery.Input{Write: &events.Write{At: events.At(t0.Add(time.Minute)), Agent: "a", Key: "m.md", Error: "down"}})
	for i, p := range []string{"openai", "anthropic"} {
		at := t0.Add(time.Duration(i+1) * time.Hour)
		f.step(at, recovery.Input{Health: &events.Health{At: events.At(at), Provider: p, State: events.HealthRecovered}})
	}
	f.tick(t0.Add(3 * time.Hour))
	count := map[string]int{}
	for _, o := range f.out {
		switch m := o.Msg.(type) {
		case *events.Control:
			count[m.Action]++
		case *events.Dispatch:
			count[fmt.Sprintf("dispatch#%d", m.Attempt)]++
		}
	}
	if count[events.ControlKill] != 1 || count[events.ControlCheckWrite] != 1 || count["dispatch#2"] != 1 || count["dispatch#3"] != 0 {
		t.Fatalf("commands %v, want one kill, one check_write, one redispatch (attempt 2)", count)
	}
	if n := f.count(simulate.OutputNotification); n != 2 {
		t.Fatalf("%d notifications, want one per provider", n)
	}
}

// Probe targets (rule 3): the agents that called the provider, read when a
// probe is due — those holding on it first (their latest decision, for
// whichever provider, is wait_provider on it), then the others, most
// recent first, in turn. An agent whose latest decision moved it to
// another provider, or on from waiting, does not hold; one that never
// called the provider is not asked.
func TestProbeTargetsHoldersFirstThenMostRecent(t *testing.T) {
	cfg := recovery.Config{ProbeInterval: 10 * time.Second}
	f := newFeed(t, cfg)
	t0 := time.Date(2026, 3, 2, 1, 0, 0, 0, time.UTC)
	outcome := func(at time.Time, agent, provider string) {
		f.step(at, recovery.Input{Outcome: &events.Outcome{ID: "o-" + agent + provider, At: events.At(at), Agent: agent, Provider: provider}})
	}
	decide := func(at time.Time, agent, action, provider string) {
		f.step(at, recovery.Input{Decision: &events.Decision{OutcomeID: "d-" + agent, At: events.At(at), Agent: agent, Action: action, Provider: provider}})
	}
	outcome(t0.Add(-3*time.Minute), "busy", down)
	outcome(t0.Add(-2*time.Minute), "idle", down)
	outcome(t0.Add(-90*time.Second), "switcher", down)
	outcome(t0.Add(-80*time.Second), "elsewhere", "anthropic")
	decide(t0.Add(-70*time.Second), "busy", events.ActionWaitProvider, down)
	decide(t0.Add(-60*time.Second), "busy", events.ActionRetry, down)
	decide(t0.Add(-50*time.Second), "idle", events.ActionWaitProvider, down)
	decide(t0.Add(-45*time.Second), "switcher", events.ActionWaitProvider, down)
	decide(t0.Add(-40*time.Second), "switcher", events.ActionWaitProvider, "anthropic")
	decide(t0.Add(-30*time.Second), "elsewhere", events.ActionWaitProvider, down)
	f.step(t0, health(t0, events.HealthOutage))
	f.tick(t0.Add(45 * time.Second))

	var got []string
	for _, o := range f.out {
		if c, ok := o.Msg.(*events.Control); ok && c.Action == events.ControlProbe {
			got = append(got, c.Agent)
		}
	}
	if want := []string{"idle", "switcher", "busy", "idle"}; !slices.Equal(got, want) {
		t.Errorf("probes went to %v, want %v", got, want)
	}
}

// brokenUsage is a store whose probe-target reads fail.
type brokenUsage struct {
	*memstore.Store
	recentFails, holdingFails bool
}

func (b brokenUsage) RecentUsers(ctx context.Context, provider string, max int) ([]recovery.User, error) {
	if b.recentFails {
		return nil, errors.New("no direct gets")
	}
	return b.Store.RecentUsers(ctx, provider, max)
}

func (b brokenUsage) LatestDecisions(ctx context.Context, agents []string) (map[string]events.Decision, error) {
	if b.holdingFails {
		return nil, errors.New("timed out")
	}
	return b.Store.LatestDecisions(ctx, agents)
}

// An outage is probed even when the probe targets cannot be read: the
// probe goes to an agent that reported itself (a heartbeat), or — when
// only the holding is unknown — to the most recent user, and the failure
// is reported (Options.UsageError), never returned.
func TestProbeTargetsUnreadableStillProbe(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 3, 2, 1, 0, 0, 0, time.UTC)
	cfg := recovery.Config{ProbeInterval: 10 * time.Second}
	for _, tt := range []struct {
		name  string
		store brokenUsage
		want  string
	}{
		{"recent users fail", brokenUsage{recentFails: true}, "beating"},
		{"holding fails", brokenUsage{holdingFails: true}, "caller"},
		{"nothing fails", brokenUsage{}, "holder"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.store
			st.Store = memstore.New()
			rec := &simulate.Recorder{}
			var reported []string
			c, err := recovery.New(cfg, st, rec, recovery.Options{UsageError: func(p string, err error) { reported = append(reported, p+": "+err.Error()) }})
			if err != nil {
				t.Fatal(err)
			}
			step := func(at time.Time, in recovery.Input) {
				t.Helper()
				if err := c.Step(ctx, in, at); err != nil {
					t.Fatal(err)
				}
			}
			step(t0.Add(-3*time.Minute), recovery.Input{Heartbeat: &events.Heartbeat{At: events.At(t0.Add(-3 * time.Minute)), Agent: "beating", Subagent: "s1", Provider: down}})
			step(t0.Add(-2*time.Minute), recovery.Input{Outcome: &events.Outcome{ID: "o1", Agent: "holder", Provider: down}})
			step(t0.Add(-time.Minute), recovery.Input{Outcome: &events.Outcome{ID: "o2", Agent: "caller", Provider: down}})
			step(t0.Add(-time.Minute), recovery.Input{Decision: &events.Decision{OutcomeID: "o1", Agent: "holder", Action: events.ActionWaitProvider, Provider: down}})
			step(t0, health(t0, events.HealthOutage))
			if err := c.Advance(ctx, down, t0.Add(cfg.ProbeInterval)); err != nil {
				t.Fatalf("Advance returned %v; a probe-target read must not stop the probe", err)
			}
			var probes []string
			for _, o := range rec.Take() {
				if ctl, ok := o.Msg.(*events.Control); ok && ctl.Action == events.ControlProbe {
					probes = append(probes, ctl.Agent)
				}
			}
			if !slices.Equal(probes, []string{tt.want}) {
				t.Errorf("probes to %v, want [%s]", probes, tt.want)
			}
			if broken := st.recentFails || st.holdingFails; broken != (len(reported) == 1) {
				t.Errorf("reported %v; want one report exactly when a read failed", reported)
			}
		})
	}
}

// One live dispatch per task: tasks held during an outage whose subagents
// (started on them by their agent) went silent are redispatched by the
// checklist as attempt 2, with the payload they were submitted with, and
// the release that follows passes their held copies over: no task is
// dispatched twice (once it was 293 of 1,000: attempt 2, then attempt 1).
// A heartbeat naming a task id another agent submitted redispatches
// nothing of that agent's.
func TestRedispatchedHeldTaskIsNotReleasedAgain(t *testing.T) {
	const n = 20
	f := newFeed(t, recovery.DefaultConfig())
	f.step(t0, health(t0, events.HealthOutage))
	for i := range n {
		at := t0.Add(time.Duration(i+1) * time.Second)
		in := taskIn(at, fmt.Sprintf("job-%d", i), "a")
		in.Task.Payload = mustPayload(fmt.Sprintf("job-%d", i))
		f.step(at, in)
		if i%2 == 0 { // half of them a subagent works on, then goes silent
			f.step(at, recovery.Input{Heartbeat: &events.Heartbeat{At: events.At(at), Agent: "a", Subagent: fmt.Sprintf("s%d", i),
				Provider: down, TaskID: fmt.Sprintf("job-%d", i), IntervalMS: 1000, Checkpoint: fmt.Sprintf("ckpt-%d", i)}})
		}
	}
	// Agent b's silent subagent names a's task: b's heartbeat is about b.
	f.step(t0.Add(time.Minute), recovery.Input{Heartbeat: &events.Heartbeat{At: events.At(t0.Add(time.Minute)), Agent: "b", Subagent: "x",
		Provider: down, TaskID: "job-1", IntervalMS: 1000}})
	f.step(t0.Add(time.Hour), health(t0.Add(time.Hour), events.HealthRecovered))
	f.tick(t0.Add(2 * time.Hour))

	dispatches := map[string][]int{}
	for _, o := range f.out {
		d, ok := o.Msg.(*events.Dispatch)
		if !ok {
			continue
		}
		dispatches[d.Agent+"/"+d.TaskID] = append(dispatches[d.Agent+"/"+d.TaskID], d.Attempt)
		if d.Agent == "a" && string(d.Payload) != string(mustPayload(d.TaskID)) {
			t.Errorf("%s attempt %d carries payload %q, want the submitted one", d.TaskID, d.Attempt, d.Payload)
		}
		if want := "ckpt-" + strings.TrimPrefix(d.TaskID, "job-"); d.Agent == "a" && d.Attempt == 2 && d.Checkpoint != want {
			t.Errorf("%s attempt 2 carries checkpoint %q, want the killed subagent's last (%s)", d.TaskID, d.Checkpoint, want)
		}
	}
	for i := range n {
		id := fmt.Sprintf("a/job-%d", i)
		want := []int{1}
		if i%2 == 0 {
			want = []int{2}
		}
		if !slices.Equal(dispatches[id], want) {
			t.Errorf("%s dispatched as attempts %v, want %v", id, dispatches[id], want)
		}
	}
	if got := dispatches["b/job-1"]; len(got) != 1 || got[0] != 2 {
		t.Errorf("b's killed subagent's task: attempts %v, want one redispatch of its own (attempt 2, no payload)", got)
	}
}

// Replicas pace the release together: a replica whose clock reading is
// older (it read the clock before a slow round of other work) finishes
// the release of a held task another replica sent, and the next task
// still goes out no sooner than 1/drain_rate after it. Each release time
// is claimed with the task in one compare-and-set on the provider's
// record, so it does not matter which replica sends or records a release.
// (The two releases once went out at the same instant: the replica that
// moved the cursor set the next release time from its own, older, clock
// reading, not from the time of the release the stream stored.)
func TestRacingCoresPaceTheRelease(t *testing.T) {
	ctx := context.Background()
	cfg := recovery.DefaultConfig()
	cfg.DrainRate = 50
	interval := time.Second / 50
	mem, rec := memstore.New(), &simulate.Recorder{}
	late, err := recovery.New(cfg, mem, rec, recovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	recAt := t0.Add(time.Hour)
	var lateErr error
	lateRan := false
	first := recovery.DispatchID("held-00", 1)
	early, err := recovery.New(cfg, mem, rec, recovery.Options{Hook: func(point, what string) {
		// The first release is stored and in the ledger, its cursor not
		// moved yet: the other replica, whose clock reading is 100 ms
		// older, advances the provider now.
		if point == recovery.HookMarked && what == first && !lateRan {
			lateRan = true
			lateErr = late.Advance(ctx, down, recAt)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range heldThenRecovered(n, recAt) {
		if err := early.Step(ctx, in, in.At().Time); err != nil {
			t.Fatal(err)
		}
	}
	rec.Take()
	if err := early.Advance(ctx, down, recAt.Add(100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if !lateRan {
		t.Fatal("the first release never reached its ledger entry")
	}
	if lateErr != nil {
		t.Fatalf("the other replica: %v", lateErr)
	}
	// Both go on releasing, each with its own clock.
	for ms := 100; ms <= 1000; ms += 5 {
		for _, c := range []*recovery.Core{early, late} {
			if err := c.Advance(ctx, down, recAt.Add(time.Duration(ms)*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		}
	}
	var held []*events.Dispatch
	for _, o := range rec.Take() {
		if d, ok := o.Msg.(*events.Dispatch); ok {
			held = append(held, d)
		}
	}
	if len(held) != n {
		t.Fatalf("%d held tasks released, want %d", len(held), n)
	}
	for i, d := range held {
		if want := fmt.Sprintf("held-%02d", i); d.TaskID != want {
			t.Errorf("release %d is %s, want %s", i, d.TaskID, want)
		}
		if i == 0 {
			continue
		}
		if gap := d.At.Sub(held[i-1].At.Time); gap < interval {
			t.Errorf("%s released %s after %s, faster than drain_rate %g/s", d.TaskID, gap, held[i-1].TaskID, cfg.DrainRate)
		}
	}
}

// heldThenRecovered is the outage of the provider down at t0, n tasks
// held-00… submitted during it, and its recovery at recAt.
func heldThenRecovered(n int, recAt time.Time) []recovery.Input {
	steps := []recovery.Input{health(t0, events.HealthOutage)}
	for i := range n {
		steps = append(steps, taskIn(t0.Add(time.Minute), fmt.Sprintf("held-%02d", i), "a"))
	}
	return append(steps, health(recAt, events.HealthRecovered))
}

// A held task claimed without a release time (a record saved by a version
// that claimed only the task) is claimed again with one and released once,
// paced like the others.
func TestClaimWithoutReleaseTimeIsClaimedAgain(t *testing.T) {
	ctx := context.Background()
	cfg := recovery.DefaultConfig()
	cfg.DrainRate = 50
	interval := time.Second / 50
	mem, rec := memstore.New(), &simulate.Recorder{}
	c, err := recovery.New(cfg, mem, rec, recovery.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recAt := t0.Add(time.Hour)
	for _, in := range heldThenRecovered(3, recAt) {
		if err := c.Step(ctx, in, in.At().Time); err != nil {
			t.Fatal(err)
		}
	}
	rec.Take()
	if err := c.Advance(ctx, down, recAt); err != nil { // releases held-00
		t.Fatal(err)
	}
	r, rev, err := mem.LoadProvider(ctx, down)
	if err != nil {
		t.Fatal(err)
	}
	next, err := mem.TasksAfter(ctx, down, r.Queue.Cursor, r.Queue.LastSeq, 1)
	if err != nil || len(next) != 1 || next[0].Task.ID != "held-01" {
		t.Fatalf("next held task %+v, %v", next, err)
	}
	r.Queue.Sending = &recovery.Sending{Seq: next[0].Seq, Since: events.At(recAt.Add(interval))}
	if _, err := mem.SaveProvider(ctx, r, rev); err != nil {
		t.Fatal(err)
	}
	for ms := 20; ms <= 200; ms += 5 {
		if err := c.Advance(ctx, down, recAt.Add(time.Duration(ms)*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, o := range rec.Take() {
		if d, ok := o.Msg.(*events.Dispatch); ok {
			got = append(got, fmt.Sprintf("%s@%s", d.TaskID, d.At.Sub(recAt)))
		}
	}
	if want := []string{"held-00@0s", "held-01@20ms", "held-02@40ms"}; !slices.Equal(got, want) {
		t.Fatalf("released %v, want %v", got, want)
	}
}
