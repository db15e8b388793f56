package bench

// `failbus bench --fleet`: the rates a fleet sees. A realistic mix and a
// retry storm are each stepped up in rate, every rate held for --hold; a
// rate is held when every service's backlog (each durable consumer on
// FAILBUS_OUTCOMES and FAILBUS_CLASSIFIED: nothing pending, nothing
// unacknowledged) drains within --drain of the end of the hold. Raw
// JetStream pipelines of two and three writes per outcome are searched
// the same way in the same run, and CPU per outcome is measured by kind.
// The bus is in this process, or an already running one (--server).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime/trace"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Defaults and bounds of the fleet mode.
const (
	fleetDefaultAgents      = 200
	fleetDefaultProviders   = 5
	fleetDefaultProfiles    = 3
	fleetDefaultOK          = 0.9
	fleetDefaultHold        = 30 * time.Second
	fleetDefaultDrain       = 5 * time.Second
	fleetDefaultLatencyHold = 10 * time.Second
	fleetDefaultStart       = 2000
	fleetDefaultMax         = 64000
	fleetDefaultBisect      = 2
	fleetDefaultCPUN        = 10000
	fleetDefaultCPURate     = 2000
	fleetDefaultCPURounds   = 3
	// fleetMinRate is the lowest rate the search tries.
	fleetMinRate = 50
	// fleetAchieved is the share of a rate the publisher must reach for
	// the rate to count as offered.
	fleetAchieved = 0.95
	// fleetMonitor is how often the backlog is read during a hold;
	// fleetDrainPoll how often after it, while the drain is timed.
	fleetMonitor   = 250 * time.Millisecond
	fleetDrainPoll = 10 * time.Millisecond
	// fleetAbandon: a hold stops early once the backlog is more than
	// this many times what the rate publishes in --drain (it could not
	// drain in time even at twice the rate), sparing the rest of the hold
	// and the long drain after it.
	fleetAbandon = 2
	// fleetStormRetryAfter is the storm's retry-after (fleetStormDelay)
	// and when raw/429's schedules fire after they are written.
	fleetStormRetryAfter = 30 * time.Second
	// fleetStormDue is when the storm's retries come due, with a margin.
	fleetStormDue = fleetStormRetryAfter + 5*time.Second
	// fleetIdle is how long the idle bus's CPU is measured.
	fleetIdle = 2 * time.Second
)

// Scratch streams of the raw pipelines: the outcome stream, the relayed
// write, the second relayed write and raw/429's retries, configured like
// the failbus streams whose writes they stand for.
const (
	fleetRawIn     = "BENCH_FLEET_IN"
	fleetRawInPfx  = "bench.fleet.in"
	fleetRawTwo    = "BENCH_FLEET_TWO"
	fleetRawTwoPfx = "bench.fleet.two"
	fleetRawThree  = "BENCH_FLEET_THREE"
	fleetRawThrPfx = "bench.fleet.three"
	// fleetRawRetries holds raw/429's ledger entries and schedules, and
	// the due messages JetStream writes when they fire.
	fleetRawRetries    = "BENCH_FLEET_RETRIES"
	fleetRawRetPfx     = "bench.fleet.retries"
	fleetRawDueSubject = fleetRawRetPfx + ".due.x"
	fleetRelayOne      = "bench-fleet-relay-1"
	fleetRelayTwo      = "bench-fleet-relay-2"
	fleetRawTwoName    = "raw/2"
	fleetRawThrName    = "raw/3"
	fleetRawOKName     = "raw/ok"
	fleetRaw429Name    = "raw/429"
)

// fleetBacklogStreams are the streams whose durable consumers must be
// caught up for the bus to have kept up: the outcomes and their
// classifications, upstream first (read in this order, an empty
// upstream means its outputs are already stored downstream).
var fleetBacklogStreams = []string{topology.StreamOutcomes, topology.StreamClassified}

// fleetConfig is the fleet mode's flags.
type fleetConfig struct {
	agents, providers, profiles int
	ok                          float64
	loads                       []string
	rates                       []int // an explicit ladder; nil: search
	start, maxRate, bisect      int
	hold, drain, latencyHold    time.Duration
	latencyRate                 int // 0: half the held rate
	cpuN, cpuRate, cpuRounds    int
	// cpuSettle is how long after the latest retried failure the CPU
	// phase starts (and each round after the first): its retry comes due
	// (a JetStream write) within it.
	cpuSettle time.Duration
	// tracePath: --trace, an execution trace of the first latency run.
	tracePath string
	window    int
	raw       bool
	metrics   string
}

