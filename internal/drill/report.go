package drill

import (
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/failbus/failbus/internal/chaos"
)

// Report is a drill's result: what ran, and one row per strategy.
type Report struct {
	Fleet    Fleet    `json:"fleet"`
	Timeline []Window `json:"timeline"`
	Rows     []Row    `json:"rows"`
}

// Fleet is the drill's size and clock.
type Fleet struct {
	Agents        int     `json:"agents"`
	TasksPerAgent int     `json:"tasks_per_agent"`
	Steps         int     `json:"steps_per_task"`
	Tasks         int     `json:"tasks"`
	Crashes       int     `json:"crashes_planned"`
	CrashAt       float64 `json:"crash_at_s"`
	Seed          uint64  `json:"seed"`
	Scale         float64 `json:"scale"`
	Bus           string  `json:"bus"`
	Provider      string  `json:"provider"`
}

// Window is one window of the timeline (seconds of timeline time; To -1:
// until the end).
type Window struct {
	Name     string   `json:"name"`
	Kind     string   `json:"kind"`
	From     float64  `json:"from_s"`
	To       float64  `json:"to_s"`
	Provider []string `json:"provider,omitempty"`
}

// Run runs the drill: the plan of cfg, each strategy in turn against a
// fresh chaos server (and, for the failbus strategy, a fresh bus in
// process unless cfg.Connect names one).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.resolved()
	if err != nil {
		return nil, err
	}
	plan, err := NewPlan(cfg, cfg.Timeline)
	if err != nil {
		return nil, err
	}
	rep := &Report{Fleet: Fleet{
		Agents: cfg.Agents, TasksPerAgent: cfg.Tasks, Steps: cfg.Steps, Tasks: plan.Tasks, Crashes: len(plan.Crashes),
		CrashAt: plan.CrashAt.Seconds(), Seed: cfg.Seed, Scale: cfg.Scale, Bus: "in process (failbus dev)", Provider: "chaos",
	}}
	if cfg.Connect != nil {
		rep.Fleet.Bus = "existing (--server)"
	}
	if cfg.Real != nil {
		rep.Fleet.Provider = "real"
	}
	for _, f := range cfg.Timeline.Faults {
		w := Window{Name: f.Name, Kind: string(f.Kind), From: f.From.Seconds(), To: -1, Provider: f.Providers}
		if f.To != chaos.Forever {
			w.To = f.To.Seconds()
		}
		rep.Timeline = append(rep.Timeline, w)
	}
	if cfg.Progress != nil {
		cfg.Progress = &lockedWriter{w: cfg.Progress} // strategies side by side share it
	}
	rows := make([]Row, len(cfg.Strategies))
	errs := make([]error, len(cfg.Strategies))
	one := func(i int) {
		s := cfg.Strategies[i]
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "%s: %d agents, %d tasks, timeline %v at scale %v\n", s, cfg.Agents, plan.Tasks, cfg.Timeline.End(), cfg.Scale)
		}
		rows[i], errs[i] = runStrategy(ctx, cfg, plan, s)
		if errs[i] == nil && cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "%s: done in %.0fs\n", s, rows[i].Seconds)
		}
	}
	var wg sync.WaitGroup
	for i := range cfg.Strategies {
		if cfg.Parallel {
			wg.Go(func() { one(i) })
			continue
		}
		if one(i); errs[i] != nil {
			break
		}
	}
	wg.Wait()
	for i := range rows {
		if errs[i] != nil {
			return rep, errs[i]
		}
		if rows[i].Strategy != "" {
			rep.Rows = append(rep.Rows, rows[i])
		}
	}
	return rep, nil
}

// columns of the table: a header and how a row fills it.
var columns = []struct {
	head string
	cell func(Row) string
}{
	{"strategy", func(r Row) string { return r.Strategy }},
	{"done", func(r Row) string { return strconv.Itoa(r.Completed) }},
	{"lost", func(r Row) string { return strconv.Itoa(r.Lost) }},
	{"calls", func(r Row) string { return strconv.Itoa(r.Calls) }},
	{"wasted", func(r Row) string { return strconv.Itoa(r.Wasted) }},
	{"wasted tok", func(r Row) string { return strconv.Itoa(r.WastedTokens) }},
	{"calls/done", func(r Row) string { return strconv.FormatFloat(r.CallsPerCompleted, 'f', 2, 64) }},
	{"burst/s", func(r Row) string { return strconv.Itoa(r.Burst) }},
	{"hung", func(r Row) string { return strconv.Itoa(r.Hung) }},
	{"to humans", func(r Row) string { return strconv.Itoa(r.Notifications) }},
	{"recovery→last done", func(r Row) string {
		if r.RecoveryToLastDone < 0 {
			return "—"
		}
		return strconv.FormatFloat(r.RecoveryToLastDone, 'f', 1, 64) + "s"
	}},
	{"killed (wrong)", func(r Row) string { return fmt.Sprintf("%d (%d)", r.Killed, r.WronglyKilled) }},
	{"crons re-run", func(r Row) string { return strconv.Itoa(r.CronsRerun) }},
	{"writes redone", func(r Row) string { return strconv.Itoa(r.WritesRedone) }},
	{"restart tok", func(r Row) string { return strconv.Itoa(r.RestartTokens) }},
}

