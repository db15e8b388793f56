package sim

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// The eight-hour outage story as `failbus simulate` input: a
// provider down 8 hours (three network failures open the outage, three
// successes over two minutes end it), 20 subagents (5 that die, 2 slow
// but beating, 4 done, 3 failed, 6 on another provider), crons in every
// catch-up mode (one with a time zone, one @every, one that ran ok during
// the outage, one on another provider), failed memory writes (one written
// again), 200 tasks queued. testdata/recovery-8h.jsonl is this file; the
// simulate command's test reads it too.

var updateStory = flag.Bool("update-story", false, "rewrite testdata/recovery-8h.jsonl from recoveryStory")

const storyFile = "testdata/recovery-8h.jsonl"

var (
	storyStart     = time.Date(2026, 3, 2, 0, 7, 0, 0, time.UTC)
	storyRecovered = storyStart.Add(8 * time.Hour)
)

// recoveryStory returns the story's lines, in time order.
func recoveryStory() []string {
	type line struct {
		at   time.Time
		text string
	}
	var lines []line
	ts := func(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }
	add := func(at time.Time, typ string, fields map[string]any) {
		fields["type"] = typ
		if _, ok := fields["at"]; !ok {
			fields["at"] = ts(at)
		}
		b, err := json.Marshal(fields)
		if err != nil {
			panic(err)
		}
		lines = append(lines, line{at, string(b)})
	}
	before := storyStart.Add(-2 * time.Hour)
	spec := func(name, schedule, tz, provider, mode string) {
		f := map[string]any{"agent": "coord", "cron": name, "schedule": schedule, "provider": provider}
		if tz != "" {
			f["timezone"] = tz
		}
		if mode != "" {
			f["catchup"] = mode
		}
		add(storyStart.Add(-3*time.Hour), "cron_spec", f)
	}
	spec("digest", "0 * * * *", "", "openai", "")
	spec("report", "30 */2 * * *", "", "openai", "all")
	spec("cleanup", "15 * * * *", "", "openai", "none")
	spec("sync", "0 */4 * * *", "", "openai", "all")
	spec("standup", "0 9 * * *", "Europe/Berlin", "", "")
	spec("poll", "@every 3h", "", "openai", "latest")
	spec("claude-digest", "0 * * * *", "", "anthropic", "")
	add(storyStart.Add(-2*time.Hour), "cron_run", map[string]any{"agent": "coord", "cron": "poll", "scheduled_at": ts(storyStart.Add(-2 * time.Hour)), "status": "ok", "provider": "openai"})

	hb := func(at time.Time, sub, provider, task, status string, iv time.Duration) {
		f := map[string]any{"agent": "coord", "subagent": sub, "provider": provider, "interval_ms": iv.Milliseconds()}
		if task != "" {
			f["task_id"] = task
		}
		if status != "" {
			f["status"] = status
		}
		add(at, "heartbeat", f)
	}
	task := func(at time.Time, id, agent string) {
		add(at, "task", map[string]any{"id": id, "agent": agent, "provider": "openai", "kind": "work", "payload": map[string]any{"task": id}})
	}
	for i := range 5 {
		id := fmt.Sprintf("job-stale-%d", i)
		task(before, id, "coord")
		hb(before, fmt.Sprintf("stale-%d", i), "openai", id, "", 10*time.Second)
		hb(storyStart.Add(5*time.Minute), fmt.Sprintf("stale-%d", i), "openai", id, "", 10*time.Second)
	}
	for i := range 2 {
		id := fmt.Sprintf("job-slow-%d", i)
		task(before, id, "coord")
		for at := before; at.Before(storyRecovered); at = at.Add(30 * time.Minute) {
			hb(at.Add(time.Duration(i)*time.Minute), fmt.Sprintf("slow-%d", i), "openai", id, "", 30*time.Minute)
		}
	}
	for i := range 4 {
		hb(before, fmt.Sprintf("done-%d", i), "openai", "", "", 10*time.Second)
		hb(storyStart.Add(time.Duration(i+1)*time.Minute), fmt.Sprintf("done-%d", i), "openai", "", "done", 10*time.Second)
	}
	for i := range 3 {
		hb(before, fmt.Sprintf("failed-%d", i), "openai", "", "", 10*time.Second)
		hb(storyStart.Add(time.Duration(i+1)*time.Minute), fmt.Sprintf("failed-%d", i), "openai", "", "failed", 10*time.Second)
	}
	for i := range 6 {
		hb(before, fmt.Sprintf("claude-%d", i), "anthropic", "", "", 10*time.Second)
	}

	// The outage: three network failures on the provider's one profile.
	for i, d := range []time.Duration{-2 * time.Second, -time.Second, 0} {
		add(storyStart.Add(d), "outcome", map[string]any{"id": fmt.Sprintf("down-%d", i), "agent": "coord", "provider": "openai", "profile": "p1", "model": "m", "transport_error": "fetch failed: connect ECONNREFUSED"})
	}
	add(storyStart.Add(3*time.Hour+54*time.Minute), "cron_run", map[string]any{"agent": "coord", "cron": "sync", "scheduled_at": ts(storyStart.Add(3*time.Hour + 53*time.Minute)), "status": "ok", "provider": "openai"})
	wr := func(at time.Time, agent, key, provider string, ok bool) {
		f := map[string]any{"agent": agent, "key": key, "ok": ok}
		if provider != "" {
			f["provider"] = provider
		}
		if !ok {
			f["error"] = "fetch failed"
		}
		add(at, "write", f)
	}
	wr(storyStart.Add(-time.Hour), "coord", "memory/old.md", "openai", false)
	wr(storyStart.Add(time.Hour), "coord", "memory/2026-03-02.md", "openai", false)
	wr(storyStart.Add(2*time.Hour), "coord", "memory/lessons.md", "openai", false)
	wr(storyStart.Add(3*time.Hour), "coord", "memory/lessons.md", "openai", true)
	wr(storyStart.Add(4*time.Hour), "helper", "notes/today.md", "", false)
	wr(storyStart.Add(5*time.Hour), "helper", "notes/claude.md", "anthropic", false)
	for i := range 200 {
		task(storyStart.Add(time.Hour+time.Duration(i)*time.Minute), fmt.Sprintf("q-%03d", i), fmt.Sprintf("worker-%d", i%10))
	}
	// The end: three successes over two minutes (probes answered).
	for i, d := range []time.Duration{-2 * time.Minute, -time.Minute, 0} {
		add(storyRecovered.Add(d), "outcome", map[string]any{"id": fmt.Sprintf("up-%d", i), "agent": "coord", "provider": "openai", "profile": "p1", "model": "m", "ok": true, "status": 200, "origin": map[string]any{"kind": "probe"}})
	}
	add(storyRecovered.Add(time.Minute), "tick", map[string]any{})
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].at.Before(lines[j].at) })
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.text
	}
	return out
}

