package recovery_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/simulate"
	"github.com/failbus/failbus/pkg/events"
)

// The eight-hour outage story on the virtual clock, built as input records so the same
// lines feed the core here, the engine and `failbus simulate`.

// Story is one timed input.
type storyLine struct {
	at time.Time
	in recovery.Input
}

var (
	t0        = time.Date(2026, 3, 2, 0, 7, 0, 0, time.UTC) // outage starts
	recovered = t0.Add(8 * time.Hour)                       // 08:07
)

const down = "openai"

func ms(t time.Time) events.Time { return events.At(t) }

// eightHourStory returns the inputs, in time order, and what must happen.
func eightHourStory(nTasks int) []storyLine {
	var lines []storyLine
	add := func(at time.Time, in recovery.Input) { lines = append(lines, storyLine{at, in}) }
	hb := func(at time.Time, agent, sub, provider, task, status string, interval time.Duration) {
		add(at, recovery.Input{Heartbeat: &events.Heartbeat{At: ms(at), Agent: agent, Subagent: sub, Provider: provider, TaskID: task, Status: status, IntervalMS: interval.Milliseconds()}})
	}
	task := func(at time.Time, id, agent, provider string) {
		add(at, recovery.Input{Task: &events.Task{ID: id, At: ms(at), Agent: agent, Provider: provider, Kind: "work", Payload: mustPayload(id)}})
	}
	before := t0.Add(-2 * time.Hour)

	// Crons, declared three hours before.
	spec := func(agent, name, schedule, tz, provider, mode string) {
		add(t0.Add(-3*time.Hour), recovery.Input{CronSpec: &events.CronSpec{At: ms(t0.Add(-3 * time.Hour)), Agent: agent, Cron: name, Schedule: schedule, Timezone: tz, Provider: provider, Catchup: mode}})
	}
	spec("coord", "digest", "0 * * * *", "", down, "")                   // latest (default)
	spec("coord", "report", "30 */2 * * *", "", down, events.CatchupAll) // all, some outside 6h
	spec("coord", "cleanup", "15 * * * *", "", down, events.CatchupNone) // none
	spec("coord", "sync", "0 */4 * * *", "", down, events.CatchupAll)    // 04:00 succeeded in the outage
	spec("coord", "standup", "0 9 * * *", "Europe/Berlin", "", "")       // 09:00 Berlin = 08:00 UTC; no provider = every provider
	spec("coord", "poll", "@every 3h", "", down, events.CatchupLatest)   // from its first run
	spec("coord", "claude-digest", "0 * * * *", "", "anthropic", "")     // another provider
	add(t0.Add(-2*time.Hour-7*time.Minute), recovery.Input{CronRun: &events.CronRun{At: ms(t0.Add(-2 * time.Hour)), Agent: "coord", Cron: "poll", ScheduledAt: ms(t0.Add(-2 * time.Hour)), Status: events.CronOK, Provider: down}})

	// 20 subagents. Tasks of the running ones on openai were dispatched
	// through the bus before the outage (attempt 1).
	for i := range 5 { // stale: beat until shortly after the outage began, then nothing
		task(before, fmt.Sprintf("job-stale-%d", i), "coord", down)
		hb(before, "coord", fmt.Sprintf("stale-%d", i), down, fmt.Sprintf("job-stale-%d", i), "", 10*time.Second)
		hb(t0.Add(5*time.Minute), "coord", fmt.Sprintf("stale-%d", i), down, fmt.Sprintf("job-stale-%d", i), "", 10*time.Second)
	}
	for i := range 2 { // slow but heartbeating: every 30 minutes, all through
		task(before, fmt.Sprintf("job-slow-%d", i), "coord", down)
		for at := before; at.Before(recovered); at = at.Add(30 * time.Minute) {
			hb(at.Add(time.Duration(i)*time.Minute), "coord", fmt.Sprintf("slow-%d", i), down, fmt.Sprintf("job-slow-%d", i), "", 30*time.Minute)
		}
	}
	for i := range 4 { // done during the outage
		hb(before, "coord", fmt.Sprintf("done-%d", i), down, "", "", 10*time.Second)
		hb(t0.Add(time.Duration(i+1)*time.Minute), "coord", fmt.Sprintf("done-%d", i), down, "", events.HeartbeatDone, 10*time.Second)
	}
	for i := range 3 { // failed during the outage
		hb(before, "coord", fmt.Sprintf("failed-%d", i), down, "", "", 10*time.Second)
		hb(t0.Add(time.Duration(i+1)*time.Minute), "coord", fmt.Sprintf("failed-%d", i), down, "", events.HeartbeatFailed, 10*time.Second)
	}
	for i := range 6 { // on another provider, stale too: not this checklist's business
		hb(before, "helper", fmt.Sprintf("claude-%d", i), "anthropic", "", "", 10*time.Second)
	}

	// Agents that hold on the provider (probe targets).
	for _, a := range []string{"coord", "helper"} {
		add(t0.Add(time.Minute), recovery.Input{Decision: &events.Decision{OutcomeID: "o-" + a, At: ms(t0.Add(time.Minute)), Agent: a, Action: events.ActionWaitProvider, Provider: down}})
	}

	// The outage.
	add(t0, recovery.Input{Health: &events.Health{At: ms(t0), Provider: down, State: events.HealthOutage, Reason: "every profile fails"}})
	// A cron run that succeeded during the outage (the 04:00 sync).
	add(t0.Add(3*time.Hour+54*time.Minute), recovery.Input{CronRun: &events.CronRun{At: ms(t0.Add(3*time.Hour + 54*time.Minute)), Agent: "coord", Cron: "sync", ScheduledAt: ms(t0.Add(3*time.Hour + 53*time.Minute)), Status: events.CronOK, Provider: down}})
	// Writes.
	wr := func(at time.Time, agent, key, provider string, ok bool) {
		w := &events.Write{At: ms(at), Agent: agent, Key: key, OK: ok, Provider: provider}
		if !ok {
			w.Error = "fetch failed"
		}
		add(at, recovery.Input{Write: w})
	}
	wr(t0.Add(-time.Hour), "coord", "memory/old.md", down, false)            // failed before the outage: not ours
	wr(t0.Add(time.Hour), "coord", "memory/2026-03-02.md", down, false)      // failed, never rewritten → check
	wr(t0.Add(2*time.Hour), "coord", "memory/lessons.md", down, false)       // failed ...
	wr(t0.Add(3*time.Hour), "coord", "memory/lessons.md", down, true)        // ... rewritten later: no check
	wr(t0.Add(4*time.Hour), "helper", "notes/today.md", "", false)           // no provider: every provider's
	wr(t0.Add(5*time.Hour), "helper", "notes/claude.md", "anthropic", false) // another provider

	// nTasks tasks queued during the outage, 10 agents, interleaved.
	for i := range nTasks {
		at := t0.Add(time.Hour + time.Duration(i)*time.Minute)
		task(at, fmt.Sprintf("q-%03d", i), fmt.Sprintf("worker-%d", i%10), down)
	}

	// Recovery: the scope's streak, then recovered.
	add(recovered.Add(-2*time.Minute), recovery.Input{Health: &events.Health{At: ms(recovered.Add(-2 * time.Minute)), Provider: down, State: events.HealthDegraded, Reason: "recovering"}})
	add(recovered, recovery.Input{Health: &events.Health{At: ms(recovered), Provider: down, State: events.HealthRecovered, Reason: "3 successes"}})
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at.Before(lines[j].at) })
	return lines
}

