package checklist_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery/checklist"
	"github.com/failbus/failbus/pkg/events"
)

// The outage of these tests: provider "openai" down for 8 hours on a
// winter day (Europe/Berlin is UTC+1).
var (
	start     = time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC)
	recovered = start.Add(8 * time.Hour)
	limits    = checklist.Limits{CatchupWindow: 6 * time.Hour, MaxCatchupRuns: 100}
)

func hb(agent, sub, provider, status string, at time.Time, interval time.Duration) events.Heartbeat {
	return events.Heartbeat{At: events.At(at), Agent: agent, Subagent: sub, Provider: provider, Status: status, TaskID: "task-" + sub, IntervalMS: interval.Milliseconds()}
}

func names(refs []events.SubagentRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Agent+"/"+r.Subagent)
	}
	return out
}

// Steps 2 and 3: every running subagent of the provider is listed; only
// those whose latest heartbeat is older than 3 × their own interval (or
// stale_after) are killed — never a fresh one, one that said done or
// failed, another provider's, or one that beat again between the steps.
func TestStaleSubagentsAreTheOnlyOnesKilled(t *testing.T) {
	now := recovered
	beats := []events.Heartbeat{
		hb("a", "stale", "openai", events.HeartbeatRunning, start.Add(time.Minute), 10*time.Second),
		hb("a", "fresh", "openai", events.HeartbeatRunning, now.Add(-5*time.Second), 10*time.Second),
		hb("a", "slow", "openai", events.HeartbeatRunning, now.Add(-20*time.Minute), 10*time.Minute), // 20 min < 3 × 10 min
		hb("a", "done", "openai", events.HeartbeatDone, start.Add(time.Minute), 10*time.Second),
		hb("a", "failed", "openai", events.HeartbeatFailed, start.Add(time.Minute), 10*time.Second),
		hb("a", "other", "anthropic", events.HeartbeatRunning, start.Add(time.Minute), 10*time.Second),
		hb("b", "anywhere", "", events.HeartbeatRunning, start.Add(time.Minute), 10*time.Second), // no provider: every provider's
		hb("b", "revived", "openai", events.HeartbeatRunning, start.Add(time.Minute), 10*time.Second),
	}
	running := checklist.RunningSubagents(limits, "openai", beats, now)
	if got, want := names(running), []string{"a/fresh", "a/slow", "a/stale", "b/anywhere", "b/revived"}; !slices.Equal(got, want) {
		t.Fatalf("running %v, want %v (sorted, this provider's and provider-less, running only)", got, want)
	}
	for _, r := range running {
		if wantStale := r.Subagent == "stale" || r.Subagent == "anywhere" || r.Subagent == "revived"; r.Stale != wantStale {
			t.Errorf("%s stale=%v, want %v", r.Subagent, r.Stale, wantStale)
		}
	}
	// Between the steps "revived" beats again: it is not killed.
	later := now.Add(time.Second)
	beats[7] = hb("b", "revived", "openai", events.HeartbeatRunning, later, 10*time.Second)
	killed := checklist.StaleSubagents(limits, running, beats, later)
	if got, want := names(killed), []string{"a/stale", "b/anywhere"}; !slices.Equal(got, want) {
		t.Errorf("killed %v, want %v", got, want)
	}
	if killed[0].TaskID != "task-stale" || !killed[0].LastHeartbeatAt.Equal(start.Add(time.Minute)) || killed[0].Stale {
		t.Errorf("kill %+v: want its task, its last heartbeat, and no stale flag", killed[0])
	}

	// stale_after overrides the 3 intervals: the slow one is stale after 5
	// minutes.
	short := limits
	short.StaleAfter = 5 * time.Minute
	killed = checklist.StaleSubagents(short, checklist.RunningSubagents(short, "openai", beats, later), beats, later)
	if got := names(killed); !slices.Contains(got, "a/slow") || slices.Contains(got, "a/fresh") {
		t.Errorf("with stale_after 5m killed %v, want a/slow and never a/fresh", got)
	}
}

