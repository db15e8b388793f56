package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/failbus/failbus/internal/chaos"
)

// fleet is one strategy's agents; the driver gives them their tasks, cron
// ticks and crashes on the timeline's clock.
type fleet interface {
	// begin prepares the agents (connections, readers, cron specs).
	begin(ctx context.Context) error
	// arrive gives task t to its agent.
	arrive(ctx context.Context, t TaskPlan)
	// cron runs agent a's cron for its scheduled time.
	cron(ctx context.Context, a AgentPlan, scheduled time.Time)
	// crash ends the subagent of task id as a crash would (no final
	// status, no heartbeat); false when none runs it.
	crash(id string) bool
	// end stops what begin started, once the fleet's work is over, and
	// returns the figures only the bus has (nil without a bus).
	end(ctx context.Context) (*busFigures, error)
}

// run is one strategy's run: the plan, the clock, the client's side.
type run struct {
	cfg      Config
	plan     *Plan
	strategy string
	start    time.Time
	track    *tracker
	ledger   *ledger
	sdks     *sdks
	wg       sync.WaitGroup // the fleet's goroutines
	// wasteOf is, for each request of the log the figures counted, the
	// reason it was wasted ("" when it was not).
	wasteOf []string
}

// wallAt is timeline time d on the machine's clock.
func (r *run) wallAt(d time.Duration) time.Time { return r.start.Add(r.cfg.wall(d)) }

// goFleet runs fn on a goroutine the run waits for at its end.
func (r *run) goFleet(fn func()) { r.wg.Go(fn) }

// cronStart is when agent i's cron schedule starts: the agents' crons are
// spread over one interval, whole milliseconds (the bus keeps them so).
func (r *run) cronStart(i int) time.Time {
	every := r.cronWall()
	phase := time.Duration(int64(every) * int64(i) / int64(len(r.plan.Agents)))
	return r.start.Truncate(time.Millisecond).Add(phase.Truncate(time.Millisecond))
}

// cronWall is the cron's interval on the machine's clock: whole
// milliseconds, and at least the second an @every schedule needs.
func (r *run) cronWall() time.Duration {
	return max(r.cfg.wall(cronEvery).Truncate(time.Millisecond), time.Second)
}

// end is when the timeline (and the work given to the fleet) is over.
func (r *run) end() time.Duration {
	end := r.cfg.Timeline.End()
	for _, a := range r.plan.Agents {
		for _, t := range a.Tasks {
			end = max(end, t.Arrival)
		}
	}
	return end
}

// sleepUntil waits until t or the end of ctx; false for the latter.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// drive runs the fleet through the timeline: tasks at their arrival, cron
// ticks, the crashes, until every task is settled or the grace ran out.
func (r *run) drive(ctx context.Context, f fleet) (*busFigures, error) {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := f.begin(fctx); err != nil {
		cancel()
		r.wait()
		_, _ = f.end(context.Background())
		return nil, err
	}
	var sched sync.WaitGroup
	end := r.end()
	for i, a := range r.plan.Agents {
		sched.Go(func() {
			for _, t := range a.Tasks {
				if !sleepUntil(fctx, r.wallAt(t.Arrival)) {
					return
				}
				f.arrive(fctx, t)
			}
		})
		sched.Go(func() {
			// The cron runs as long as its agent does: the bus expects
			// its runs until then.
			for at := r.cronStart(i).Add(r.cronWall()); ; at = at.Add(r.cronWall()) {
				if !sleepUntil(fctx, at) {
					return
				}
				r.track.add(&r.track.cronRuns, 1)
				r.goFleet(func() { f.cron(fctx, a, at) })
			}
		})
	}
	sched.Go(func() {
		// Each planned crash hits its subagent once it runs, from
		// CrashAt until the middle of the outage (later, recovery might
		// come before the heartbeat is stale: a crash it cannot see).
		outage, _ := r.cfg.Timeline.Fault(WindowOutage)
		last := r.wallAt(outage.From + (outage.To-outage.From)/2)
		pending := slices.Clone(r.plan.Crashes)
		for at := r.wallAt(r.plan.CrashAt); len(pending) > 0 && !at.After(last); at = at.Add(20 * time.Millisecond) {
			if !sleepUntil(fctx, at) {
				return
			}
			pending = slices.DeleteFunc(pending, func(id string) bool {
				if f.crash(id) {
					r.track.add(&r.track.crashed, 1)
					return true
				}
				return false
			})
		}
	})

	deadline := r.wallAt(end + r.cfg.Grace)
	silent := 2 * r.cfg.stallWall()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastProgress := time.Now()
	for {
		now := time.Now()
		over := !now.Before(r.wallAt(end))
		if over && r.track.settled(silent) || !now.Before(deadline) {
			break
		}
		if now.Sub(lastProgress) >= 5*time.Second {
			lastProgress = now
			r.progress(r.cfg.Progress, now)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			cancel()
			sched.Wait()
			r.wait()
			_, _ = f.end(context.Background())
			return nil, ctx.Err()
		}
	}
	r.track.finish(silent)
	r.progress(r.cfg.Progress, time.Now())
	cancel()
	sched.Wait()
	r.wait()
	ectx, ecancel := context.WithTimeout(context.Background(), time.Minute)
	defer ecancel()
	return f.end(ectx)
}