func mustPayload(id string) events.Raw {
	var r events.Raw
	if err := r.UnmarshalJSON([]byte(`{"task":"` + id + `","n":1}`)); err != nil {
		panic(err)
	}
	return r
}

// runStory feeds the story and ticks a minute past recovery.
func runStory(t *testing.T, cfg recovery.Config) []simulate.Output {
	t.Helper()
	ctx := context.Background()
	sim, err := simulate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out []simulate.Output
	for _, l := range eightHourStory(200) {
		o, err := sim.Step(ctx, l.in, l.at)
		if err != nil {
			t.Fatalf("step at %s: %v", l.at, err)
		}
		out = append(out, o...)
	}
	o, err := sim.Tick(ctx, recovered.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	return append(out, o...)
}

func TestEightHourOutageStory(t *testing.T) {
	cfg := recovery.DefaultConfig()
	out := runStory(t, cfg)

	var dispatches []*events.Dispatch
	var kills, reruns, checks, probes []*events.Control
	var records []*events.Recovery
	var notes []*events.Notification
	for _, o := range out {
		switch m := o.Msg.(type) {
		case *events.Dispatch:
			dispatches = append(dispatches, m)
		case *events.Control:
			switch m.Action {
			case events.ControlKill:
				kills = append(kills, m)
			case events.ControlRunCron:
				reruns = append(reruns, m)
			case events.ControlCheckWrite:
				checks = append(checks, m)
			case events.ControlProbe:
				probes = append(probes, m)
			}
		case *events.Recovery:
			records = append(records, m)
		case *events.Notification:
			notes = append(notes, m)
		}
	}

	// Exactly the 5 stale subagents are killed, no other.
	var killed []string
	for _, k := range kills {
		killed = append(killed, k.Subagent+"/"+k.TaskID)
		if !k.At.Equal(recovered) {
			t.Errorf("kill at %s, want at recovery %s", k.At, recovered)
		}
	}
	want := []string{"stale-0/job-stale-0", "stale-1/job-stale-1", "stale-2/job-stale-2", "stale-3/job-stale-3", "stale-4/job-stale-4"}
	if !slices.Equal(killed, want) {
		t.Errorf("killed %v, want %v", killed, want)
	}

	// Crons: each in-window time re-run once, the rest listed with why.
	var rerun []string
	for _, r := range reruns {
		rerun = append(rerun, r.Cron+"@"+r.ScheduledAt.UTC().Format("15:04"))
	}
	wantRerun := []string{
		"digest@08:00",                                 // latest: the newest of 03:00..08:00
		"poll@07:07",                                   // @every 3h from its first run at 22:07: 01:07, 04:07, 07:07 → latest
		"report@02:30", "report@04:30", "report@06:30", // all, oldest first; 00:30 is outside 6 h
		"standup@08:00", // 09:00 Berlin
		"sync@08:00",    // 04:00 ran ok during the outage
	}
	if !slices.Equal(rerun, wantRerun) {
		t.Errorf("re-run %v, want %v", rerun, wantRerun)
	}
	recs := map[string]*events.Recovery{}
	var steps []string
	for _, r := range records {
		recs[r.Step] = r
		steps = append(steps, r.Step)
		if r.RecoveryID != down+":"+fmt.Sprint(t0.UnixMilli()) || !r.OutageStartedAt.Equal(t0) || !r.RecoveredAt.Equal(recovered) {
			t.Errorf("record %s: id %s, outage %s–%s", r.Step, r.RecoveryID, r.OutageStartedAt, r.RecoveredAt)
		}
	}
	if !slices.Equal(steps, events.Steps) {
		t.Fatalf("records %v, want one per step in order %v", steps, events.Steps)
	}
	missed := map[string]string{}
	for _, m := range recs[events.StepCrons].CronsMissed {
		missed[m.Cron+"@"+m.ScheduledAt.UTC().Format("15:04")] = m.Why
	}
	wantMissed := map[string]string{
		"digest@01:00": "outside", "digest@02:00": "outside",
		"digest@03:00": "latest", "digest@04:00": "latest", "digest@05:00": "latest", "digest@06:00": "latest", "digest@07:00": "latest",
		"poll@01:07": "outside", "poll@04:07": "latest",
		"report@00:30":  "outside",
		"cleanup@00:15": "outside", "cleanup@01:15": "outside",
		"cleanup@02:15": "none", "cleanup@03:15": "none", "cleanup@04:15": "none", "cleanup@05:15": "none", "cleanup@06:15": "none", "cleanup@07:15": "none",
	}
	if len(missed) != len(wantMissed) {
		t.Errorf("missed %d: %v\nwant %d", len(missed), missed, len(wantMissed))
	}
	for k, w := range wantMissed {
		why, ok := missed[k]
		switch {
		case !ok:
			t.Errorf("%s not listed as missed", k)
		case w == "outside" && !contains(why, "outside the catch-up window"),
			w == "latest" && !contains(why, "catchup latest"),
			w == "none" && !contains(why, "catchup none"):
			t.Errorf("%s missed because %q, want %s", k, why, w)
		}
	}
	if _, ok := missed["sync@04:00"]; ok {
		t.Errorf("sync@04:00 ran ok during the outage and must not be listed")
	}

	// Only the unrewritten writes of the provider are checked.
	var checked []string
	for _, c := range checks {
		checked = append(checked, c.Agent+":"+c.Key)
	}
	if want := []string{"coord:memory/2026-03-02.md", "helper:notes/today.md"}; !slices.Equal(checked, want) {
		t.Errorf("checked writes %v, want %v", checked, want)
	}

	// Tasks: the killed subagents' tasks as attempt 2; the 200 held ones
	// once each, after recovery, none during the outage, each agent's in
	// submission order, at most drain_rate per second.
	seen := map[string]int{}
	var redis []string
	lastByAgent := map[string]int{}
	var released []*events.Dispatch
	for _, d := range dispatches {
		seen[fmt.Sprintf("%s#%d", d.TaskID, d.Attempt)]++
		switch {
		case d.Attempt == 2:
			redis = append(redis, d.TaskID)
			if string(d.Payload) != string(mustPayload(d.TaskID)) {
				t.Errorf("redispatch %s lost its payload", d.TaskID)
			}
		case len(d.TaskID) > 2 && d.TaskID[:2] == "q-":
			released = append(released, d)
			if d.At.Before(recovered) {
				t.Errorf("task %s dispatched at %s, during the outage", d.TaskID, d.At)
			}
			var n int
			fmt.Sscanf(d.TaskID, "q-%d", &n)
			if prev, ok := lastByAgent[d.Agent]; ok && prev > n {
				t.Errorf("%s: task q-%03d released after q-%03d", d.Agent, n, prev)
			}
			lastByAgent[d.Agent] = n
		}
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("dispatch %s sent %d times", k, n)
		}
	}
	if want := []string{"job-stale-0", "job-stale-1", "job-stale-2", "job-stale-3", "job-stale-4"}; !slices.Equal(redis, want) {
		t.Errorf("redispatched %v, want %v", redis, want)
	}
	if len(released) != 200 {
		t.Errorf("released %d held tasks, want 200", len(released))
	}
	gap := time.Duration(float64(time.Second) / cfg.DrainRate)
	for i := 1; i < len(released); i++ {
		if d := released[i].At.Sub(released[i-1].At.Time); d < gap {
			t.Errorf("released %s %s after the previous one, faster than drain_rate %v/s", released[i].TaskID, d, cfg.DrainRate)
			break
		}
	}
	if last := released[len(released)-1].At.Sub(recovered); last != 199*gap {
		t.Errorf("last release %s after recovery, want %s (200 at %v/s)", last, 199*gap, cfg.DrainRate)
	}
	if r := recs[events.StepRelease]; r.Released != 200 || !r.Done {
		t.Errorf("release record: released %d, done %v", r.Released, r.Done)
	}
	if r := recs[events.StepRedispatch]; len(r.Redispatched) != 5 || r.Redispatched[0].Attempt != 2 {
		t.Errorf("redispatch record %+v", r.Redispatched)
	}
	if r := recs[events.StepSubagents]; len(r.Subagents) != 7 {
		t.Errorf("subagents step lists %d running subagents of %s, want 7 (5 stale, 2 slow): %+v", len(r.Subagents), down, r.Subagents)
	}

	// One recovery notification.
	if len(notes) != 1 || notes[0].DedupeKey != "recovery:openai:"+fmt.Sprint(t0.UnixMilli()) || notes[0].Severity != events.SeverityNormal {
		t.Fatalf("notifications %+v, want one normal recovery:openai:<start>", notes)
	}
	// Probes every 30 s through the outage, to agents that hold.
	if n := int(8 * time.Hour / cfg.ProbeInterval); len(probes) != n-1 && len(probes) != n {
		t.Errorf("%d probes over 8 h, want one per %s (%d)", len(probes), cfg.ProbeInterval, n)
	}
	for _, p := range probes {
		if p.Agent != "coord" && p.Agent != "helper" || p.Provider != down {
			t.Fatalf("probe %+v, want one to a holding agent", p)
		}
		if p.At.After(recovered) {
			t.Fatalf("probe at %s after recovery", p.At)
		}
	}
	t.Logf("%d outputs: %d dispatches (%d released, %d redispatched), %d kills, %d cron re-runs, %d missed, %d write checks, %d probes, %d records, %d notification",
		len(out), len(dispatches), len(released), len(redis), len(kills), len(reruns), len(recs[events.StepCrons].CronsMissed), len(checks), len(probes), len(records), len(notes))
}

func contains(s, sub string) bool { return len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0) }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}