// fleetRunner is one fleet run's state.
type fleetRunner struct {
	cfg      fleetConfig
	js       jetstream.JetStream // the bench's own connection
	dial     func(name string) (*nats.Conn, error)
	failed   <-chan struct{} // in process: closed when a service stops
	gen      *fleetGen
	run      string // unique per run: ids, sessions and budgets are new
	progress io.Writer
	pubErrs  atomic.Int64
	// cpu is the CPU time of the bus and the bench together so far;
	// cpuCovers says where it is read.
	cpu       func(ctx context.Context) (time.Duration, bool)
	cpuCovers string
	// backlog consumers of the bus, looked up once.
	busConsumers []fleetConsumer
	steps        int
	// retried is when the latest outcome whose retry comes due later
	// (a storm's 429) was published: the CPU phase waits for those
	// retries (JetStream's writes) before it measures anything.
	retried time.Time
	// traced: the latency run --trace covers has run.
	traced bool
	// rawDue is when raw/429's schedules fire after they are written
	// (0: fleetStormRetryAfter, as the storm's retries).
	rawDue time.Duration
}

// fleetConsumer is a durable consumer whose backlog counts.
type fleetConsumer struct {
	stream string
	c      jetstream.Consumer
}

// fleetStep is one rate held.
type fleetStep struct {
	RatePerS     int     `json:"rate_per_s"`
	AchievedPerS float64 `json:"achieved_per_s"`
	Published    int     `json:"published"`
	Held         bool    `json:"held"`
	// Abandoned: the hold stopped early, the backlog already beyond
	// draining in time.
	Abandoned bool `json:"abandoned,omitempty"`
	// HoldS is how long the load ran.
	HoldS float64 `json:"hold_s"`
	// DrainedS is when, after the hold's end, every backlog was empty;
	// -1 if it was not within the bench's wait.
	DrainedS float64 `json:"drained_s"`
	// MaxBacklog is the largest backlog read during the hold (pending +
	// unacknowledged over every counted consumer).
	MaxBacklog int `json:"max_backlog"`
	// Why a rate was not held.
	Why string `json:"why,omitempty"`
}

// fleetLoadResult is one load's search and its figures.
type fleetLoadResult struct {
	Name   string      `json:"name"`
	Agents int         `json:"agents"`
	Steps  []fleetStep `json:"steps"`
	// HeldPerS is the highest rate held (0: none).
	HeldPerS int `json:"held_per_s"`
	// Raw2Ratio and Raw3Ratio are HeldPerS over raw/2's and raw/3's.
	Raw2Ratio float64 `json:"raw2_ratio,omitempty"`
	Raw3Ratio float64 `json:"raw3_ratio,omitempty"`
	// Raw429Ratio is the storm's HeldPerS over raw/429's: the bus against
	// the least the contract writes for a retried failure.
	Raw429Ratio float64 `json:"raw429_ratio,omitempty"`
	// Latency at half HeldPerS (failbus loads).
	Latency *fleetLatency `json:"latency,omitempty"`
	// Counts over the whole load (steps and latency run).
	Counts *fleetCounts `json:"counts,omitempty"`
}

// fleetCounts add up a failbus load: what was published and what the bus
// stored for it.
type fleetCounts struct {
	Published int `json:"published"`
	// Stored is how many outcomes FAILBUS_OUTCOMES stored meanwhile
	// (its last sequence moved by), Classified the same of
	// FAILBUS_CLASSIFIED; anyone else's traffic on the bus adds to both.
	Stored     uint64 `json:"stored"`
	Classified uint64 `json:"classified"`
	// By kind, as published.
	Successes    int `json:"successes"`
	Retryable    int `json:"retryable_failures"`
	NotRetryable int `json:"non_retryable_failures"`
	Refusals     int `json:"content_refusals"`
	// DeadLetters stored on FAILBUS_DLQ meanwhile.
	DeadLetters uint64 `json:"dead_letters"`
}

// fleetLatency is decision latency at half the held rate.
type fleetLatency struct {
	RatePerS     int     `json:"rate_per_s"`
	AchievedPerS float64 `json:"achieved_per_s"`
	// Failbus: outcome published → its decision stored on
	// failbus.decision.<agent>, over the failures the scheduler decides
	// (not content refusals: the refusal tiers decide them).
	Failbus benchPercentiles `json:"failbus"`
	// Expected is how many such failures were published; Failbus.N how
	// many decisions were read.
	Expected int `json:"expected_decisions"`
	// Actions counts the decisions read, by action.
	Actions map[string]int `json:"actions"`
	// Raw3: the raw/3 pipeline at the same rate, publish → the second
	// relayed copy stored (zero without --fleet-raw).
	Raw3 benchPercentiles `json:"raw3"`
	// Hops splits Failbus by hop, each decided outcome's stored times
	// read back from the streams after the run (nil when they could not
	// be): publish → outcome stored, → classification stored, → decision
	// stored. Slowest is the same split of the slowest 1 % of decisions:
	// which hop the tail waited in, and whether it came in one burst.
	Hops    *benchHops `json:"hops,omitempty"`
	Slowest *fleetTail `json:"slowest,omitempty"`
}