func cron(name, schedule, tz, mode string, window time.Duration) checklist.CronState {
	return checklist.CronState{Spec: events.CronSpec{
		At: events.At(start.Add(-24 * time.Hour)), Agent: "a", Cron: name, Schedule: schedule,
		Timezone: tz, Provider: "openai", Catchup: mode, CatchupWindow: events.Duration(window),
	}}
}

func refs(rs []events.CronRef, cronName string) []string {
	var out []string
	for _, r := range rs {
		if r.Cron == cronName {
			out = append(out, r.ScheduledAt.UTC().Format("15:04"))
		}
	}
	return out
}

func whyOf(rs []events.CronRef, cronName, at string) string {
	for _, r := range rs {
		if r.Cron == cronName && r.ScheduledAt.UTC().Format("15:04") == at {
			return r.Why
		}
	}
	return ""
}

// Step 4: each scheduled time inside the outage without an ok run; within
// the catch-up window re-run by the cron's mode, the rest listed with why;
// time zones and the @every anchor as CONTRACT.md says.
func TestMissedCronsByCatchupMode(t *testing.T) {
	every := cron("every-90m", "@every 90m", "", events.CatchupLatest, 0)
	every.FirstRunAt = events.At(start.Add(-45 * time.Minute)) // 23:15 the day before
	crons := []checklist.CronState{
		cron("hourly-latest", "0 * * * *", "", events.CatchupLatest, 0),
		cron("hourly-all", "0 * * * *", "", events.CatchupAll, 0),
		cron("hourly-none", "0 * * * *", "", events.CatchupNone, 0),
		cron("berlin-nine", "0 9 * * *", "Europe/Berlin", events.CatchupAll, 0), // 08:00 UTC
		cron("hourly-all-2h", "30 * * * *", "", events.CatchupAll, 2*time.Hour),
		every,
		{Spec: events.CronSpec{At: events.At(start), Agent: "a", Cron: "elsewhere", Schedule: "0 * * * *", Provider: "anthropic"}},
	}
	runs := []events.CronRun{
		{Agent: "a", Cron: "hourly-all", ScheduledAt: events.At(start.Add(3 * time.Hour)), Status: events.CronOK},     // ran anyway
		{Agent: "a", Cron: "hourly-all", ScheduledAt: events.At(start.Add(4 * time.Hour)), Status: events.CronFailed}, // failed: still missed
	}
	rerunBefore := func(agent, cronName string, at time.Time) bool {
		return cronName == "hourly-all" && at.Equal(start.Add(7*time.Hour)) // re-run by an earlier recovery
	}
	rerun, missed, n := checklist.MissedCrons(limits, "openai", start, recovered, crons, runs, rerunBefore)

	for _, c := range []struct {
		cron          string
		rerun, missed []string
	}{
		{"hourly-latest", []string{"08:00"}, []string{"00:00", "01:00", "02:00", "03:00", "04:00", "05:00", "06:00", "07:00"}},
		{"hourly-all", []string{"02:00", "04:00", "05:00", "06:00", "08:00"}, []string{"00:00", "01:00", "07:00"}},
		{"hourly-none", nil, []string{"00:00", "01:00", "02:00", "03:00", "04:00", "05:00", "06:00", "07:00", "08:00"}},
		{"berlin-nine", []string{"08:00"}, nil},
		{"hourly-all-2h", []string{"06:30", "07:30"}, []string{"00:30", "01:30", "02:30", "03:30", "04:30", "05:30"}},
		{"every-90m", []string{"06:45"}, []string{"00:45", "02:15", "03:45", "05:15"}},
		{"elsewhere", nil, nil},
	} {
		if got := refs(rerun, c.cron); !slices.Equal(got, c.rerun) {
			t.Errorf("%s: re-run %v, want %v", c.cron, got, c.rerun)
		}
		if got := refs(missed, c.cron); !slices.Equal(got, c.missed) {
			t.Errorf("%s: listed missed %v, want %v", c.cron, got, c.missed)
		}
	}
	if want := 8 + 3 + 9 + 6 + 4; n != want {
		t.Errorf("%d missed in all, want %d", n, want)
	}
	for _, w := range []struct{ cron, at, says string }{
		{"hourly-latest", "01:00", "outside the catch-up window"},
		{"hourly-latest", "07:00", "only the newest"},
		{"hourly-all", "07:00", "re-run once already"},
		{"hourly-none", "08:00", "catchup none"},
	} {
		if why := whyOf(missed, w.cron, w.at); !strings.Contains(why, w.says) {
			t.Errorf("%s at %s: why %q, want it to say %q", w.cron, w.at, why, w.says)
		}
	}

	// max_catchup_runs caps the re-runs of `all`, oldest first.
	capped := limits
	capped.MaxCatchupRuns = 2
	rerun, missed, _ = checklist.MissedCrons(capped, "openai", start, recovered, crons[1:2], runs, nil)
	if got := refs(rerun, "hourly-all"); !slices.Equal(got, []string{"02:00", "04:00"}) {
		t.Errorf("capped re-runs %v, want the 2 oldest in the window", got)
	}
	if why := whyOf(missed, "hourly-all", "08:00"); !strings.Contains(why, "max_catchup_runs (2)") {
		t.Errorf("capped 08:00: why %q", why)
	}
}

