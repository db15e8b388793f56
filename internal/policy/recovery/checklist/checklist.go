// Package checklist is what each step of the post-outage checklist finds
// (CONTRACT.md § "Recovery", steps 2–5): the running subagents of the
// provider that was down, the stale ones among them, the cron times missed
// in the outage and which of them to re-run, the writes that failed and
// were not written again. Pure functions of the reports and the policy's
// numbers; package recovery sequences the steps, sends their commands once
// and records them.
package checklist

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/redact"
)

// StaleIntervals is how many missed heartbeat intervals make a subagent
// stale when Limits.StaleAfter is 0.
const StaleIntervals = 3

// Limits are the numbers of the `recovery:` policy section the selections
// use (recovery.Config.Limits).
type Limits struct {
	// StaleAfter is how old a running subagent's latest heartbeat may be;
	// 0: StaleIntervals × the heartbeat's own interval.
	StaleAfter time.Duration
	// CatchupWindow is how long before recovery a missed cron time is
	// still re-run, unless the cron's spec says otherwise. Positive.
	CatchupWindow time.Duration
	// MaxCatchupRuns caps the re-runs of one cron in `all` mode. At least 1.
	MaxCatchupRuns int
}

// StaleLimit is how old a heartbeat with interval iv may be before its
// subagent is stale.
func (l Limits) StaleLimit(iv time.Duration) time.Duration {
	if l.StaleAfter > 0 {
		return l.StaleAfter
	}
	return StaleIntervals * iv
}

// CronState is a cron's latest spec and its first recorded run (the anchor
// of an "@every" schedule), as a recovery store keeps it.
type CronState struct {
	Spec       events.CronSpec `msgpack:"spec" json:"spec"`
	FirstRunAt events.Time     `msgpack:"first_run_at,omitempty" json:"first_run_at,omitzero"`
}

// belongs reports whether a record of recordProvider belongs to provider:
// its own, or none (a record without a provider belongs to every one).
func belongs(recordProvider, provider string) bool {
	return recordProvider == "" || recordProvider == provider
}

// RunningSubagents is step 2: every subagent of the provider whose latest
// heartbeat says running, sorted by agent and subagent, each marked stale
// when that heartbeat is older than the stale limit at now.
func RunningSubagents(lim Limits, provider string, hbs []events.Heartbeat, now time.Time) []events.SubagentRef {
	var out []events.SubagentRef
	for _, h := range hbs {
		if h.State() != events.HeartbeatRunning || !belongs(h.Provider, provider) {
			continue
		}
		out = append(out, events.SubagentRef{
			Agent: h.Agent, Subagent: h.Subagent, TaskID: h.TaskID, LastHeartbeatAt: h.At,
			Stale: now.Sub(h.At.Time) > lim.StaleLimit(h.Interval()),
		})
	}
	slices.SortFunc(out, func(a, b events.SubagentRef) int {
		return cmp.Or(strings.Compare(a.Agent, b.Agent), strings.Compare(a.Subagent, b.Subagent))
	})
	return out
}

// StaleSubagents is step 3: of the running subagents found in step 2, the
// stale ones — checked again against the latest heartbeats, so one that
// beat (or ended) since is never killed.
func StaleSubagents(lim Limits, running []events.SubagentRef, hbs []events.Heartbeat, now time.Time) []events.SubagentRef {
	latest := make(map[[2]string]events.Heartbeat, len(hbs))
	for _, h := range hbs {
		latest[[2]string{h.Agent, h.Subagent}] = h
	}
	var out []events.SubagentRef
	for _, s := range running {
		if !s.Stale {
			continue
		}
		h, ok := latest[[2]string{s.Agent, s.Subagent}]
		if ok && (h.State() != events.HeartbeatRunning || now.Sub(h.At.Time) <= lim.StaleLimit(h.Interval())) {
			continue
		}
		k := s
		k.Stale = false
		if ok {
			k.LastHeartbeatAt, k.TaskID = h.At, h.TaskID
		}
		out = append(out, k)
	}
	return out
}

// Limits on enumerating and listing a cron's missed times, so a per-minute
// cron over a month-long outage neither stalls the checklist nor makes a
// record larger than a message may be.
const (
	maxCronTimes     = 100000
	maxListedPerCron = 50
)