// fleetTail is the slowest decisions of a latency run by hop.
type fleetTail struct {
	N int `json:"n"`
	// Mean milliseconds of each hop over them.
	PublishMS    float64 `json:"publish_ms"`
	ClassifierMS float64 `json:"classifier_ms"`
	SchedulerMS  float64 `json:"scheduler_ms"`
	// SpanMS is from the first of them published to the last: short
	// against the run, they came in one burst.
	SpanMS float64 `json:"span_ms"`
}

// slowestOf is the slowest 1 % (at least one) of each, sorted slowest
// last.
func slowestOf(each []hopsOfOne) *fleetTail {
	if len(each) == 0 {
		return nil
	}
	k := max(len(each)/100, 1)
	tail := each[len(each)-k:]
	var pub, cls, sch time.Duration
	first, last := tail[0].sent, tail[0].sent
	for _, h := range tail {
		pub, cls, sch = pub+h.pub, cls+h.cls, sch+h.sch
		if h.sent.Before(first) {
			first = h.sent
		}
		if h.sent.After(last) {
			last = h.sent
		}
	}
	n := time.Duration(k)
	return &fleetTail{N: k, PublishMS: ms(pub / n), ClassifierMS: ms(cls / n), SchedulerMS: ms(sch / n), SpanMS: ms(last.Sub(first))}
}

// hops reads back, after a latency run whose outcomes and
// classifications were stored after the stream sequences before, when
// each outcome col sent and its classification were stored, and splits
// the run's decisions by hop.
func (r *fleetRunner) hops(ctx context.Context, before [3]uint64, col *collector) (*benchHops, *fleetTail, error) {
	col.mu.Lock()
	sent, decided := maps.Clone(col.sent), maps.Clone(col.storedAt)
	col.mu.Unlock()
	outcome, classified, err := storedTimes(ctx, r.js,
		watch.Config{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, StartSeq: before[0] + 1, Filters: []string{events.OutcomePrefix + ".>"}},
		watch.Config{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, StartSeq: before[1] + 1},
		sent)
	if err != nil {
		return nil, nil, err
	}
	h, each, err := splitHops(sent, outcome, classified, decided)
	if err != nil {
		return nil, nil, err
	}
	return h, slowestOf(each), nil
}

// fleetCPU is CPU per outcome by kind.
type fleetCPU struct {
	Measured bool   `json:"measured"`
	Why      string `json:"why,omitempty"`
	// What the CPU time covers.
	Covers   string `json:"covers,omitempty"`
	N        int    `json:"n"`
	RatePerS int    `json:"rate_per_s"`
	Rounds   int    `json:"rounds"`
	// IdleMSPerS is the CPU the bus (and bench) spent per second with no
	// load, measured before the runs and subtracted from each.
	IdleMSPerS float64 `json:"idle_ms_per_s"`
	// Median µs per outcome (raw: per outcome of the pipeline).
	SuccessUS float64 `json:"success_us"`
	RetryUS   float64 `json:"retry_us"`
	NoRetryUS float64 `json:"no_retry_us"`
	Raw2US    float64 `json:"raw2_us,omitempty"`
	Raw3US    float64 `json:"raw3_us,omitempty"`
	// RawOKUS and Raw429US are the pipelines of the bus's own shape
	// (fleetraw.go): what a success and a retried failure cost at least.
	RawOKUS  float64 `json:"raw_ok_us,omitempty"`
	Raw429US float64 `json:"raw_429_us,omitempty"`
	// Each round's figures, in the order measured: success, no retry,
	// raw/2, raw/3, raw/ok and raw/429 (when measured), retry.
	RoundsUS [][]float64 `json:"rounds_us"`
}

// fleetReport is the fleet mode's result; --json prints it as is.
type fleetReport struct {
	Machine benchMachine `json:"machine"`
	// Bus: "in-process" or the server's URL.
	Bus    string            `json:"bus"`
	Params fleetParams       `json:"params"`
	Loads  []fleetLoadResult `json:"loads"`
	Raw    []fleetLoadResult `json:"raw,omitempty"`
	CPU    fleetCPU          `json:"cpu"`
	// ElapsedS is the whole run.
	ElapsedS float64 `json:"elapsed_s"`
}

// fleetParams are the run's settings.
type fleetParams struct {
	Agents     int      `json:"agents"`
	Providers  []string `json:"providers"`
	Profiles   int      `json:"profiles"`
	OK         float64  `json:"ok"`
	HoldS      float64  `json:"hold_s"`
	DrainS     float64  `json:"drain_s"`
	LatencyS   float64  `json:"latency_s"`
	Rates      []int    `json:"rates,omitempty"`
	StartRate  int      `json:"start_rate,omitempty"`
	MaxRate    int      `json:"max_rate,omitempty"`
	Bisect     int      `json:"bisect,omitempty"`
	Window     int      `json:"window"`
	Corpus     string   `json:"corpus"`
	CorpusRows int      `json:"corpus_rows"`
}