// The story file is what recoveryStory writes.
func TestRecoveryStoryFile(t *testing.T) {
	want := strings.Join(recoveryStory(), "\n") + "\n"
	if *updateStory {
		if err := os.WriteFile(storyFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(storyFile)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale: go test ./internal/engine/sim -run TestRecoveryStoryFile -update-story", storyFile)
	}
}

// CheckRecoveryStory checks the outputs of the story: every kill,
// re-run, write check and release it must give, exactly. It is shared with `failbus simulate`'s test.
func checkRecoveryStory(t *testing.T, out []map[string]any) {
	t.Helper()
	str := func(r map[string]any, k string) string { s, _ := r[k].(string); return s }
	at := func(r map[string]any, k string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, str(r, k))
		if err != nil {
			t.Fatalf("%v: %s: %v", r, k, err)
		}
		return v
	}
	var kills, reruns, checks []string
	var probes, notes, records []map[string]any
	dispatched := map[string]int{}
	var released []map[string]any
	for _, r := range out {
		switch str(r, "type") {
		case "error":
			t.Errorf("error record %v", r)
		case "control":
			switch str(r, "action") {
			case "kill":
				kills = append(kills, str(r, "subagent"))
			case "run_cron":
				reruns = append(reruns, str(r, "cron")+"@"+at(r, "scheduled_at").Format("15:04"))
			case "check_write":
				checks = append(checks, str(r, "agent")+":"+str(r, "key"))
			case "probe":
				probes = append(probes, r)
			}
		case "dispatch":
			k := fmt.Sprintf("%s#%v", str(r, "task_id"), r["attempt"])
			dispatched[k]++
			if strings.HasPrefix(str(r, "task_id"), "q-") {
				released = append(released, r)
			}
		case "recovery":
			records = append(records, r)
		case "notification":
			if strings.HasPrefix(str(r, "dedupe_key"), "recovery:") {
				notes = append(notes, r)
			}
		}
	}
	if want := []string{"stale-0", "stale-1", "stale-2", "stale-3", "stale-4"}; !slices.Equal(kills, want) {
		t.Errorf("killed %v, want exactly %v", kills, want)
	}
	sort.Strings(reruns)
	if want := []string{"digest@08:00", "poll@07:07", "report@02:30", "report@04:30", "report@06:30", "standup@08:00", "sync@08:00"}; !slices.Equal(reruns, want) {
		t.Errorf("cron re-runs %v, want %v", reruns, want)
	}
	if want := []string{"coord:memory/2026-03-02.md", "helper:notes/today.md"}; !slices.Equal(checks, want) {
		t.Errorf("write checks %v, want %v", checks, want)
	}
	var steps []string
	for _, r := range records {
		steps = append(steps, str(r, "step"))
	}
	if want := []string{"confirm", "subagents", "kill", "crons", "writes", "redispatch", "release"}; !slices.Equal(steps, want) {
		t.Fatalf("records %v, want each step once, in order", steps)
	}
	if r := records[0]; !at(r, "outage_started_at").Equal(storyStart) || !at(r, "recovered_at").Equal(storyRecovered) {
		t.Errorf("outage %s – %s, want %s – %s", r["outage_started_at"], r["recovered_at"], storyStart, storyRecovered)
	}
	missed, _ := records[3]["crons_missed"].([]any)
	if len(missed) != 18 {
		t.Errorf("%d missed cron times listed, want 18", len(missed))
	}
	for _, m := range missed {
		if str(m.(map[string]any), "why") == "" {
			t.Errorf("missed %v without why", m)
		}
	}
	for k, n := range dispatched {
		if n != 1 {
			t.Errorf("dispatch %s %d times", k, n)
		}
	}
	for i := range 5 {
		if dispatched[fmt.Sprintf("job-stale-%d#2", i)] != 1 {
			t.Errorf("job-stale-%d not re-dispatched as attempt 2", i)
		}
	}
	if len(released) != 200 {
		t.Fatalf("%d queued tasks dispatched, want 200", len(released))
	}
	last := map[string]int{}
	for i, r := range released {
		if at(r, "at").Before(storyRecovered) {
			t.Errorf("%s dispatched at %s, during the outage", str(r, "task_id"), r["at"])
		}
		var n int
		fmt.Sscanf(str(r, "task_id"), "q-%d", &n)
		if prev, ok := last[str(r, "agent")]; ok && prev > n {
			t.Errorf("%s: q-%03d released after q-%03d", str(r, "agent"), n, prev)
		}
		last[str(r, "agent")] = n
		if i > 0 && at(r, "at").Sub(at(released[i-1], "at")) < 50*time.Millisecond {
			t.Errorf("%s released faster than drain_rate 20/s", str(r, "task_id"))
		}
	}
	if len(notes) != 1 {
		t.Errorf("%d recovery notifications, want 1", len(notes))
	}
	if len(probes) < 900 {
		t.Errorf("%d probes over an 8-hour outage, want one every 30s", len(probes))
	}
	for _, p := range probes {
		if at(p, "at").After(storyRecovered) {
			t.Errorf("probe at %s, after recovery", p["at"])
		}
	}
	t.Logf("%d output records: %d killed, %d cron re-runs, %d listed missed, %d write checks, %d dispatches (%d released), %d probes, %d step records, %d recovery notification",
		len(out), len(kills), len(reruns), len(missed), len(checks), len(dispatched), len(released), len(probes), len(records), len(notes))
}

// The story through the engine, line by line as `failbus simulate` reads
// it.
func TestSimRecoveryEightHourStory(t *testing.T) {
	s, err := New(Config{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for i, l := range recoveryStory() {
		for _, o := range s.StepLine([]byte(l), i+1) {
			b, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			var r map[string]any
			if err := json.NewDecoder(bytes.NewReader(b)).Decode(&r); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
	}
	checkRecoveryStory(t, out)
}