// WriteTable writes the rows as one aligned table, the numbers
// right-aligned.
func WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	var b strings.Builder
	for i, c := range columns {
		if i > 0 {
			b.WriteByte('\t')
		}
		b.WriteString(c.head)
	}
	fmt.Fprintln(tw, b.String()+"\t")
	for _, r := range rows {
		b.Reset()
		for i, c := range columns {
			if i > 0 {
				b.WriteByte('\t')
			}
			b.WriteString(c.cell(r))
		}
		fmt.Fprintln(tw, b.String()+"\t")
	}
	return tw.Flush()
}

// WriteDetails writes, under the table, what the columns do not show:
// the wasted calls by reason, why tasks were lost, and the bus's side.
func WriteDetails(w io.Writer, rep *Report) {
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "%s: %s; counted from the %s\n", r.Strategy, r.Client, r.CountedFrom)
		fmt.Fprintf(w, "  wasted: %s\n", byReason(r.WastedBy, []string{WasteOutage, WasteCappedKey, WasteRefusedAgain, WasteNonRetryable}))
		if len(r.LostWhy) > 0 {
			fmt.Fprintf(w, "  lost: %s\n", byReason(r.LostWhy, nil))
		}
		fmt.Fprintf(w, "  to humans: %s\n", r.NotificationsAre)
		fmt.Fprintf(w, "  SDK retries %d, subagents crashed %d, crons missed %d of %d, tokens saved by checkpoints %d, %.0fs\n",
			r.SDKRetries, r.Crashed, r.CronsMissed, r.CronsScheduled, r.CheckpointTokens, r.Seconds)
		if r.OutageDeclared != 0 {
			fmt.Fprintf(w, "  bus: outage declared at %.1fs, recovered at %.1fs; %d calls other than probes while known down; %d probes answered by the agents; %d re-dispatched; %d streams restarted\n",
				r.OutageDeclared, r.RecoveryDeclared, r.CallsWhileDown, r.Probes, r.Redispatched, r.StreamRestarts)
		}
		if len(r.Health) > 0 {
			fmt.Fprintf(w, "  health: %s\n", strings.Join(r.Health, ", "))
		}
		if r.UnmatchedRequests > 0 {
			fmt.Fprintf(w, "  %d requests the provider logged did not match a prompt the fleet sent\n", r.UnmatchedRequests)
		}
		if r.AgentErrors > 0 {
			fmt.Fprintf(w, "  %d agent errors; the last: %s\n", r.AgentErrors, r.LastAgentError)
		}
	}
}

func byReason(m map[string]int, order []string) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	seen := map[string]bool{}
	for _, k := range order {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
		seen[k] = true
	}
	for _, k := range (counts{why: m}).reasons() {
		if !seen[k] {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	return strings.Join(parts, ", ")
}

// Goal is the drill's measure of the bus: the failbus row loses no task,
// wastes at most MaxWasteRatio of the calls the best baseline wasted, and
// completes at least as many tasks.
const MaxWasteRatio = 0.10

// GoalVerdict says whether row met the goal against the baselines (the
// rows not on the bus), in words.
func GoalVerdict(rows []Row, bus string) (met bool, text string) {
	var b *Row
	best := -1
	for i := range rows {
		switch {
		case rows[i].Strategy == bus:
			b = &rows[i]
		case strings.Contains(rows[i].Strategy, "failbus"):
		case best < 0 || rows[i].Wasted < rows[best].Wasted || rows[i].Wasted == rows[best].Wasted && rows[i].Completed > rows[best].Completed:
			best = i
		}
	}
	if b == nil || best < 0 {
		return false, "goal: needs the failbus row and a baseline"
	}
	base := rows[best]
	ratio := 0.0
	if base.Wasted > 0 {
		ratio = float64(b.Wasted) / float64(base.Wasted)
	} else if b.Wasted > 0 {
		ratio = math.Inf(1)
	}
	done := 0
	for _, r := range rows {
		if !strings.Contains(r.Strategy, "failbus") {
			done = max(done, r.Completed)
		}
	}
	met = b.Lost == 0 && ratio <= MaxWasteRatio && b.Completed >= done
	verdict := "met"
	if !met {
		verdict = "NOT met"
	}
	return met, fmt.Sprintf("goal %s: %s lost %d tasks; wasted %d calls, %.1f %% of the best baseline's (%s, %d; at most %.0f %%); completed %d, the baselines at most %d",
		verdict, b.Strategy, b.Lost, b.Wasted, 100*ratio, base.Strategy, base.Wasted, 100*MaxWasteRatio, b.Completed, done)
}

// lockedWriter serialises the writes of strategies run side by side.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