// fleetPipeline is what a rate is held through: how message i is built
// and what its backlog is.
type fleetPipeline struct {
	name string
	// prepare, when set, runs before each publish (the raw pipelines
	// start and stop their relays).
	prepare func() error
	// next builds message i of a step tagged tag.
	next func(tag string, i int, at events.Time) (*nats.Msg, string, fleetKind, error)
	// backlog is pending + unacknowledged over the pipeline's consumers.
	backlog func(ctx context.Context) (int, error)
	// reset runs after each step, drained (the raw pipelines purge
	// their scratch streams).
	reset func(ctx context.Context)
	// retries: some of its outcomes schedule a write that comes due
	// fleetStormDue after they are published (a retry, raw/429's
	// schedule), which the next load and CPU span wait out.
	retries bool
}

// fleet runs the loads, the raw pipelines, the latency runs and the CPU
// figures.
func (r *fleetRunner) fleet(ctx context.Context, rep *fleetReport) error {
	if err := r.lookupBusConsumers(ctx); err != nil {
		return err
	}
	var raw *fleetRaw
	if r.cfg.raw {
		var err error
		if raw, err = r.startRaw(ctx); err != nil {
			return err
		}
		defer raw.close(ctx)
	}
	for _, load := range r.cfg.loads {
		res, err := r.failbusLoad(ctx, load, raw)
		if err != nil {
			return fmt.Errorf("%s: %w", load, err)
		}
		rep.Loads = append(rep.Loads, res)
	}
	if raw != nil {
		// Raw searches start from the highest rate failbus held: raw is
		// expected above it.
		start := r.cfg.start
		for _, l := range rep.Loads {
			start = max(start, l.HeldPerS)
		}
		shapes := []fleetRawShape{rawTwo, rawThree}
		if slices.Contains(r.cfg.loads, loadStorm) {
			shapes = append(shapes, raw429)
		}
		for _, shape := range shapes {
			p := raw.pipeline(r, shape)
			if err := r.awaitRetriesDue(ctx, "the previous load's"); err != nil {
				return err
			}
			fmt.Fprintf(r.progress, "fleet: %s\n", p.name)
			steps, held, err := r.search(ctx, p, start)
			if err != nil {
				return fmt.Errorf("%s: %w", p.name, err)
			}
			rep.Raw = append(rep.Raw, fleetLoadResult{Name: p.name, Steps: steps, HeldPerS: held})
		}
		// held over raw's held rate of the pipeline called name (0: not
		// run, or nothing held).
		over := func(held int, name string) float64 {
			i := slices.IndexFunc(rep.Raw, func(r fleetLoadResult) bool { return r.Name == name })
			if i < 0 || rep.Raw[i].HeldPerS == 0 {
				return 0
			}
			return float64(held) / float64(rep.Raw[i].HeldPerS)
		}
		for i := range rep.Loads {
			l := &rep.Loads[i]
			l.Raw2Ratio, l.Raw3Ratio = over(l.HeldPerS, fleetRawTwoName), over(l.HeldPerS, fleetRawThrName)
			if l.Name == loadStorm {
				l.Raw429Ratio = over(l.HeldPerS, fleetRaw429Name)
			}
		}
	}
	cpu, err := r.cpuByKind(ctx, raw)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	rep.CPU = cpu
	return nil
}

// failbusLoad searches one load's highest held rate, then measures
// decision latency at half of it.
func (r *fleetRunner) failbusLoad(ctx context.Context, load string, raw *fleetRaw) (fleetLoadResult, error) {
	res := fleetLoadResult{Name: load, Agents: r.cfg.agents}
	counts := &fleetCounts{}
	before, err := r.lastSeqs(ctx)
	if err != nil {
		return res, err
	}
	p := r.busPipeline(load, counts)
	// The retries of the load before come due first: JetStream writing
	// them is not this load's work.
	if err := r.awaitRetriesDue(ctx, "the previous load's"); err != nil {
		return res, err
	}
	fmt.Fprintf(r.progress, "fleet: %s, %d agents\n", load, r.cfg.agents)
	res.Steps, res.HeldPerS, err = r.search(ctx, p, r.cfg.start)
	if err != nil {
		return res, err
	}
	rate := r.cfg.latencyRate
	if rate == 0 {
		rate = res.HeldPerS / 2
	}
	if rate > 0 && r.cfg.latencyHold > 0 {
		// The search's retries come due first: measured during the
		// latency run, a hold's burst of due retries (JetStream writing
		// up to rate × hold of them at once) would be its tail.
		if err := r.awaitRetriesDue(ctx, "the search's"); err != nil {
			return res, err
		}
		lat, err := r.latency(ctx, p, rate, raw)
		if err != nil {
			return res, fmt.Errorf("latency: %w", err)
		}
		res.Latency = lat
	}
	after, err := r.lastSeqs(ctx)
	if err != nil {
		return res, err
	}
	counts.Stored, counts.Classified, counts.DeadLetters = after[0]-before[0], after[1]-before[1], after[2]-before[2]
	res.Counts = counts
	return res, nil
}

