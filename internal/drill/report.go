package drill

import (
	"context"
	"encoding/json"
	"errors"
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

// columns of the table: a header, the JSON name of the figure (a row
// read from elsewhere without it shows "—") and how a row fills it.
var columns = []struct {
	head, key string
	cell      func(Row) string
}{
	{"strategy", "strategy", func(r Row) string { return r.Strategy }},
	{"done", "completed", func(r Row) string { return strconv.Itoa(r.Completed) }},
	{"lost", "lost", func(r Row) string { return strconv.Itoa(r.Lost) }},
	{"calls", "calls", func(r Row) string { return strconv.Itoa(r.Calls) }},
	{"wasted", "wasted", func(r Row) string { return strconv.Itoa(r.Wasted.Total) }},
	{"wasted tok", "wasted", func(r Row) string { return strconv.Itoa(r.Wasted.PromptTokens) }},
	{"calls/done", "calls_per_completed_task", func(r Row) string {
		if r.Completed == 0 {
			return "—"
		}
		return strconv.FormatFloat(r.CallsPerCompleted, 'f', 2, 64)
	}},
	{"burst/s", "burst_after_recovery", func(r Row) string { return strconv.Itoa(r.Burst) }},
	{"hung", "hung_calls", func(r Row) string { return strconv.Itoa(r.Hung) }},
	{"to humans", "notifications", func(r Row) string { return strconv.Itoa(r.Notifications) }},
	{"recovery→last done", "recovery_to_last_done_s", func(r Row) string {
		if r.RecoveryToLastDone < 0 {
			return "—"
		}
		return strconv.FormatFloat(r.RecoveryToLastDone, 'f', 1, 64) + "s"
	}},
	{"killed (wrong)", "subagents_killed", func(r Row) string { return fmt.Sprintf("%d (%d)", r.Killed, r.WronglyKilled) }},
	{"crons re-run", "crons_rerun", func(r Row) string { return strconv.Itoa(r.CronsRerun) }},
	{"writes redone", "writes_redone", func(r Row) string { return strconv.Itoa(r.WritesRedone) }},
	{"restart tok", "tokens_resent_after_restarts", func(r Row) string { return strconv.Itoa(r.RestartTokens) }},
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
			if r.Has(c.key) {
				b.WriteString(c.cell(r))
			} else {
				b.WriteString("—")
			}
		}
		fmt.Fprintln(tw, b.String()+"\t")
	}
	return tw.Flush()
}

// WriteDetails writes, under the table, what the columns do not show:
// the wasted calls by reason, why tasks were lost, and the bus's side.
func WriteDetails(w io.Writer, rep *Report) {
	for _, r := range rep.Rows {
		fmt.Fprintf(w, "%s: %s", r.Strategy, r.Label)
		if r.CountedFrom != "" {
			fmt.Fprintf(w, "; counted from the %s", r.CountedFrom)
		}
		fmt.Fprintln(w)
		ws := r.Wasted
		fmt.Fprintf(w, "  wasted: %s\n", byReason(map[string]int{WasteOutage: ws.Outage, WastePastCap: ws.PastCap, WasteRefusedResent: ws.RefusedResent, WasteNonRetryable: ws.NonretryableRetried},
			[]string{WasteOutage, WastePastCap, WasteRefusedResent, WasteNonRetryable}))
		if len(r.LostBy) > 0 {
			fmt.Fprintf(w, "  lost: %s\n", byReason(r.LostBy, nil))
		}
		if r.present != nil {
			continue // a row made elsewhere: its own drill says the rest
		}
		fmt.Fprintf(w, "  to humans: %s\n", r.NotificationsAre)
		fmt.Fprintf(w, "  SDK retries %d, refused calls %d, subagents crashed %d, crons missed %d of %d, tokens saved by checkpoints %d, %.0fs\n",
			r.SDKRetries, r.Refused, r.Crashed, r.CronsMissed, r.CronsScheduled, r.CheckpointTokens, r.Seconds)
		if r.OutageDeclared != 0 {
			fmt.Fprintf(w, "  bus: outage declared at %.1fs, recovered at %.1fs; %d attempts other than probes begun while it knew the provider down; %d probes; %d re-dispatched; %d streams restarted\n",
				r.OutageDeclared, r.RecoveryDeclared, r.CallsWhileDown, r.Probes, r.Redispatched, r.StreamRestarts)
		}
		if r.Call != nil && len(r.Call.Decisions) > 0 {
			fmt.Fprintf(w, "  decisions: %s\n", byReason(r.Call.Decisions, nil))
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
		if !seen[k] && m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// Goal is the drill's measure of the bus: the failbus row loses no task,
// wastes at most MaxWasteRatio of the calls the best baseline wasted, and
// completes at least as many tasks.
const MaxWasteRatio = 0.10

// GoalVerdict says whether the Go failbus row met the goal against the
// baselines (the rows not on the bus), in words.
func GoalVerdict(rows []Row, bus string) (met bool, text string) {
	var b *Row
	best := -1
	done := 0
	for i, r := range rows {
		switch {
		case r.Strategy == bus:
			b = &rows[i]
		case r.onBus():
		default:
			done = max(done, r.Completed)
			if best < 0 || r.Wasted.Total < rows[best].Wasted.Total || r.Wasted.Total == rows[best].Wasted.Total && r.Completed > rows[best].Completed {
				best = i
			}
		}
	}
	if b == nil || best < 0 {
		return false, ""
	}
	base := rows[best]
	ratio := 0.0
	if base.Wasted.Total > 0 {
		ratio = float64(b.Wasted.Total) / float64(base.Wasted.Total)
	} else if b.Wasted.Total > 0 {
		ratio = math.Inf(1)
	}
	met = b.Lost == 0 && ratio <= MaxWasteRatio && b.Completed >= done
	verdict := "met"
	if !met {
		verdict = "NOT met"
	}
	return met, fmt.Sprintf("goal %s: %s lost %d tasks; wasted %d calls, %.1f %% of the best baseline's (%s, %d; at most %.0f %%); completed %d, the baselines at most %d",
		verdict, b.Strategy, b.Lost, b.Wasted.Total, 100*ratio, base.Strategy, base.Wasted.Total, 100*MaxWasteRatio, b.Completed, done)
}

// ReadRow decodes a row made elsewhere (the TypeScript drill's --json
// rows), noting which figures it carries.
func ReadRow(data []byte) (Row, error) {
	var r Row
	if err := json.Unmarshal(data, &r); err != nil {
		return Row{}, err
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return Row{}, err
	}
	r.present = map[string]bool{}
	for k, v := range keys {
		if string(v) != "null" {
			r.present[k] = true
		}
	}
	if r.Strategy == "" {
		return Row{}, errors.New("a drill row names its strategy")
	}
	if r.Client == "go" {
		r.present = nil // this drill's own row: it carries every figure
	}
	return r, nil
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
