package bench

import (
	"fmt"
	"io"
)

// The bus's performance goals, as ratios and margins so they hold on any machine;
// the bench says of each whether this run met it, so the acceptance is
// one command.
const (
	goalIngestThird    = 0.60   // ingest, × raw/3, every service running
	goalSettledThird   = 0.30   // every service caught up, × raw/3
	goalLatencyRate    = 5000   // outcomes/s at which …
	goalLatencyP99MS   = 10.0   // … decision p99 must stay within this
	goalPending        = 100000 // retries pending for the last two goals
	goalLatenessDiffMS = 50.0   // lateness p99 over raw @at
	goalSchedulerMB    = 50.0   // scheduler memory growth, MB (10^6 bytes)
)

// benchGoal is one goal and what the run measured for it. Measured false
// means the run's flags left it out (a --rates without 5000, --pending
// below 100000), so Met is false too.
type benchGoal struct {
	Goal     string `json:"goal"`
	Figure   string `json:"figure"`
	Measured bool   `json:"measured"`
	Met      bool   `json:"met"`
}

// benchGoals judges rep against the goals.
func benchGoals(rep *benchReport) []benchGoal {
	med, lo, hi := rep.Median, rep.Min, rep.Max
	out := []benchGoal{
		{
			Goal:     fmt.Sprintf("ingest ≥ %.2f× raw/3, every service running", goalIngestThird),
			Figure:   fmt.Sprintf("%.2f× (rounds %.2f–%.2f)", med.IngestThirdRatio, lo.IngestThirdRatio, hi.IngestThirdRatio),
			Measured: true, Met: med.IngestThirdRatio >= goalIngestThird,
		},
		{
			Goal:     fmt.Sprintf("every service caught up ≥ %.2f× raw/3", goalSettledThird),
			Figure:   fmt.Sprintf("%.2f× (rounds %.2f–%.2f; the plumbing %.2f×)", med.SettledThirdRatio, lo.SettledThirdRatio, hi.SettledThirdRatio, med.PlumbingThirdRatio),
			Measured: true, Met: med.SettledThirdRatio >= goalSettledThird,
		},
	}
	lat := benchGoal{Goal: fmt.Sprintf("decision p99 ≤ %.0f ms at %d outcomes/s", goalLatencyP99MS, goalLatencyRate), Figure: fmt.Sprintf("not measured (--rates without %d)", goalLatencyRate)}
	for _, l := range rep.Latency {
		if l.Rate == goalLatencyRate {
			lat.Figure = fmt.Sprintf("p99 %s (p50 %s)", fmtMS(l.Failbus.P99MS), fmtMS(l.Failbus.P50MS))
			if l.CoresNeeded > 0 {
				lat.Figure += fmt.Sprintf("; the rate needs %.2f cores of %d", l.CoresNeeded, rep.Machine.GOMAXPROCS)
			}
			lat.Measured, lat.Met = true, l.Failbus.P99MS <= goalLatencyP99MS
		}
	}
	out = append(out, lat)
	late := benchGoal{Goal: fmt.Sprintf("retry lateness p99 within %.0f ms of raw @at, %d retries pending", goalLatenessDiffMS, goalPending)}
	mem := benchGoal{Goal: fmt.Sprintf("scheduler memory growth ≤ %.0f MB, %d retries pending", goalSchedulerMB, goalPending)}
	if p := rep.Pending; p == nil {
		late.Figure, mem.Figure = "not measured (--pending 0)", "not measured (--pending 0)"
	} else {
		var grew float64
		for _, o := range p.HeapByOwner {
			if o.Owner == ownerScheduler {
				grew = o.AfterMiB - o.RawMiB
			}
		}
		grewMB := grew * (1 << 20) / 1e6
		late.Figure = fmt.Sprintf("%s over raw (%d pending)", fmtSignedMS(p.Lateness.DiffP99MS), p.N)
		mem.Figure = fmt.Sprintf("%+.1f MB of live heap allocated by the scheduler (%d pending; the process's RSS, server included, %+.0f MiB)", grewMB, p.N, p.RSSAfterMiB-p.RSSRawMiB)
		late.Measured, mem.Measured = p.N >= goalPending, p.N >= goalPending
		if !late.Measured {
			late.Figure += fmt.Sprintf(": fewer than %d", goalPending)
			mem.Figure += fmt.Sprintf(": fewer than %d", goalPending)
		}
		late.Met = late.Measured && p.Lateness.DiffP99MS <= goalLatenessDiffMS
		mem.Met = mem.Measured && grewMB <= goalSchedulerMB
	}
	return append(out, late, mem)
}

// printGoals writes the goals table.
func printGoals(w io.Writer, goals []benchGoal) {
	t := benchTable{align: "lll"}
	t.add("GOALS", "", "this run")
	for _, g := range goals {
		verdict := "not met"
		switch {
		case !g.Measured:
			verdict = "not measured"
		case g.Met:
			verdict = "met"
		}
		t.add(g.Goal, verdict, g.Figure)
	}
	t.write(w)
}