// lastSeqs are the last sequences of FAILBUS_OUTCOMES, FAILBUS_CLASSIFIED
// and FAILBUS_DLQ.
func (r *fleetRunner) lastSeqs(ctx context.Context) ([3]uint64, error) {
	var out [3]uint64
	for i, name := range []string{topology.StreamOutcomes, topology.StreamClassified, topology.StreamDLQ} {
		s, err := r.js.Stream(ctx, name)
		if err != nil {
			return out, fmt.Errorf("stream %s: %w", name, err)
		}
		out[i] = s.CachedInfo().State.LastSeq
	}
	return out, nil
}

// busPipeline is load through the bus: outcomes on failbus.outcome.*,
// the backlog of every durable consumer on the outcome and classified
// streams. It counts what it publishes, by kind, into counts.
func (r *fleetRunner) busPipeline(load string, counts *fleetCounts) fleetPipeline {
	var mu sync.Mutex
	return fleetPipeline{
		name:    load,
		retries: load == loadStorm || load == loadRetry || load == loadMix,
		next: func(tag string, i int, at events.Time) (*nats.Msg, string, fleetKind, error) {
			m, id, kind, err := r.gen.msg(load, tag, i, at)
			if err == nil && counts != nil {
				mu.Lock()
				counts.Published++
				switch kind {
				case kindOK:
					counts.Successes++
				case kindRetry:
					counts.Retryable++
				case kindNoRetry:
					counts.NotRetryable++
				case kindRefusal:
					counts.Refusals++
				}
				mu.Unlock()
			}
			return m, id, kind, err
		},
		backlog: func(ctx context.Context) (int, error) { return backlogOf(ctx, r.busConsumers) },
		reset:   func(context.Context) {},
	}
}

// lookupBusConsumers finds the durable consumers of the backlog streams.
func (r *fleetRunner) lookupBusConsumers(ctx context.Context) error {
	for _, name := range fleetBacklogStreams {
		s, err := r.js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		lister := s.ListConsumers(ctx)
		for info := range lister.Info() {
			if info.Config.Durable == "" {
				continue // a reader's, not a service's
			}
			c, err := s.Consumer(ctx, info.Name)
			if err != nil {
				return fmt.Errorf("consumer %s/%s: %w", name, info.Name, err)
			}
			r.busConsumers = append(r.busConsumers, fleetConsumer{stream: name, c: c})
		}
		if err := lister.Err(); err != nil {
			return fmt.Errorf("consumers of %s: %w", name, err)
		}
	}
	if len(r.busConsumers) == 0 {
		return errors.New("no service consumes FAILBUS_OUTCOMES or FAILBUS_CLASSIFIED: are the services running?")
	}
	return nil
}

// backlogOf is pending + unacknowledged over cs, read in order.
func backlogOf(ctx context.Context, cs []fleetConsumer) (int, error) {
	total := 0
	for _, fc := range cs {
		info, err := fc.c.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("consumer %s/%s: %w", fc.stream, fc.c.CachedInfo().Name, err)
		}
		total += int(info.NumPending) + info.NumAckPending
	}
	return total, nil
}

// search finds the highest rate p holds: --fleet-rates in order until
// one is not held, or from start doubling while held (halving while not),
// then --bisect steps between the highest held and the lowest not held.
func (r *fleetRunner) search(ctx context.Context, p fleetPipeline, start int) (steps []fleetStep, held int, err error) {
	try := func(rate int) (bool, error) {
		st, err := r.step(ctx, p, rate)
		if err != nil {
			return false, err
		}
		steps = append(steps, st)
		mark := "held"
		if !st.Held {
			mark = "not held: " + st.Why
		}
		fmt.Fprintf(r.progress, "  %s at %d/s: achieved %s/s, max backlog %d, drained %s after the hold; %s\n",
			p.name, rate, human(st.AchievedPerS), st.MaxBacklog, fmtDrain(st.DrainedS), mark)
		if st.Held {
			held = max(held, rate)
		}
		return st.Held, nil
	}
	if len(r.cfg.rates) > 0 {
		for _, rate := range r.cfg.rates {
			ok, err := try(rate)
			if err != nil || !ok {
				return steps, held, err
			}
		}
		return steps, held, nil
	}
	lo, hi := 0, 0 // highest held, lowest not held
	rate := min(max(start, fleetMinRate), r.cfg.maxRate)
	for lo == 0 || hi == 0 {
		ok, err := try(rate)
		if err != nil {
			return steps, held, err
		}
		if ok {
			lo = rate
			if hi == 0 {
				if rate >= r.cfg.maxRate {
					return steps, held, nil
				}
				rate = min(2*rate, r.cfg.maxRate)
			}
		} else {
			hi = rate
			if lo == 0 {
				if rate/2 < fleetMinRate {
					return steps, held, nil
				}
				rate /= 2
			}
		}
	}
	for range r.cfg.bisect {
		mid := roundRate((lo + hi) / 2)
		if mid <= lo || mid >= hi {
			break
		}
		ok, err := try(mid)
		if err != nil {
			return steps, held, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid
		}
	}
	return steps, held, nil
}