// MissedCrons is step 4: each scheduled time of each cron of the provider
// inside the outage [start, recovered] without an ok run for it. Within
// the catch-up window before recovered, re-run by the cron's catch-up mode
// (latest: the newest; all: each, oldest first, at most max_catchup_runs;
// none: none); the rest listed as missed with why. A time re-run by an
// earlier recovery (rerunBefore says so) is not re-run again. It returns
// the re-runs (Why says which rule chose them), the listed missed times
// (at most maxListedPerCron per cron, then one entry summing up the rest)
// and how many were missed in all.
func MissedCrons(lim Limits, provider string, start, recovered time.Time, crons []CronState, runs []events.CronRun, rerunBefore func(agent, cron string, scheduled time.Time) bool) (rerun, missed []events.CronRef, nMissed int) {
	ok := map[string]bool{}
	for _, r := range runs {
		if r.Status == events.CronOK {
			ok[cronKey(r.Agent, r.Cron, r.ScheduledAt.Time)] = true
		}
	}
	crons = slices.Clone(crons)
	slices.SortFunc(crons, func(a, b CronState) int {
		return cmp.Or(strings.Compare(a.Spec.Agent, b.Spec.Agent), strings.Compare(a.Spec.Cron, b.Spec.Cron))
	})
	for _, cs := range crons {
		s := cs.Spec
		if !belongs(s.Provider, provider) {
			continue
		}
		sched, err := events.ParseCronSchedule(s.Schedule)
		if err != nil {
			continue // validated on the way in; a spec stored before a parser change
		}
		loc, err := events.LoadLocation(s.Timezone)
		if err != nil {
			continue
		}
		anchor := cs.FirstRunAt.Time
		if anchor.IsZero() {
			anchor = s.At.Time
		}
		window := s.CatchupWindow.Std()
		if window <= 0 {
			window = lim.CatchupWindow
		}
		from := recovered.Add(-window)
		var inWindow, outside []time.Time
		n := 0
		for t := sched.Next(start.Add(-time.Nanosecond), loc, anchor); !t.IsZero() && !t.After(recovered) && n < maxCronTimes; t = sched.Next(t, loc, anchor) {
			n++
			if ok[cronKey(s.Agent, s.Cron, t)] {
				continue
			}
			if t.Before(from) {
				outside = append(outside, t)
			} else {
				inWindow = append(inWindow, t)
			}
		}
		ref := func(t time.Time, why string) events.CronRef {
			return events.CronRef{Agent: s.Agent, Cron: s.Cron, ScheduledAt: events.At(t), Why: why}
		}
		var cronMissed []events.CronRef
		outsideWhy := fmt.Sprintf("outside the catch-up window (%s before recovery at %s)", window, clock(recovered))
		for _, t := range outside {
			cronMissed = append(cronMissed, ref(t, outsideWhy))
		}
		var chosen []time.Time
		switch s.CatchupMode() {
		case events.CatchupLatest:
			if k := len(inWindow); k > 0 {
				chosen = inWindow[k-1:]
				for _, t := range inWindow[:k-1] {
					cronMissed = append(cronMissed, ref(t, fmt.Sprintf("catchup latest: only the newest missed time (%s) is re-run", clock(inWindow[k-1]))))
				}
			}
		case events.CatchupAll:
			limit := min(len(inWindow), lim.MaxCatchupRuns)
			chosen = inWindow[:limit]
			for _, t := range inWindow[limit:] {
				cronMissed = append(cronMissed, ref(t, fmt.Sprintf("catchup all: over recovery.max_catchup_runs (%d)", lim.MaxCatchupRuns)))
			}
		case events.CatchupNone:
			for _, t := range inWindow {
				cronMissed = append(cronMissed, ref(t, "catchup none: never re-run"))
			}
		}
		for _, t := range chosen {
			if rerunBefore != nil && rerunBefore(s.Agent, s.Cron, t) {
				cronMissed = append(cronMissed, ref(t, "re-run once already, by an earlier recovery"))
				continue
			}
			rerun = append(rerun, ref(t, "catchup "+s.CatchupMode()))
		}
		slices.SortFunc(cronMissed, func(a, b events.CronRef) int { return a.ScheduledAt.Compare(b.ScheduledAt.Time) })
		nMissed += len(cronMissed)
		if len(cronMissed) > maxListedPerCron {
			rest := cronMissed[maxListedPerCron-1:]
			sum := rest[0]
			sum.Why = fmt.Sprintf("and %d more missed times up to %s, not listed one by one (first: %s)", len(rest), clock(rest[len(rest)-1].ScheduledAt.Time), rest[0].Why)
			cronMissed = append(cronMissed[:maxListedPerCron-1], sum)
		}
		missed = append(missed, cronMissed...)
	}
	return rerun, missed, nMissed
}

func cronKey(agent, cron string, t time.Time) string {
	return agent + "\x00" + cron + "\x00" + strconv.FormatInt(t.UnixMilli(), 10)
}

// FailedWrites is step 5: for each (agent, key) of the provider, the latest
// write that failed during the outage [start, recovered], unless a later
// write of the key succeeded. It returns them sorted by agent and key, and
// for each a few words on the error.
func FailedWrites(provider string, start, recovered time.Time, writes []events.Write) ([]events.WriteRef, []string) {
	type state struct {
		failed  events.Write
		hasFail bool
		lastOK  time.Time
	}
	by := map[[2]string]*state{}
	for _, w := range writes {
		k := [2]string{w.Agent, w.Key}
		s := by[k]
		if s == nil {
			s = &state{}
			by[k] = s
		}
		if w.OK {
			if w.At.After(s.lastOK) {
				s.lastOK = w.At.Time
			}
			continue
		}
		if !belongs(w.Provider, provider) || w.At.Before(start) || w.At.After(recovered) {
			continue
		}
		if !s.hasFail || w.At.After(s.failed.At.Time) {
			s.failed, s.hasFail = w, true
		}
	}
	keys := make([][2]string, 0, len(by))
	for k, s := range by {
		if s.hasFail && !s.lastOK.After(s.failed.At.Time) {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b [2]string) int { return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1])) })
	out := make([]events.WriteRef, len(keys))
	why := make([]string, len(keys))
	for i, k := range keys {
		w := by[k].failed
		out[i] = events.WriteRef{Agent: w.Agent, Key: w.Key, FailedAt: w.At}
		if w.Error != "" {
			// The agent's error text goes into the check_write command
			// and its record: masked like every text that leaves.
			why[i] = " (" + truncate(redact.String(w.Error), 200) + ")"
		}
	}
	return out, why
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func clock(t time.Time) string { return t.UTC().Format(events.JSONTimeLayout) }