// A cron every minute through a long outage: the count is exact, the list
// stays bounded (the last entry sums up the rest).
func TestMissedCronsListIsBounded(t *testing.T) {
	_, missed, n := checklist.MissedCrons(limits, "openai", start, recovered, []checklist.CronState{cron("minutely", "* * * * *", "", events.CatchupNone, 0)}, nil, nil)
	if n != 8*60+1 {
		t.Errorf("%d missed, want %d", n, 8*60+1)
	}
	if len(missed) != 50 || !strings.Contains(missed[49].Why, fmt.Sprintf("and %d more", n-49)) {
		t.Errorf("%d listed, last %q", len(missed), missed[len(missed)-1].Why)
	}
}

// Step 5: the latest failed write of each key during the outage, unless
// the key was written successfully after it; writes before the outage or
// of another provider are not this run's.
func TestFailedWritesOnlyThoseNotWrittenAgain(t *testing.T) {
	w := func(key, provider string, at time.Time, ok bool) events.Write {
		wr := events.Write{At: events.At(at), Agent: "a", Key: key, Provider: provider, OK: ok}
		if !ok {
			wr.Error = "fetch failed: " + key
		}
		return wr
	}
	writes := []events.Write{
		w("lost.md", "openai", start.Add(time.Hour), false),
		w("fixed.md", "openai", start.Add(time.Hour), false),
		w("fixed.md", "openai", start.Add(2*time.Hour), true),
		w("twice.md", "openai", start.Add(time.Hour), false),
		w("twice.md", "openai", start.Add(3*time.Hour), false),
		w("before.md", "openai", start.Add(-time.Hour), false),
		w("other.md", "anthropic", start.Add(time.Hour), false),
		w("shared.md", "", start.Add(time.Hour), false),
		w("late-ok.md", "openai", start.Add(time.Hour), false),
		w("late-ok.md", "", recovered.Add(time.Minute), true), // written again after recovery
	}
	got, why := checklist.FailedWrites("openai", start, recovered, writes)
	var keys []string
	for _, r := range got {
		keys = append(keys, r.Key+"@"+r.FailedAt.UTC().Format("15:04"))
	}
	if want := []string{"lost.md@01:00", "shared.md@01:00", "twice.md@03:00"}; !slices.Equal(keys, want) {
		t.Errorf("writes to check %v, want %v", keys, want)
	}
	if len(why) != len(got) || !strings.Contains(why[0], "fetch failed: lost.md") {
		t.Errorf("why %q", why)
	}
}