// roundRate rounds a rate to two significant digits.
func roundRate(v int) int {
	unit := 1
	for v/unit >= 100 {
		unit *= 10
	}
	return (v + unit/2) / unit * unit
}

func fmtDrain(s float64) string {
	if s < 0 {
		return "never (within the wait)"
	}
	return strconv.FormatFloat(s, 'f', 2, 64) + "s"
}

// step holds rate through p for --hold and times the drain after it.
func (r *fleetRunner) step(ctx context.Context, p fleetPipeline, rate int) (fleetStep, error) {
	r.steps++
	tag := r.run + "-" + p.name + "-" + strconv.Itoa(r.steps)
	st := fleetStep{RatePerS: rate, DrainedS: -1}
	limit := max(fleetAbandon*float64(rate)*r.cfg.drain.Seconds(), 1000)
	var (
		abandon    atomic.Bool
		maxBacklog atomic.Int64
		monErr     error
		wg         sync.WaitGroup
	)
	mctx, stopMonitor := context.WithCancel(ctx)
	wg.Go(func() {
		tick := time.NewTicker(fleetMonitor)
		defer tick.Stop()
		for {
			select {
			case <-mctx.Done():
				return
			case <-tick.C:
			}
			b, err := p.backlog(mctx)
			if err != nil {
				if mctx.Err() == nil {
					monErr = err
				}
				return
			}
			if int64(b) > maxBacklog.Load() {
				maxBacklog.Store(int64(b))
			}
			if float64(b) > limit {
				abandon.Store(true)
			}
		}
	})
	errsBefore := r.pubErrs.Load()
	sent, elapsed, err := r.publish(ctx, p, tag, rate, r.cfg.hold, &abandon, nil)
	holdEnd := time.Now()
	stopMonitor()
	wg.Wait()
	if err != nil {
		return st, err
	}
	if monErr != nil {
		return st, fmt.Errorf("backlog: %w", monErr)
	}
	st.Published, st.HoldS = sent, elapsed.Seconds()
	st.AchievedPerS = float64(sent) / elapsed.Seconds()
	st.Abandoned = abandon.Load()
	drained, err := r.drain(ctx, p, holdEnd)
	if err != nil {
		return st, err
	}
	st.DrainedS = drained.Seconds()
	if b, _ := p.backlog(ctx); b > int(maxBacklog.Load()) {
		maxBacklog.Store(int64(b))
	}
	st.MaxBacklog = int(maxBacklog.Load())
	errs := r.pubErrs.Load() - errsBefore
	switch {
	case errs > 0:
		st.Why = fmt.Sprintf("%d publishes failed", errs)
	case st.Abandoned:
		st.Why = fmt.Sprintf("stopped after %.1fs: backlog above %.0f", st.HoldS, limit)
	case st.AchievedPerS < fleetAchieved*float64(rate):
		st.Why = fmt.Sprintf("the publisher reached %s/s only", human(st.AchievedPerS))
	case drained > r.cfg.drain:
		st.Why = fmt.Sprintf("drained %.1fs late", (drained - r.cfg.drain).Seconds())
	default:
		st.Held = true
	}
	p.reset(ctx)
	return st, nil
}

// publish publishes p's messages paced at rate for d (async, the bench's
// window), until stop is set; sent is called with each message's id,
// kind and publish time. It returns how many were published and over how
// long.
func (r *fleetRunner) publish(ctx context.Context, p fleetPipeline, tag string, rate int, d time.Duration, stop *atomic.Bool,
	sent func(id string, kind fleetKind, at time.Time)) (int, time.Duration, error) {
	if p.prepare != nil {
		if err := p.prepare(); err != nil {
			return 0, 0, err
		}
	}
	total := max(int(float64(rate)*d.Seconds()), 1)
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	if p.retries {
		defer func() { r.retried = time.Now() }()
	}
	n := 0
	for n < total {
		if stop != nil && stop.Load() {
			break
		}
		if err := ctx.Err(); err != nil {
			return n, time.Since(start), err
		}
		select {
		case <-r.failed:
			return n, time.Since(start), errors.New("a service stopped")
		default:
		}
		now := time.Now()
		due := min(int(now.Sub(start)/interval)+1, total)
		if n >= due {
			time.Sleep(start.Add(time.Duration(n) * interval).Sub(now)) // pacing the load, not a test
			continue
		}
		at := events.At(now)
		for ; n < due; n++ {
			m, id, kind, err := p.next(tag, n, at)
			if err != nil {
				return n, time.Since(start), err
			}
			if sent != nil {
				sent(id, kind, time.Now())
			}
			if _, err := r.js.PublishMsgAsync(m, benchStall); err != nil {
				return n, time.Since(start), fmt.Errorf("publish to %s: %w", m.Subject, err)
			}
		}
	}
	return n, time.Since(start), nil
}

