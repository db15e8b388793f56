package bench

import (
	"strings"
	"testing"
)

// TestBenchGoals judges made-up reports: each goal met exactly at its
// bound and not beyond it, and a goal the flags left out is reported as
// not measured, never as met.
func TestBenchGoals(t *testing.T) {
	t.Parallel()
	report := func(ingest, settled, p99 float64, rates []int, pending int, lateDiff, schedMiB float64) *benchReport {
		rep := &benchReport{}
		rep.Median.IngestThirdRatio, rep.Median.SettledThirdRatio = ingest, settled
		for _, r := range rates {
			l := benchLatency{Rate: r}
			l.Failbus.P99MS = p99
			rep.Latency = append(rep.Latency, l)
		}
		if pending > 0 {
			p := &benchPending{N: pending, HeapByOwner: []benchHeapOwner{
				{Owner: ownerServer, RawMiB: 100, AfterMiB: 400},
				{Owner: ownerScheduler, RawMiB: 10, AfterMiB: 10 + schedMiB},
			}}
			p.Lateness.DiffP99MS = lateDiff
			rep.Pending = p
		}
		return rep
	}
	mb50 := 50e6 / (1 << 20) // 50 MB in MiB
	tests := []struct {
		name     string
		rep      *benchReport
		met      []bool
		measured []bool
	}{
		{"every goal at its bound", report(0.60, 0.30, 10, []int{1000, 5000}, 100000, 50, mb50),
			[]bool{true, true, true, true, true}, []bool{true, true, true, true, true}},
		{"every goal just missed", report(0.59, 0.29, 10.1, []int{5000}, 100000, 50.1, mb50+0.01),
			[]bool{false, false, false, false, false}, []bool{true, true, true, true, true}},
		{"today's figures", report(0.35, 0.16, 296, []int{1000, 5000, 10000}, 100000, 2.4, 3.0),
			[]bool{false, false, false, true, true}, []bool{true, true, true, true, true}},
		{"left out by the flags", report(0.70, 0.40, 1, []int{1000}, 100, 1, 1),
			[]bool{true, true, false, false, false}, []bool{true, true, false, false, false}},
		{"no pending at all", report(0.70, 0.40, 1, nil, 0, 0, 0),
			[]bool{true, true, false, false, false}, []bool{true, true, false, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			goals := benchGoals(tt.rep)
			if len(goals) != 5 {
				t.Fatalf("%d goals, want 5", len(goals))
			}
			for i, g := range goals {
				if g.Met != tt.met[i] || g.Measured != tt.measured[i] {
					t.Errorf("goal %q (%s): met %v measured %v, want met %v measured %v", g.Goal, g.Figure, g.Met, g.Measured, tt.met[i], tt.measured[i])
				}
				if !g.Measured && !strings.Contains(g.Figure, "not measured") && !strings.Contains(g.Figure, "fewer than") {
					t.Errorf("goal %q left out, but its figure %q does not say why", g.Goal, g.Figure)
				}
			}
		})
	}
}