// wait waits for the fleet's goroutines, which end with the fleet's
// context; a call that ignores it is left behind after a while.
func (r *run) wait() {
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
}

// progress writes one line about where the run is.
func (r *run) progress(w io.Writer, now time.Time) {
	if w == nil {
		return
	}
	c := r.track.counts(r.plan)
	fmt.Fprintf(w, "%-10s t=%-6s tasks: %d done, %d lost, %d running, %d waiting of %d; calls sent %d\n",
		r.strategy, r.track.offset(now).Round(time.Second), c.done, c.lost, c.running, c.waiting, r.plan.Tasks, r.ledger.count())
}

// runStrategy runs one strategy against a fresh chaos server (or the real
// providers) and counts its figures.
func runStrategy(ctx context.Context, cfg Config, plan *Plan, strategy string) (Row, error) {
	var (
		srv                     *chaos.Server
		openaiURL, anthropicURL string
	)
	if cfg.Real == nil {
		var err error
		srv, err = chaos.New(cfg.Timeline, chaos.Options{Scale: cfg.Scale, Logger: cfg.Log})
		if err != nil {
			return Row{}, err
		}
		if err := srv.Start(ctx); err != nil {
			return Row{}, err
		}
		defer srv.Close()
		openaiURL, anthropicURL = srv.OpenAIBaseURL(ProviderOpenAI), srv.AnthropicBaseURL(ProviderAnthropic)
	} else {
		openaiURL, anthropicURL = cfg.Real.OpenAIBaseURL, cfg.Real.AnthropicBaseURL
	}
	start := time.Now()
	r := &run{cfg: cfg, plan: plan, strategy: strategy, start: start, track: newTracker(plan, start, cfg.Scale), ledger: newLedger(start, cfg.Scale)}
	var f fleet
	switch strategy {
	case StrategySDK:
		r.sdks = newSDKs(r.ledger, -1, openaiURL, anthropicURL, cfg.Real)
		f = newSDKFleet(r)
	case StrategyFailbus:
		r.sdks = newSDKs(r.ledger, 0, openaiURL, anthropicURL, cfg.Real)
		f = newBusFleet(r)
	default:
		return Row{}, fmt.Errorf("drill: unknown strategy %q", strategy)
	}
	bus, err := r.drive(ctx, f)
	if err != nil {
		return Row{}, fmt.Errorf("%s: %w", strategy, err)
	}
	elapsed := time.Since(start)
	log := r.ledger.clientLog()
	fromServer := srv != nil
	if fromServer {
		if err := srv.Close(); err != nil && !errors.Is(err, context.Canceled) {
			return Row{}, fmt.Errorf("%s: close the chaos provider: %w", strategy, err)
		}
		log = srv.Requests()
	}
	row := r.figures(log, fromServer, bus)
	row.Seconds = elapsed.Seconds()
	if cfg.Requests != nil {
		if err := r.writeRequests(cfg.Requests, log); err != nil {
			return row, fmt.Errorf("%s: write the requests: %w", strategy, err)
		}
	}
	return row, nil
}

// requestLine is one request of Config.Requests: the provider's record,
// what the fleet sent it for, and why it was wasted.
type requestLine struct {
	Strategy string `json:"strategy"`
	chaos.Request
	For    string `json:"for,omitempty"`
	Agent  string `json:"agent,omitempty"`
	Task   string `json:"task,omitempty"`
	Step   int    `json:"step,omitempty"`
	Wasted string `json:"wasted,omitempty"`
}

var requestsMu sync.Mutex

// writeRequests writes log, annotated, as JSON Lines.
func (r *run) writeRequests(w io.Writer, log chaos.Log) error {
	requestsMu.Lock()
	defer requestsMu.Unlock()
	enc := json.NewEncoder(w)
	for i, q := range log {
		in, _ := r.ledger.intent(q.Fingerprint)
		line := requestLine{Strategy: r.strategy, Request: q, For: in.Kind, Agent: in.Agent, Task: in.Task, Step: in.Step}
		if i < len(r.wasteOf) {
			line.Wasted = r.wasteOf[i]
		}
		if err := enc.Encode(line); err != nil {
			return err
		}
	}
	return nil
}