// drain waits until every publish is acknowledged and p's backlog is
// empty, and returns how long after from that was (bounded by benchWait).
func (r *fleetRunner) drain(ctx context.Context, p fleetPipeline, from time.Time) (time.Duration, error) {
	wctx, cancel := context.WithTimeout(ctx, benchWait)
	defer cancel()
	select {
	case <-r.js.PublishAsyncComplete():
	case <-wctx.Done():
		return 0, fmt.Errorf("publishes unacknowledged after %v: %w", benchWait, wctx.Err())
	}
	tick := time.NewTicker(fleetDrainPoll)
	defer tick.Stop()
	for {
		b, err := p.backlog(wctx)
		if err != nil {
			return 0, fmt.Errorf("backlog: %w", err)
		}
		if b == 0 {
			return time.Since(from), nil
		}
		select {
		case <-tick.C:
		case <-r.failed:
			return 0, errors.New("a service stopped")
		case <-wctx.Done():
			return 0, fmt.Errorf("backlog of %d not drained after %v: %w", b, benchWait, wctx.Err())
		}
	}
}

// latency publishes load at rate for --latency-hold and collects each
// decided failure's publish → decision stored; then raw/3 at the same
// rate (publish → second relayed copy stored).
func (r *fleetRunner) latency(ctx context.Context, p fleetPipeline, rate int, raw *fleetRaw) (*fleetLatency, error) {
	fmt.Fprintf(r.progress, "  %s: decision latency at %d/s for %v\n", p.name, rate, r.cfg.latencyHold)
	out := &fleetLatency{RatePerS: rate, Actions: map[string]int{}}
	col := newCollector(-1)
	var mu sync.Mutex
	w, err := watch.Start(ctx, r.js, watch.Config{Stream: topology.StreamDecisions, Filters: []string{events.DecisionPrefix + ".>"}, Follow: true,
		DeliverPolicy: jetstream.DeliverNewPolicy}, col.byDecision(func(d *events.Decision) {
		mu.Lock()
		out.Actions[d.Action]++
		mu.Unlock()
	}))
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	before, err := r.lastSeqs(ctx)
	if err != nil {
		return nil, err
	}
	r.steps++
	tag := r.run + "-" + p.name + "-lat-" + strconv.Itoa(r.steps)
	stopTrace, err := r.startTrace()
	if err != nil {
		return nil, err
	}
	sent, elapsed, err := r.publish(ctx, p, tag, rate, r.cfg.latencyHold, nil, func(id string, kind fleetKind, at time.Time) {
		if kind == kindRetry || kind == kindNoRetry {
			col.markSent(id, at)
		}
	})
	if terr := stopTrace(); terr != nil && err == nil {
		err = terr
	}
	if err != nil {
		return nil, err
	}
	out.AchievedPerS = float64(sent) / elapsed.Seconds()
	if _, err := r.drain(ctx, p, time.Now()); err != nil {
		return nil, err
	}
	out.Expected = col.expected()
	// Drained: every decision is stored; wait for the reader to see them.
	if err := waitFor(ctx, benchWait, func() bool { return col.count() >= out.Expected }); err != nil {
		return nil, fmt.Errorf("%d of %d decisions read: %w", col.count(), out.Expected, err)
	}
	mu.Lock()
	out.Failbus = percentiles(col.collected())
	mu.Unlock()
	if out.Hops, out.Slowest, err = r.hops(ctx, before, col); err != nil {
		fmt.Fprintf(r.progress, "  %s: no split by hop: %v\n", p.name, err)
	}
	if raw != nil {
		s, err := raw.latency(ctx, r, rate)
		if err != nil {
			return nil, fmt.Errorf("raw/3: %w", err)
		}
		out.Raw3 = percentiles(s)
	}
	return out, nil
}

// startTrace starts the execution trace of --trace for the first latency
// run (the publish span at a rate the bus holds: where its tail comes
// from), once per run; stop writes it. Without --trace, or after the
// first, both do nothing.
func (r *fleetRunner) startTrace() (stop func() error, err error) {
	if r.cfg.tracePath == "" || r.traced {
		return func() error { return nil }, nil
	}
	r.traced = true
	f, err := os.Create(r.cfg.tracePath)
	if err != nil {
		return nil, fmt.Errorf("--trace: %w", err)
	}
	if err := trace.Start(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("--trace: %w", err)
	}
	fmt.Fprintf(r.progress, "  tracing this latency run to %s\n", r.cfg.tracePath)
	return func() error {
		trace.Stop()
		return f.Close()
	}, nil
}

// waitFor polls cond every benchPoll until it holds or limit passes.
func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	return waitEvery(ctx, limit, benchPoll, cond)
}

// waitEvery polls cond every interval until it holds or limit passes.
func waitEvery(ctx context.Context, limit, interval time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// cpuByKind measures CPU per outcome of successes only, failures with a
// retry, failures without, and the raw pipelines: each --cpu-n outcomes
// paced at --cpu-rate, from the first publish until drained; the median
// of --cpu-rounds rounds.
func (r *fleetRunner) cpuByKind(ctx context.Context, raw *fleetRaw) (fleetCPU, error) {
	out := fleetCPU{N: r.cfg.cpuN, RatePerS: r.cfg.cpuRate, Rounds: r.cfg.cpuRounds, Covers: r.cpuCovers}
	if _, ok := r.cpu(ctx); !ok {
		out.Why = "the bus's CPU time is unknown: give --metrics with the bus's /metrics (process_cpu_seconds_total)"
		if r.cfg.metrics != "" {
			out.Why = "no process_cpu_seconds_total at " + r.cfg.metrics
		}
		return out, nil
	}
	if r.cfg.cpuN == 0 || r.cfg.cpuRounds == 0 {
		out.Why = "--cpu-n 0"
		return out, nil
	}
	// The 429s last in each round, and the next round only once their
	// retries came due (fleetStormDelay later): the due retries are
	// JetStream's writes, not the next kind's.
	pipes := []fleetPipeline{r.busPipeline(loadSuccess, nil), r.busPipeline(loadNoRetry, nil)}
	if raw != nil {
		pipes = append(pipes, raw.pipeline(r, rawTwo), raw.pipeline(r, rawThree), raw.pipeline(r, rawOK), raw.pipeline(r, raw429))
	}
	pipes = append(pipes, r.busPipeline(loadRetry, nil))
	d := time.Duration(float64(r.cfg.cpuN) / float64(r.cfg.cpuRate) * float64(time.Second))
	// The loads' retries come due first: measured idle, they would count
	// as the bus's own idle work (and be subtracted from every span).
	if err := r.awaitRetriesDue(ctx, "the loads'"); err != nil {
		return out, err
	}
	// What the bus spends with no load (the services' polls and timers,
	// the server's housekeeping), subtracted from each span: at a paced
	// rate it would otherwise count per outcome.
	i0, _ := r.cpu(ctx)
	t0 := time.Now()
	select {
	case <-time.After(min(fleetIdle, d)): // measuring the idle bus, not a test
	case <-ctx.Done():
		return out, ctx.Err()
	}
	i1, _ := r.cpu(ctx)
	idle := float64(i1-i0) / float64(time.Since(t0)) // CPU seconds per second
	out.IdleMSPerS = idle * 1e3
	for round := range r.cfg.cpuRounds {
		us := make([]float64, len(pipes))
		if round > 0 {
			if err := r.awaitRetriesDue(ctx, "the last round's"); err != nil {
				return out, err
			}
		}
		for i, p := range pipes {
			c0, _ := r.cpu(ctx)
			t0 := time.Now()
			r.steps++
			tag := r.run + "-cpu-" + p.name + "-" + strconv.Itoa(r.steps)
			n, _, err := r.publish(ctx, p, tag, r.cfg.cpuRate, d, nil, nil)
			if err != nil {
				return out, err
			}
			if _, err := r.drain(ctx, p, time.Now()); err != nil {
				return out, err
			}
			c1, ok := r.cpu(ctx)
			if !ok {
				out.Why = "the bus's CPU time could not be read during the run"
				return out, nil
			}
			spent := float64(c1-c0) - idle*float64(time.Since(t0))
			us[i] = spent / 1e3 / float64(n)
			p.reset(ctx)
		}
		fmt.Fprintf(r.progress, "fleet: CPU round %d/%d: µs per outcome %v\n", round+1, r.cfg.cpuRounds, roundAll(us))
		out.RoundsUS = append(out.RoundsUS, us)
	}
	med := make([]float64, len(pipes))
	for i := range pipes {
		v := make([]float64, len(out.RoundsUS))
		for j := range out.RoundsUS {
			v[j] = out.RoundsUS[j][i]
		}
		med[i] = median(v)
	}
	out.Measured = true
	out.SuccessUS, out.NoRetryUS, out.RetryUS = med[0], med[1], med[len(med)-1]
	if raw != nil {
		out.Raw2US, out.Raw3US, out.RawOKUS, out.Raw429US = med[2], med[3], med[4], med[5]
	}
	return out, nil
}

// awaitRetriesDue waits until --cpu-settle after the latest retried
// failure published (whose, for the progress line): its retry has come
// due by then, a JetStream write kept out of the next CPU span.
func (r *fleetRunner) awaitRetriesDue(ctx context.Context, whose string) error {
	wait := time.Until(r.retried.Add(r.cfg.cpuSettle))
	if wait <= 0 {
		return nil
	}
	fmt.Fprintf(r.progress, "fleet: %.0fs for %s retries to come due\n", wait.Seconds(), whose)
	select {
	case <-time.After(wait): // keeping JetStream's due writes out of the next span, not a test
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func roundAll(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(int(x*10+0.5)) / 10
	}
	return out
}

// median of v (v is sorted in place).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if m := len(v) / 2; len(v)%2 == 1 {
		return v[m]
	} else {
		return (v[m-1] + v[m]) / 2
	}
}
