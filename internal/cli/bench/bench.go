package bench

// `failbus bench`: how fast the bus is, measured against raw JetStream on
// the same embedded server in the same run, so the figures are ratios a
// reader can trust on any machine rather than absolute numbers that only
// held on ours. Speed is measured here and in Go benchmarks, never asserted
// in a test.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/service/classifier"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// Defaults of `failbus bench`: together a few minutes on a 2-core machine.
const (
	benchDefaultN        = 10000
	benchDefaultRounds   = 5
	benchDefaultK        = 2000
	benchDefaultWindow   = 256
	benchDefaultDelayMin = time.Second
	benchDefaultDelayMax = 5 * time.Second
)

// Bounds of one bench run.
const (
	// benchTimeout bounds the whole run.
	benchTimeout = 15 * time.Minute
	// benchWait bounds one wait for the bus (a stream to fill, the services
	// to catch up, a schedule to fire after its due time).
	benchWait = 3 * time.Minute
	// benchPoll is how often stream and consumer state is polled while a
	// measurement runs: small against the seconds a round takes.
	benchPoll = 5 * time.Millisecond
	// benchClassifyMin is how long the pure classification loop runs per
	// round, at least.
	benchClassifyMin = 300 * time.Millisecond
	// benchStallWait is how long an async publish may wait for a free slot
	// in the window before it is an error.
	benchStallWait = time.Minute
)

// benchStall is the option every bench publish waits for a slot with,
// made once like the services' (an option is a closure: the bench's
// publisher runs inside the measured spans).
var benchStall = jetstream.WithStallWait(benchStallWait)

// Names the bench uses: scratch streams for the raw baselines, and the
// agents and provider of its own outcomes (a provider no corpus row names,
// so the ingest rounds' fault scope cannot hold the retries back).
const (
	benchRawStream   = "BENCH_RAW"
	benchRawPrefix   = "bench.raw"
	benchRelayStream = "BENCH_RELAY"
	benchRelayPrefix = "bench.relay"
	benchSchedStream = "BENCH_SCHED"
	benchSchedPrefix = "bench.sched"
	benchAgent       = "bench-agent"
	benchRetryAgent  = "bench-retry"
	benchProvider    = "bench-llm"
)

// benchSessions is how many sessions the bench's outcomes are spread
// over: the scheduler keeps one session's outcomes of a provider in order
// on one worker, and a storm comes from many sessions.
const benchSessions = 64

// benchPolicy is the policy of the bench's bus: the default with a max_delay
// (and so episode_idle) of an hour, for the --pending retries.
const benchPolicy = "retry:\n  max_delay: 1h\n  episode_idle: 1h\n"

// benchDefaultCorpus is the classification corpus, relative to the module
// root.
var benchDefaultCorpus = filepath.Join("internal", "policy", "classify", "testdata", "corpus.jsonl")

// benchModule is the module path that marks the module root.
const benchModule = "github.com/failbus/failbus"

// benchConsumers are the durable consumers the in-process services read:
// the bus has settled when none of them has anything pending or unacked.
var benchConsumers = []struct{ stream, name string }{
	{topology.StreamOutcomes, topology.ConsumerClassifier},
	{topology.StreamOutcomes, topology.ConsumerRefusalBoundaries},
	{topology.StreamClassified, topology.ConsumerScheduler},
	{topology.StreamClassified, topology.ConsumerRefusals},
	{topology.StreamNotify, topology.ConsumerNotifier},
	{topology.StreamRetries, topology.ConsumerSchedulerControl},
	{topology.StreamHealth, topology.ConsumerRecovery},
}

// Command is `failbus bench`.
var Command = cli.Command{Name: "bench", Summary: "measure throughput and retry lateness against raw JetStream on a temporary embedded bus", Run: run}

const benchUsage = `[--n N] [--rounds R] [--k K] [--rates R1,R2] [--pending P] [--nodes 1|3|5] [--json]

Measures failbus against raw JetStream on one embedded nats-server (file
store in a temporary folder; --nodes 3: three of them in a cluster, every
stream at 3 replicas) with every service in this process, in one run,
so the ratios hold whatever the machine:

  1. raw JetStream: N msgpack outcomes published async with Nats-Msg-Id to a
     scratch stream configured like FAILBUS_OUTCOMES, then read back by a
     pull consumer that acks each, then relayed the way the classifier runs
     (as many at a time as the classifier: publish, wait for the ack,
     double-ack);
     the plumbing: the same N again through the bus's shape on failbus's
     consumer runner with the policy taken out (classify, then a ledger
     entry, a schedule and a decision per retry or a decision otherwise),
     until its last stage has acknowledged every one: what JetStream and the runner cost for an outcome's
     messages, so "every service caught up" over it is what failbus's own
     work costs;
  2. failbus ingest: the same N outcomes on failbus.outcome.*, until
     FAILBUS_CLASSIFIED holds their N classifications, and until every
     service has caught up (scheduler decisions, refusal tiers), as ratios
     to raw publish + consume;
  3. classify only: classify.Classify over the classification corpus on one
     goroutine (per core);
  4. scheduled-retry lateness: K raw JetStream "@at" schedules, then K 429
     outcomes with retry-after-ms through the classifier and scheduler, due
     --delay-min to --delay-max ahead; p50 and p99 of stored time − due time;
  5. decision latency at each --rates rate (paced for --rate-seconds): a raw
     relay's publish → relayed copy stored, and failbus's outcome published
     → decision stored, p50 and p99, and failbus's by hop (outcome stored,
     classification stored, decision stored: read back from the streams
     after the run);
  6. --pending retries through failbus and as many raw "@at" schedules, due
     in 50 minutes (the bench's bus allows retries an hour ahead): the
     process's RSS and Go heap before and after, the live heap split by
     who allocated it (nats-server, scheduler, runner, other services,
     bench, other; from the runtime's heap profile), then lateness (4)
     again with them pending.

Every bench outcome is the first failure of its own step (its own retry
budget), spread over 64 sessions, as in a storm over many agents. raw/3 is raw publish ÷ 3: an
outcome costs at least three stream writes (outcome, classification,
decision).

The report ends with the bus's performance goals (ingest and catch-up
against raw/3, decision p99 at 5000/s, retry lateness and scheduler
memory with 100000 retries pending) judged against the run: met, not
met, or not measured when the flags leave one out (the latency goal needs
5000 in --rates, the last two --pending 100000).

Throughput figures are the median of R rounds; raw and failbus alternate
within each round so a noisy machine slows both. Progress goes to stderr.
The defaults take a few minutes on 2 cores (--pending 0 skips the longest part).
` + fleetUsage

// benchConfig is `failbus bench`'s flags.
type benchConfig struct {
	n, rounds, k, window int
	delayMin, delayMax   time.Duration
	corpus               string
	rates                []int
	rateSeconds          float64
	pending              int
	// nodes: --nodes, the servers the bus runs on.
	nodes        int
	memProfile   string
	blockProfile string
	// cpuProfileFailbus: --cpuprofile-failbus.
	cpuProfileFailbus string
	// allocProfileFailbus: --allocprofile-failbus.
	allocProfileFailbus string
}

// run is `failbus bench`.
func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("bench", benchUsage, stderr)
	var c benchConfig
	fs.IntVar(&c.n, "n", benchDefaultN, "outcomes per round")
	fs.IntVar(&c.rounds, "rounds", benchDefaultRounds, "rounds; throughput is their median")
	fs.IntVar(&c.k, "k", benchDefaultK, "scheduled retries, raw and through failbus, for the lateness figures")
	fs.IntVar(&c.window, "window", benchDefaultWindow, "async publishes in flight at most")
	fs.DurationVar(&c.delayMin, "delay-min", benchDefaultDelayMin, "earliest due time of a scheduled retry, after its publish")
	fs.DurationVar(&c.delayMax, "delay-max", benchDefaultDelayMax, "latest due time of a scheduled retry, after its publish")
	fs.StringVar(&c.corpus, "corpus", "", "outcome JSON Lines to classify and ingest (default: "+filepath.ToSlash(benchDefaultCorpus)+" under the module root, else a built-in mix)")
	rates := fs.String("rates", "1000,5000,10000", "outcomes/s at which decision latency is measured (comma-separated; empty for none)")
	fs.Float64Var(&c.rateSeconds, "rate-seconds", 2, "seconds of load at each --rates rate")
	fs.IntVar(&c.pending, "pending", 100000, "retries pending through failbus (and raw @at schedules) while lateness and memory are measured again; 0 skips it")
	fs.IntVar(&c.nodes, "nodes", 1, "servers the bus runs on: 1, or 3 (or 5) in-process nodes routed as a cluster on loopback, every stream at that many replicas, the raw baselines' too (server message counts are the first node's)")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	verbose := fs.Bool("verbose", false, "print the services' logs on stderr")
	blockProfile := fs.String("blockprofile", "", "write a profile of where goroutines waited (channels, locks, replies) over the whole run to this file, for go tool pprof (written at the end, as --memprofile): a bus that waits on round trips shows them here, not in --cpuprofile")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (bus, services and load) to this file, for go tool pprof; go tool pprof -tags FILE splits it by the label failbus: nats-server, each service, admin and bench (the load and the raw JetStream client), the rest (no label) being the Go runtime's own work, mostly garbage collection")
	fs.StringVar(&c.allocProfileFailbus, "allocprofile-failbus", "", "write the heap allocations of the first round's failbus step (the same span as --cpuprofile-failbus) to this file, and those before it to this file + .base: go tool pprof -sample_index=alloc_objects -base FILE.base FILE")
	fs.StringVar(&c.cpuProfileFailbus, "cpuprofile-failbus", "", "write a CPU profile of the first round's failbus step only (from the first outcome published until every service caught up: no raw phase, no plumbing) to this file, for go tool pprof -tags; not with --cpuprofile")
	memProfile := fs.String("memprofile", "", "write a heap profile at the end of the run (with --pending: the retries still pending) to this file, for go tool pprof -sample_index=inuse_space")
	ff := registerFleetFlags(fs)
	if rest, code, done := cli.Parse(fs, args); done {
		return code
	} else if len(rest) > 0 {
		return cli.UsageError(fs, stderr, "unexpected arguments %q", rest)
	}
	fc, server, err := ff.config(fs, c.window)
	switch {
	case err != nil:
		return cli.UsageError(fs, stderr, "%v", err)
	case *ff.fleet && (c.cpuProfileFailbus != "" || c.allocProfileFailbus != "" || *memProfile != "" || *blockProfile != ""):
		return cli.UsageError(fs, stderr, "--fleet writes a profile with --cpuprofile (the whole run) or an execution trace with --trace; the other profiles are the throughput bench's")
	case *ff.fleet:
		stopProfile, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "failbus bench: %v\n", err)
			return 1
		}
		defer stopProfile()
		return fleetMain(fc, ff, server, c.corpus, *asJSON, *verbose, stdout, stderr)
	case server:
		return cli.UsageError(fs, stderr, "--server drives a running bus in the fleet mode only: add --fleet")
	}
	for _, f := range strings.Split(*rates, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			return cli.UsageError(fs, stderr, "--rates: %q is not a positive number of outcomes per second", f)
		}
		c.rates = append(c.rates, v)
	}
	if c.nodes != 1 && c.nodes != 3 && c.nodes != 5 {
		return cli.UsageError(fs, stderr, "--nodes %d: 1, 3 or 5", c.nodes)
	}
	if c.rateSeconds <= 0 || c.pending < 0 {
		return cli.UsageError(fs, stderr, "--rate-seconds must be positive and --pending at least 0")
	}
	maxDelay := policy.Default().Retry.MaxDelay
	switch {
	case c.n < 1 || c.rounds < 1 || c.k < 1 || c.window < 1:
		return cli.UsageError(fs, stderr, "--n, --rounds, --k and --window must be at least 1")
	case c.delayMin <= 0 || c.delayMax < c.delayMin:
		return cli.UsageError(fs, stderr, "need 0 < --delay-min <= --delay-max")
	case *cpuProfile != "" && c.cpuProfileFailbus != "":
		return cli.UsageError(fs, stderr, "--cpuprofile and --cpuprofile-failbus cannot run together (one CPU profile at a time)")
	case c.delayMax > maxDelay:
		// Above max_delay the default policy gives up instead of retrying.
		return cli.UsageError(fs, stderr, "--delay-max %v is above the default policy's retry max_delay %v", c.delayMax, maxDelay)
	}
	log := zerolog.Nop()
	if *verbose {
		log = cli.ConsoleLogger(stderr)
	}
	corpus, source, err := loadBenchCorpus(c.corpus)
	if err != nil {
		fmt.Fprintf(stderr, "failbus bench: %v\n", err)
		return 1
	}
	stopProfile, err := startCPUProfile(*cpuProfile)
	if err != nil {
		fmt.Fprintf(stderr, "failbus bench: %v\n", err)
		return 1
	}
	defer stopProfile()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, benchTimeout)
	defer cancel()
	c.memProfile, c.blockProfile = *memProfile, *blockProfile
	var rep *benchReport
	// The load's goroutines carry failbus=bench; the bus labels the
	// server's and each service's (devbus).
	pprof.Do(ctx, pprof.Labels("failbus", "bench"), func(ctx context.Context) {
		rep, err = bench(ctx, c, corpus, source, log, stderr)
	})
	if err != nil {
		fmt.Fprintf(stderr, "failbus bench: %v\n", err)
		return 1
	}
	return writeReport(stdout, stderr, *asJSON, rep, func(w io.Writer) { printBench(w, rep) })
}

// writeReport prints a run's report: as one indented JSON object with
// --json, else as print's tables; the exit code.
func writeReport(stdout, stderr io.Writer, asJSON bool, rep any, print func(io.Writer)) int {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			fmt.Fprintf(stderr, "failbus bench: %v\n", err)
			return 1
		}
		return 0
	}
	print(stdout)
	return 0
}

// benchReport is the result of one run; --json prints it as is.
type benchReport struct {
	Machine benchMachine `json:"machine"`
	Params  benchParams  `json:"params"`
	// Rounds are the throughput figures of each round, in order.
	Rounds []benchRound `json:"rounds"`
	// Median holds the median of each figure over the rounds (ratios
	// included: the median of the per-round ratios).
	Median benchRound `json:"median"`
	// Min and Max bound each figure over the rounds.
	Min      benchRound    `json:"min"`
	Max      benchRound    `json:"max"`
	Lateness benchLateness `json:"lateness"`
	// Latency is publish → stored at each --rates rate, raw relay and
	// failbus decision side by side.
	Latency []benchLatency `json:"latency,omitempty"`
	// Pending is the run with --pending retries pending (nil with 0).
	Pending *benchPending `json:"pending,omitempty"`
	// Goals are the performance goals judged against this run (goals.go).
	Goals []benchGoal `json:"goals"`
	// ElapsedS is the whole run, bus start-up included.
	ElapsedS float64 `json:"elapsed_s"`
}

// benchMachine says where the figures come from.
type benchMachine struct {
	GOOS        string `json:"goos"`
	GOARCH      string `json:"goarch"`
	CPU         string `json:"cpu,omitempty"`
	NumCPU      int    `json:"num_cpu"`
	GOMAXPROCS  int    `json:"gomaxprocs"`
	GoVersion   string `json:"go_version"`
	NATSServer  string `json:"nats_server"`
	StoreFolder string `json:"store"`
}

// benchParams are the sizes the run used.
type benchParams struct {
	N          int     `json:"n"`
	Rounds     int     `json:"rounds"`
	K          int     `json:"k"`
	Window     int     `json:"window"`
	DelayMinS  float64 `json:"delay_min_s"`
	DelayMaxS  float64 `json:"delay_max_s"`
	Corpus     string  `json:"corpus"`
	CorpusRows int     `json:"corpus_rows"`
	// Nodes is how many servers the bus ran on (--nodes); every stream,
	// the raw baselines' included, has as many replicas.
	Nodes int `json:"nodes"`
}

// benchRound is one round's throughput figures, per second.
type benchRound struct {
	// RawPublish: messages/s stored by async publishes with Nats-Msg-Id,
	// every ack received.
	RawPublish float64 `json:"raw_publish_per_s"`
	// RawConsume: messages/s a pull consumer received and acked (acks
	// processed by the server).
	RawConsume float64 `json:"raw_consume_per_s"`
	// RawPipeline: N / (publish time + consume time).
	RawPipeline float64 `json:"raw_publish_consume_per_s"`
	// RawRelay: messages/s through a raw relay shaped like the classifier
	// on the consumer runner: classifier.DefaultConcurrency messages at a
	// time, each published (waiting for its ack) to a stream configured
	// like FAILBUS_CLASSIFIED, then double-acked.
	RawRelay float64 `json:"raw_relay_per_s"`
	// Plumbing: outcomes/s through the bus's shape on the consumer
	// runner with the policy taken out (plumbing.go), from the first
	// publish until its last stage has read and acknowledged every
	// decision. PlumbingThirdRatio is Plumbing over RawThird;
	// SettledPlumbingRatio is Settled over Plumbing: how much of what the
	// plumbing allows the whole bus reaches.
	Plumbing             float64 `json:"plumbing_per_s"`
	PlumbingThirdRatio   float64 `json:"plumbing_raw_third_ratio"`
	SettledPlumbingRatio float64 `json:"settled_plumbing_ratio"`
	// CPU time (user + system) of the whole process, which holds the
	// server, every service and the publisher, per message or outcome:
	// RawCPUUS over the raw publish and consume (per message),
	// PlumbingCPUUS over the plumbing, FailbusCPUUS from the first
	// publish of failbus ingest until every service caught up. Zero where
	// the platform does not report it (not unix). Steadier than
	// throughput on a shared machine: what the neighbours run slows the
	// bus, but does not add to its CPU time.
	RawCPUUS      float64 `json:"raw_cpu_us_per_msg"`
	PlumbingCPUUS float64 `json:"plumbing_cpu_us_per_outcome"`
	FailbusCPUUS  float64 `json:"failbus_cpu_us_per_outcome"`
	// Heap allocations of the whole process over the same spans, objects
	// and bytes per message (raw) or outcome: the collector's work, and
	// the hot path's allocations as a whole bus makes them.
	RawAllocs          float64 `json:"raw_allocs_per_msg"`
	RawAllocBytes      float64 `json:"raw_alloc_bytes_per_msg"`
	PlumbingAllocs     float64 `json:"plumbing_allocs_per_outcome"`
	PlumbingAllocBytes float64 `json:"plumbing_alloc_bytes_per_outcome"`
	FailbusAllocs      float64 `json:"failbus_allocs_per_outcome"`
	FailbusAllocBytes  float64 `json:"failbus_alloc_bytes_per_outcome"`
	// RawThird is RawPublish / 3: an outcome costs at least three stream
	// writes (outcome, classification, decision), so raw/3 is the ceiling
	// the goals are ratios of.
	RawThird float64 `json:"raw_third_per_s"`
	// IngestThirdRatio and SettledThirdRatio are Ingest and Settled over
	// RawThird.
	IngestThirdRatio  float64 `json:"ingest_raw_third_ratio"`
	SettledThirdRatio float64 `json:"settled_raw_third_ratio"`
	// Ingest: outcomes/s from the first publish until FAILBUS_CLASSIFIED
	// holds all N classifications.
	Ingest float64 `json:"ingest_per_s"`
	// Settled: outcomes/s from the first publish until every service's
	// consumer has nothing pending or unacked.
	Settled float64 `json:"settled_per_s"`
	// IngestRatio and SettledRatio are Ingest and Settled over
	// RawPipeline; IngestRelayRatio is Ingest over RawRelay.
	IngestRatio      float64 `json:"ingest_ratio"`
	SettledRatio     float64 `json:"settled_ratio"`
	IngestRelayRatio float64 `json:"ingest_relay_ratio"`
	// ServerIn and ServerOut are the messages the server received and
	// sent per outcome while the bus ingested and settled the round
	// (publishes, acks, pull requests, API requests and replies, KV and
	// direct gets in; deliveries, acknowledgements and replies out). They
	// include what runs per unit of time rather than per outcome (the
	// bench's polls every 5 ms, the services' pull requests and consumer
	// snapshots), so a slower run counts a little more per outcome.
	// RawServerIn and RawServerOut are the same over the raw publish and
	// consume of the round, per message.
	ServerIn  float64 `json:"server_msgs_in_per_outcome"`
	ServerOut float64 `json:"server_msgs_out_per_outcome"`
	// ServerByConn splits them by client connection (each service has
	// its own; "bench" is the publisher and the bench's polls): [in, out].
	ServerByConn map[string][2]float64 `json:"server_msgs_per_outcome_by_connection,omitempty"`
	RawServerIn  float64               `json:"raw_server_msgs_in_per_msg"`
	RawServerOut float64               `json:"raw_server_msgs_out_per_msg"`
	// Classify: classify.Classify calls/s on one goroutine.
	Classify        float64 `json:"classify_per_s"`
	ClassifyNsOp    float64 `json:"classify_ns_per_op"`
	ClassifyAllocOp float64 `json:"classify_allocs_per_op"`
}

// benchLateness compares JetStream's own schedules with retries scheduled
// through failbus.
type benchLateness struct {
	K int `json:"k"`
	// Raw: stored time of the fired message − its @at time.
	Raw benchPercentiles `json:"raw"`
	// Failbus: stored time of failbus.retry.due.<agent> − its due_at.
	Failbus benchPercentiles `json:"failbus"`
	// FailbusEndToEnd: stored time of the due retry − (the outcome's at +
	// its retry-after-ms): what the agent sees, the pipeline (classifier,
	// scheduler) included.
	FailbusEndToEnd benchPercentiles `json:"failbus_end_to_end"`
	// DiffP50MS and DiffP99MS are Failbus − Raw.
	DiffP50MS float64 `json:"diff_p50_ms"`
	DiffP99MS float64 `json:"diff_p99_ms"`
}

// benchPercentiles of a lateness sample, in milliseconds.
type benchPercentiles struct {
	N     int     `json:"n"`
	MinMS float64 `json:"min_ms"`
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	MaxMS float64 `json:"max_ms"`
}

// benchRunner is one run's state.
type benchRunner struct {
	cfg      benchConfig
	b        *devbus.Bus
	js       jetstream.JetStream // the bench's own connection, async window cfg.window
	corpus   []events.Outcome
	progress io.Writer
	// latenessRuns counts lateness measurements, so each uses ids and
	// budgets of its own.
	latenessRuns int
	// consumers are benchConsumers, looked up once (settled).
	consumers []jetstream.Consumer
}

// bench starts a bus and measures everything; progress goes to progress.
func bench(ctx context.Context, cfg benchConfig, corpus []events.Outcome, source string, log zerolog.Logger, progress io.Writer) (_ *benchReport, err error) {
	start := time.Now()
	// The default policy, but retries may wait an hour, so --pending
	// retries stay pending for the whole run.
	pol, err := policy.Parse([]byte(benchPolicy))
	if err != nil {
		return nil, fmt.Errorf("bench policy: %w", err)
	}
	opts := devbus.Options{Server: embedded.Options{ServerName: "failbus-bench"}, Log: log, Policy: pol}
	if cfg.nodes > 1 {
		dir, err := os.MkdirTemp("", "failbus-bench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		opts.Server.Dir, opts.Nodes = dir, cfg.nodes
	}
	b, err := devbus.Start(opts)
	if err != nil {
		return nil, err
	}
	if cfg.blockProfile != "" {
		// After the server's start, which sets the rate to its own
		// option (0). One sample per 10 µs waited: round trips of a
		// fraction of a millisecond all show, at little cost to the run.
		runtime.SetBlockProfileRate(int(10 * time.Microsecond))
		defer runtime.SetBlockProfileRate(0)
	}
	defer func() {
		if serr := b.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	nc, err := b.Srv.Connect(nats.Name("failbus-bench"))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.window))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	r := &benchRunner{cfg: cfg, b: b, js: js, corpus: corpus, progress: progress}
	rep := &benchReport{
		Machine: benchMachineInfo(b.Srv.Dir()),
		Params: benchParams{
			N: cfg.n, Rounds: cfg.rounds, K: cfg.k, Window: cfg.window, Nodes: cfg.nodes,
			DelayMinS: cfg.delayMin.Seconds(), DelayMaxS: cfg.delayMax.Seconds(),
			Corpus: source, CorpusRows: len(corpus),
		},
	}
	if err := r.scratchStreams(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "failbus bench: bus up at %s (services: %s); %d rounds of %d outcomes\n",
		b.Srv.ClientURL(), strings.Join(b.Names, ", "), cfg.rounds, cfg.n)
	for i := range cfg.rounds {
		round, err := r.round(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("round %d: %w", i+1, err)
		}
		rep.Rounds = append(rep.Rounds, round)
		fmt.Fprintf(progress, "round %d/%d: raw publish %s/s, consume %s/s, relay %s/s; plumbing %s/s; failbus ingest %s/s (%.3f× publish+consume), settled %s/s; classify %s/s\n",
			i+1, cfg.rounds, human(round.RawPublish), human(round.RawConsume), human(round.RawRelay), human(round.Plumbing), human(round.Ingest), round.IngestRatio,
			human(round.Settled), human(round.Classify))
	}
	rep.Median, rep.Min, rep.Max = summarize(rep.Rounds)
	fmt.Fprintf(progress, "lateness: %d raw JetStream schedules, then %d retries through failbus, due %v–%v ahead\n",
		cfg.k, cfg.k, cfg.delayMin, cfg.delayMax)
	if rep.Lateness, err = r.lateness(ctx); err != nil {
		return nil, err
	}
	for _, rate := range cfg.rates {
		fmt.Fprintf(progress, "latency: %d/s for %gs, raw relay then failbus\n", rate, cfg.rateSeconds)
		l, err := r.latencyAt(ctx, rate, cfg.rateSeconds)
		if err != nil {
			return nil, err
		}
		l.CoresNeeded = float64(rate) * rep.Median.FailbusCPUUS / 1e6 // 0 where CPU time is not measured
		rep.Latency = append(rep.Latency, l)
	}
	if cfg.pending > 0 {
		fmt.Fprintf(progress, "pending: %d raw @at schedules and %d retries through failbus, due in %v; then lateness again\n", cfg.pending, cfg.pending, benchPendingDelay)
		p, err := r.pending(ctx, cfg.pending)
		if err != nil {
			return nil, fmt.Errorf("pending: %w", err)
		}
		rep.Pending = &p
	}
	if cfg.memProfile != "" {
		if err := writeProfile(cfg.memProfile, "heap"); err != nil {
			return nil, err
		}
	}
	if cfg.blockProfile != "" {
		if err := writeProfile(cfg.blockProfile, "block"); err != nil {
			return nil, err
		}
	}
	rep.Goals = benchGoals(rep)
	rep.ElapsedS = time.Since(start).Seconds()
	return rep, nil
}

// scratchStreams creates the raw baselines' streams as copies of the
// failbus streams they stand for (storage, limits, duplicate window,
// schedules and TTLs), so the only difference measured is failbus.
func (r *benchRunner) scratchStreams(ctx context.Context) error {
	for _, s := range []struct{ from, name, prefix string }{
		{topology.StreamOutcomes, benchRawStream, benchRawPrefix},
		{topology.StreamClassified, benchRelayStream, benchRelayPrefix},
		{topology.StreamRetries, benchSchedStream, benchSchedPrefix},
		{topology.StreamClassified, benchPlumbClassified, benchPlumbClassifiedPrefix},
		{topology.StreamDecisions, benchPlumbDecisions, benchPlumbDecisionsPrefix},
	} {
		st, err := r.js.Stream(ctx, s.from)
		if err != nil {
			return fmt.Errorf("read %s: %w", s.from, err)
		}
		c := st.CachedInfo().Config
		c.Name, c.Subjects, c.Metadata = s.name, []string{s.prefix + ".>"}, nil
		c.Description = "failbus bench scratch stream, configured like " + s.from
		if _, err := r.js.CreateStream(ctx, c); err != nil {
			return fmt.Errorf("create %s: %w", s.name, err)
		}
	}
	return nil
}

// round measures one round: raw publish, raw consume, raw relay, the
// plumbing, failbus ingest (each with its CPU time; failbus's with the
// server's messages per outcome), then pure classification.
func (r *benchRunner) round(ctx context.Context, round int) (benchRound, error) {
	var out benchRound
	n := float64(r.cfg.n)
	raw, ingest, err := r.ingestMsgs(round)
	if err != nil {
		return out, err
	}

	// 1. Raw JetStream.
	rawSt, err := r.js.Stream(ctx, benchRawStream)
	if err != nil {
		return out, fmt.Errorf("%s: %w", benchRawStream, err)
	}
	first := rawSt.CachedInfo().State.LastSeq + 1
	rv0, _ := r.b.Srv.NATS().Varz(nil)
	rawMeter := startMeter()
	t0 := time.Now()
	if err := r.publishAll(ctx, raw); err != nil {
		return out, fmt.Errorf("raw publish: %w", err)
	}
	pub := time.Since(t0)
	cons, err := r.rawConsume(ctx, first)
	if err != nil {
		return out, fmt.Errorf("raw consume: %w", err)
	}
	rawUse := rawMeter.since()
	out.RawCPUUS, out.RawAllocs, out.RawAllocBytes = rawUse.cpuUSPer(n), rawUse.allocs/n, rawUse.allocBytes/n
	if rv1, err := r.b.Srv.NATS().Varz(nil); err == nil && rv0 != nil {
		out.RawServerIn, out.RawServerOut = float64(rv1.InMsgs-rv0.InMsgs)/n, float64(rv1.OutMsgs-rv0.OutMsgs)/n
	}
	out.RawPublish, out.RawConsume = n/pub.Seconds(), n/cons.Seconds()
	out.RawPipeline = n / (pub + cons).Seconds()
	relay, err := r.rawRelay(ctx, first)
	if err != nil {
		return out, fmt.Errorf("raw relay: %w", err)
	}
	out.RawRelay = n / relay.Seconds()
	plumb, use, err := r.plumbing(ctx, plumbMsgs(raw))
	if err != nil {
		return out, fmt.Errorf("plumbing: %w", err)
	}
	out.Plumbing, out.PlumbingCPUUS = n/plumb.Seconds(), use.cpuUSPer(n)
	out.PlumbingAllocs, out.PlumbingAllocBytes = use.allocs/n, use.allocBytes/n

	// 2. failbus ingest.
	classifiedBefore, err := r.streamMsgs(ctx, topology.StreamClassified)
	if err != nil {
		return out, err
	}
	deadBefore, err := r.streamMsgs(ctx, topology.StreamDLQ)
	if err != nil {
		return out, err
	}
	v0, _ := r.b.Srv.NATS().Varz(nil)
	c0, _ := r.b.Srv.NATS().Connz(&server.ConnzOptions{Limit: 1000})
	stopProfile, err := r.startStepProfile(round)
	if err != nil {
		return out, err
	}
	defer stopProfile()
	stepMeter := startMeter()
	t0 = time.Now()
	if err := r.publishAll(ctx, ingest); err != nil {
		return out, fmt.Errorf("ingest publish: %w", err)
	}
	want := classifiedBefore + uint64(r.cfg.n)
	if err := r.poll(ctx, "FAILBUS_CLASSIFIED to hold the round's classifications", func() (bool, error) {
		got, err := r.streamMsgs(ctx, topology.StreamClassified)
		return got >= want, err
	}); err != nil {
		return out, err
	}
	classified := time.Since(t0)
	if err := r.poll(ctx, "the services to catch up", func() (bool, error) { return r.settled(ctx) }); err != nil {
		return out, err
	}
	settled := time.Since(t0)
	stepUse := stepMeter.since()
	out.FailbusCPUUS, out.FailbusAllocs, out.FailbusAllocBytes = stepUse.cpuUSPer(n), stepUse.allocs/n, stepUse.allocBytes/n
	stopProfile() // after the figures: writing a profile costs CPU and allocations
	if v1, err := r.b.Srv.NATS().Varz(nil); err == nil && v0 != nil {
		out.ServerIn, out.ServerOut = float64(v1.InMsgs-v0.InMsgs)/n, float64(v1.OutMsgs-v0.OutMsgs)/n
	}
	if c1, err := r.b.Srv.NATS().Connz(&server.ConnzOptions{Limit: 1000}); err == nil && c0 != nil {
		out.ServerByConn = msgsByConn(c0, c1, n)
	}
	if dead, err := r.streamMsgs(ctx, topology.StreamDLQ); err != nil {
		return out, err
	} else if dead != deadBefore {
		return out, fmt.Errorf("%d dead letters during ingest: the bench's outcomes must all be valid (failbus tail failbus.dlq.>)", dead-deadBefore)
	}
	out.Ingest, out.Settled = n/classified.Seconds(), n/settled.Seconds()
	out.IngestRatio, out.SettledRatio = out.Ingest/out.RawPipeline, out.Settled/out.RawPipeline
	out.IngestRelayRatio = out.Ingest / out.RawRelay
	out.RawThird = out.RawPublish / 3
	out.IngestThirdRatio, out.SettledThirdRatio = out.Ingest/out.RawThird, out.Settled/out.RawThird
	out.PlumbingThirdRatio, out.SettledPlumbingRatio = out.Plumbing/out.RawThird, out.Settled/out.Plumbing

	// 3. Classify only.
	out.Classify, out.ClassifyNsOp, out.ClassifyAllocOp = benchClassify(r.corpus)
	return out, nil
}

// startStepProfile starts --cpuprofile-failbus's profile in the first
// round and writes --allocprofile-failbus's base; stop ends them (once,
// whoever calls it first).
func (r *benchRunner) startStepProfile(round int) (stop func(), err error) {
	if round != 0 {
		return func() {}, nil
	}
	stopAllocs, err := r.startAllocProfile()
	if err != nil {
		return nil, err
	}
	if r.cfg.cpuProfileFailbus == "" {
		return stopAllocs, nil
	}
	f, err := os.Create(r.cfg.cpuProfileFailbus)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile-failbus: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile-failbus: %w", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
			stopAllocs()
		})
	}, nil
}

// startAllocProfile writes --allocprofile-failbus's base (the allocations
// so far); stop writes the profile itself. The allocs profile counts from
// the start of the process, so the step's own are the difference: pprof's
// -base takes it. Stop reports a failure with the progress lines rather
// than losing the round's figures.
func (r *benchRunner) startAllocProfile() (stop func(), err error) {
	path := r.cfg.allocProfileFailbus
	if path == "" {
		return func() {}, nil
	}
	if err := writeAllocProfile(path + ".base"); err != nil {
		return nil, fmt.Errorf("--allocprofile-failbus: %w", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if err := writeAllocProfile(path); err != nil {
				fmt.Fprintf(r.progress, "failbus bench: --allocprofile-failbus: %v\n", err)
			}
		})
	}, nil
}

// writeAllocProfile writes the allocs profile as of a collection now (the
// profile is only as recent as the last one).
func writeAllocProfile(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// ingestMsgs builds a round's messages before any clock starts: the
// failbus outcomes exactly as pkg/agent's Report sends them (msgpack,
// schema header, Nats-Msg-Id = outcome id, failbus.outcome.<provider>.<agent>)
// and the raw copies of the same bytes for the scratch stream.
func (r *benchRunner) ingestMsgs(round int) (raw, ingest []*nats.Msg, err error) {
	now := events.At(time.Now())
	raw, ingest = make([]*nats.Msg, r.cfg.n), make([]*nats.Msg, r.cfg.n)
	for i := range r.cfg.n {
		o := r.corpus[i%len(r.corpus)]
		o.ID = "bench-" + strconv.Itoa(round) + "-" + strconv.Itoa(i)
		// A fleet: every outcome the first failure of its own step (its
		// own retry budget), as in a storm of many agents, rather than
		// thousands of failures of the corpus's few steps, which the
		// policy gives up on after max_retries.
		o.Agent, o.At = benchAgent, now
		o.Session, o.Turn, o.Step = "bench-"+strconv.Itoa(round)+"-"+strconv.Itoa(i%benchSessions), i+1, 1
		data, hdr, err := events.Encode(&o)
		if err != nil {
			return nil, nil, fmt.Errorf("encode corpus outcome %d: %w", i%len(r.corpus), err)
		}
		rawHdr := maps.Clone(hdr)
		hdr.Set(events.HeaderMsgID, o.ID)
		rawHdr.Set(events.HeaderMsgID, "raw-"+o.ID)
		ingest[i] = &nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: hdr, Data: data}
		raw[i] = &nats.Msg{Subject: benchRawPrefix + "." + events.Token(o.Provider) + "." + benchAgent, Header: rawHdr, Data: data}
	}
	return raw, ingest, nil
}

// publishAll publishes msgs async, at most cfg.window in flight, and
// returns when every ack is in. A duplicate ack is an error: every message
// of the bench is new.
func (r *benchRunner) publishAll(ctx context.Context, msgs []*nats.Msg) error {
	futures := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, m := range msgs {
		f, err := r.js.PublishMsgAsync(m, benchStall)
		if err != nil {
			return fmt.Errorf("publish to %s: %w", m.Subject, err)
		}
		futures = append(futures, f)
	}
	select {
	case <-r.js.PublishAsyncComplete():
	case <-ctx.Done():
		return ctx.Err()
	}
	for _, f := range futures {
		select {
		case err := <-f.Err():
			return fmt.Errorf("publish to %s: %w", f.Msg().Subject, err)
		case ack := <-f.Ok():
			if ack.Duplicate {
				return fmt.Errorf("publish to %s: stored as a duplicate of an earlier message", f.Msg().Subject)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// rawConsumer is an ephemeral pull consumer on the scratch stream from
// sequence first, configured like the classifier's (explicit ack, 1000 acks
// pending at most); drop deletes it.
func (r *benchRunner) rawConsumer(ctx context.Context, first uint64) (jetstream.Consumer, func(), error) {
	c, err := r.js.CreateConsumer(ctx, benchRawStream, jetstream.ConsumerConfig{
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:   first,
		AckWait:       30 * time.Second,
		MaxAckPending: 1000,
	})
	if err != nil {
		return nil, nil, err
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = r.js.DeleteConsumer(dctx, benchRawStream, c.CachedInfo().Name)
	}
	return c, drop, nil
}

// rawConsume reads the round's raw messages from sequence first with a
// pull consumer configured like the classifier's (explicit ack, 1000 acks
// pending at most), acking each, and returns the time until the server has
// processed every ack.
func (r *benchRunner) rawConsume(ctx context.Context, first uint64) (time.Duration, error) {
	c, drop, err := r.rawConsumer(ctx, first)
	if err != nil {
		return 0, err
	}
	defer drop()
	var (
		mu     sync.Mutex
		got    int
		ackErr error
		all    = make(chan struct{})
	)
	t0 := time.Now()
	cc, err := c.Consume(func(m jetstream.Msg) {
		err := m.Ack()
		mu.Lock()
		defer mu.Unlock()
		if err != nil && ackErr == nil {
			ackErr = err
		}
		got++
		if got == r.cfg.n {
			close(all)
		}
	}, jetstream.PullMaxMessages(1000))
	if err != nil {
		return 0, err
	}
	defer cc.Stop()
	wctx, cancel := context.WithTimeout(ctx, benchWait)
	defer cancel()
	select {
	case <-all:
	case <-wctx.Done():
		mu.Lock()
		defer mu.Unlock()
		return 0, fmt.Errorf("received %d of %d messages: %w", got, r.cfg.n, wctx.Err())
	}
	mu.Lock()
	err = ackErr
	mu.Unlock()
	if err != nil {
		return 0, fmt.Errorf("ack: %w", err)
	}
	if err := r.poll(ctx, "the raw consumer's acks", func() (bool, error) {
		info, err := c.Info(ctx)
		if err != nil {
			return false, err
		}
		return info.NumAckPending == 0 && info.NumPending == 0, nil
	}); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

// rawRelay reads the round's raw messages again and relays each the way
// the consumer runner runs the classifier: classifier.DefaultConcurrency
// handlers, a pull of that many at a time, each message published to
// BENCH_RELAY with a Nats-Msg-Id (waiting for the ack), then double-acked.
// It is what the classifier's stage costs in JetStream alone.
func (r *benchRunner) rawRelay(ctx context.Context, first uint64) (time.Duration, error) {
	workers := classifier.DefaultConcurrency
	c, drop, err := r.rawConsumer(ctx, first)
	if err != nil {
		return 0, err
	}
	defer drop()
	wctx, cancel := context.WithTimeout(ctx, benchWait)
	defer cancel()
	var (
		next     = make(chan jetstream.Msg)
		mu       sync.Mutex
		done     int
		firstErr error
		all      = make(chan struct{})
		wg       sync.WaitGroup
	)
	finish := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil && firstErr == nil {
			firstErr = err
			cancel()
		}
		done++
		if done == r.cfg.n {
			close(all)
		}
	}
	t0 := time.Now()
	for range workers {
		wg.Go(func() {
			for m := range next {
				out := &nats.Msg{Subject: benchRelayPrefix + m.Subject()[len(benchRawPrefix):], Header: nats.Header{}, Data: m.Data()}
				out.Header.Set(events.HeaderMsgID, "relay-"+m.Headers().Get(events.HeaderMsgID))
				_, err := r.js.PublishMsg(wctx, out)
				if err == nil {
					err = m.DoubleAck(wctx)
				}
				finish(err)
			}
		})
	}
	// Plain fetches of a few messages at a time: no iterator state
	// (pending counts, heartbeats) to go wrong on a loaded machine.
	go func() {
		defer close(next)
		for {
			select {
			case <-all:
				return
			case <-wctx.Done():
				return
			default:
			}
			batch, err := c.Fetch(workers, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				select {
				case next <- m:
				case <-wctx.Done():
					return
				}
			}
		}
	}()
	defer func() {
		cancel()
		wg.Wait()
	}()
	select {
	case <-all:
	case <-wctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	switch {
	case firstErr != nil:
		return 0, firstErr
	case done < r.cfg.n:
		return 0, fmt.Errorf("relayed %d of %d messages: %w", done, r.cfg.n, wctx.Err())
	}
	return time.Since(t0), nil
}

// streamMsgs is the number of messages a stream holds.
func (r *benchRunner) streamMsgs(ctx context.Context, stream string) (uint64, error) {
	s, err := r.js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	return s.CachedInfo().State.Msgs, nil
}

// msgsByConn is, per client connection that sent or received anything
// between the snapshots c0 and c1, the messages the server received from
// it and sent to it, divided by n: [in, out], named as connect names
// connections ("failbus-" dropped); nil when none did.
func msgsByConn(c0, c1 *server.Connz, n float64) map[string][2]float64 {
	before := map[uint64]*server.ConnInfo{}
	for _, c := range c0.Conns {
		before[c.Cid] = c
	}
	var by map[string][2]float64
	for _, c := range c1.Conns {
		var i0, o0 int64
		if b := before[c.Cid]; b != nil {
			i0, o0 = b.InMsgs, b.OutMsgs
		}
		if c.InMsgs == i0 && c.OutMsgs == o0 {
			continue
		}
		if by == nil {
			by = map[string][2]float64{}
		}
		by[strings.TrimPrefix(c.Name, "failbus-")] = [2]float64{float64(c.InMsgs-i0) / n, float64(c.OutMsgs-o0) / n}
	}
	return by
}

// settled reports whether every service's consumer has acknowledged
// everything on its filter.
func (r *benchRunner) settled(ctx context.Context) (bool, error) {
	if r.consumers == nil {
		for _, bc := range benchConsumers {
			c, err := r.js.Consumer(ctx, bc.stream, bc.name)
			if err != nil {
				return false, fmt.Errorf("consumer %s/%s: %w", bc.stream, bc.name, err)
			}
			r.consumers = append(r.consumers, c)
		}
	}
	for i, bc := range benchConsumers {
		done, err := embedded.ConsumerCaughtUp(ctx, r.js, bc.stream, r.consumers[i])
		if err != nil || !done {
			return false, err
		}
	}
	return true, nil
}

// poll calls cond every benchPoll until it holds, fails, a service stops,
// or benchWait passes.
func (r *benchRunner) poll(ctx context.Context, what string, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, benchWait)
	defer cancel()
	tick := time.NewTicker(benchPoll)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		select {
		case <-tick.C:
		case <-r.b.Failed():
			return fmt.Errorf("waiting for %s: a service stopped", what)
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
	}
}

// benchClassify runs classify.Classify over the corpus on this goroutine for
// at least benchClassifyMin: calls/s, ns/op and allocations/op.
func benchClassify(corpus []events.Outcome) (perS, nsOp, allocsOp float64) {
	outs := make([]events.Outcome, len(corpus))
	copy(outs, corpus)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ops := 0
	t0 := time.Now()
	var elapsed time.Duration
	for elapsed < benchClassifyMin {
		for i := range outs {
			_ = classify.Classify(&outs[i])
		}
		ops += len(outs)
		elapsed = time.Since(t0)
	}
	runtime.ReadMemStats(&after)
	return float64(ops) / elapsed.Seconds(), float64(elapsed.Nanoseconds()) / float64(ops),
		float64(after.Mallocs-before.Mallocs) / float64(ops)
}

// lateness schedules K messages with raw JetStream, then K retries through
// failbus, and compares how late each fired.
func (r *benchRunner) lateness(ctx context.Context) (benchLateness, error) {
	r.latenessRuns++ // ids and budgets of their own
	out := benchLateness{K: r.cfg.k}
	raw, err := r.rawLateness(ctx)
	if err != nil {
		return out, fmt.Errorf("raw schedules: %w", err)
	}
	fb, e2e, err := r.failbusLateness(ctx)
	if err != nil {
		return out, fmt.Errorf("failbus retries: %w", err)
	}
	out.Raw, out.Failbus, out.FailbusEndToEnd = percentiles(raw), percentiles(fb), percentiles(e2e)
	out.DiffP50MS = out.Failbus.P50MS - out.Raw.P50MS
	out.DiffP99MS = out.Failbus.P99MS - out.Raw.P99MS
	return out, nil
}

// delays returns K delays spread uniformly over [delayMin, delayMax] in a
// fixed pseudo-random order, whole milliseconds (retry-after-ms has no
// finer unit), the same for raw and failbus.
func (r *benchRunner) delays() []time.Duration {
	rng := rand.New(rand.NewPCG(1, 2))
	span := r.cfg.delayMax - r.cfg.delayMin
	out := make([]time.Duration, r.cfg.k)
	for i := range out {
		out[i] = (r.cfg.delayMin + time.Duration(rng.Float64()*float64(span))).Truncate(time.Millisecond)
	}
	return out
}

// rawLateness publishes K schedules to the scratch stream, each due at its
// delay after it was built, with the headers the scheduler uses
// (Nats-Schedule @at with full precision, Nats-Schedule-Target,
// Nats-TTL: never) and a RetryDue payload, and collects stored − due of
// every fired message.
func (r *benchRunner) rawLateness(ctx context.Context) ([]time.Duration, error) {
	target := benchSchedPrefix + ".due"
	col, err := startLateCollector(ctx, r.js, benchSchedStream, target, r.cfg.k, func(d *events.RetryDue, stored time.Time) []time.Duration {
		return []time.Duration{stored.Sub(d.DueAt.Time)}
	})
	if err != nil {
		return nil, err
	}
	defer col.stop()
	msgs := make([]*nats.Msg, r.cfg.k)
	for i, d := range r.delays() {
		id := "bench-raw-" + strconv.Itoa(r.latenessRuns) + "-" + strconv.Itoa(i)
		due := time.Now().Add(d)
		data, hdr, err := events.Encode(&events.RetryDue{RetryID: id, OutcomeID: id, Agent: benchRetryAgent, Retry: 1, DueAt: events.At(due)})
		if err != nil {
			return nil, err
		}
		hdr.Set(events.HeaderMsgID, id)
		scheduler.SetSchedule(hdr, due, target)
		msgs[i] = &nats.Msg{Subject: benchSchedPrefix + ".sched." + strconv.Itoa(i), Header: hdr, Data: data}
	}
	if err := r.publishAll(ctx, msgs); err != nil {
		return nil, err
	}
	return col.wait(ctx, r.cfg.delayMax+benchWait)
}

// failbusLateness reports K rate-limited outcomes whose retry-after-ms is
// the delay, each with its own budget (turn), and collects two samples per
// due retry: stored − due_at, and stored − (outcome at + delay).
func (r *benchRunner) failbusLateness(ctx context.Context) (fromDue, endToEnd []time.Duration, err error) {
	// asked maps an outcome id to the time its retry was asked for.
	asked := make(map[string]time.Time, r.cfg.k)
	var askedMu sync.Mutex
	col, err := startLateCollector(ctx, r.js, topology.StreamRetries, events.RetryDueSubject(benchRetryAgent), r.cfg.k, func(d *events.RetryDue, stored time.Time) []time.Duration {
		askedMu.Lock()
		at, ok := asked[d.OutcomeID]
		askedMu.Unlock()
		if !ok {
			return nil
		}
		return []time.Duration{stored.Sub(d.DueAt.Time), stored.Sub(at)}
	})
	if err != nil {
		return nil, nil, err
	}
	defer col.stop()
	decisions, err := startDecisionTally(ctx, r.js, benchRetryAgent)
	if err != nil {
		return nil, nil, err
	}
	defer decisions.stop()

	msgs := make([]*nats.Msg, r.cfg.k)
	for i, d := range r.delays() {
		now := time.Now()
		o := &events.Outcome{
			ID: "bench-retry-" + strconv.Itoa(r.latenessRuns) + "-" + strconv.Itoa(i), At: events.At(now), Agent: benchRetryAgent,
			Session: "bench-retry-" + strconv.Itoa(r.latenessRuns) + "-" + strconv.Itoa(i%benchSessions), Provider: benchProvider, Model: "bench-model", Profile: "key-1", Turn: i + 1, Step: 1, Status: 429,
			Headers: map[string]string{classify.HintRetryAfterMS: strconv.FormatInt(d.Milliseconds(), 10)},
			Body:    `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`,
		}
		data, hdr, err := events.Encode(o)
		if err != nil {
			return nil, nil, err
		}
		hdr.Set(events.HeaderMsgID, o.ID)
		askedMu.Lock()
		asked[o.ID] = now.Add(d)
		askedMu.Unlock()
		msgs[i] = &nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: hdr, Data: data}
	}
	if err := r.publishAll(ctx, msgs); err != nil {
		return nil, nil, err
	}
	samples, err := col.wait(ctx, r.cfg.delayMax+benchWait, decisions.err)
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i+1 < len(samples); i += 2 {
		fromDue = append(fromDue, samples[i])
		endToEnd = append(endToEnd, samples[i+1])
	}
	return fromDue, endToEnd, nil
}

// lateCollector reads fired messages and keeps the samples sample returns
// for each, until it has seen want messages.
type lateCollector struct {
	w       *watch.Watch
	want    int
	mu      sync.Mutex
	seen    int
	samples []time.Duration
	bad     error
	full    chan struct{}
}

func startLateCollector(ctx context.Context, js jetstream.JetStream, stream, subject string, want int,
	sample func(d *events.RetryDue, stored time.Time) []time.Duration) (*lateCollector, error) {
	lc := &lateCollector{want: want, full: make(chan struct{})}
	// Only what fires from now on: an earlier measurement's due messages
	// are on the same subject.
	w, err := watch.Start(ctx, js, watch.Config{Stream: stream, Filters: []string{subject}, Follow: true, DeliverPolicy: jetstream.DeliverNewPolicy}, func(m jetstream.Msg) error {
		meta, merr := m.Metadata()
		d, derr := events.DecodeAs[*events.RetryDue](m.Subject(), m.Headers(), m.Data())
		lc.mu.Lock()
		defer lc.mu.Unlock()
		switch {
		case merr != nil || derr != nil:
			if lc.bad == nil {
				lc.bad = fmt.Errorf("fired message on %s: %w", m.Subject(), errors.Join(merr, derr))
			}
		default:
			s := sample(d, meta.Timestamp)
			if s == nil && lc.bad == nil {
				lc.bad = fmt.Errorf("a due retry of outcome %q the bench did not report", d.OutcomeID)
			}
			lc.samples = append(lc.samples, s...)
		}
		lc.seen++
		if lc.seen == lc.want {
			close(lc.full)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	lc.w = w
	return lc, nil
}

// wait returns the samples once want messages arrived, or an error after
// limit, when a message was not usable, or when a check fails.
func (lc *lateCollector) wait(ctx context.Context, limit time.Duration, checks ...func() error) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-lc.full:
			lc.mu.Lock()
			defer lc.mu.Unlock()
			return slices.Clone(lc.samples), lc.bad
		case <-tick.C:
			for _, check := range checks {
				if err := check(); err != nil {
					return nil, err
				}
			}
		case <-ctx.Done():
			lc.mu.Lock()
			defer lc.mu.Unlock()
			return nil, fmt.Errorf("%d of %d scheduled messages fired: %w", lc.seen, lc.want, ctx.Err())
		}
	}
}

func (lc *lateCollector) stop() { _ = lc.w.Stop() }

// decisionTally watches an agent's decisions and fails the lateness run as
// soon as one is not a retry (every bench outcome must be retried, or its
// due message never comes).
type decisionTally struct {
	w   *watch.Watch
	mu  sync.Mutex
	bad error
}

func startDecisionTally(ctx context.Context, js jetstream.JetStream, agentName string) (*decisionTally, error) {
	t := &decisionTally{}
	cfg := watch.Config{Stream: topology.StreamDecisions, Filters: []string{events.DecisionSubject(agentName)}, Follow: true}
	w, err := watch.Start(ctx, js, cfg, func(m jetstream.Msg) error {
		d, err := events.DecodeAs[*events.Decision](m.Subject(), m.Headers(), m.Data())
		t.mu.Lock()
		defer t.mu.Unlock()
		switch {
		case err != nil && t.bad == nil:
			t.bad = fmt.Errorf("decision: %w", err)
		case err == nil && d.Action != events.ActionRetry && t.bad == nil:
			t.bad = fmt.Errorf("outcome %s was decided %s, not retry: %s", d.OutcomeID, d.Action, d.Reason)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read decisions: %w", err)
	}
	t.w = w
	return t, nil
}

func (t *decisionTally) err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bad
}

func (t *decisionTally) stop() { _ = t.w.Stop() }

// percentiles summarizes a lateness sample (nearest rank).
func percentiles(d []time.Duration) benchPercentiles {
	if len(d) == 0 {
		return benchPercentiles{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		return ms(s[max(i, 0)])
	}
	return benchPercentiles{N: len(s), MinMS: ms(s[0]), P50MS: rank(0.50), P99MS: rank(0.99), MaxMS: ms(s[len(s)-1])}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchFigures lists the fields of a round, so median, min and max are
// computed for each in one place.
var benchFigures = []func(*benchRound) *float64{
	func(r *benchRound) *float64 { return &r.RawPublish },
	func(r *benchRound) *float64 { return &r.RawConsume },
	func(r *benchRound) *float64 { return &r.RawPipeline },
	func(r *benchRound) *float64 { return &r.RawRelay },
	func(r *benchRound) *float64 { return &r.Ingest },
	func(r *benchRound) *float64 { return &r.Settled },
	func(r *benchRound) *float64 { return &r.IngestRatio },
	func(r *benchRound) *float64 { return &r.SettledRatio },
	func(r *benchRound) *float64 { return &r.IngestRelayRatio },
	func(r *benchRound) *float64 { return &r.Classify },
	func(r *benchRound) *float64 { return &r.ClassifyNsOp },
	func(r *benchRound) *float64 { return &r.ClassifyAllocOp },
	func(r *benchRound) *float64 { return &r.RawThird },
	func(r *benchRound) *float64 { return &r.IngestThirdRatio },
	func(r *benchRound) *float64 { return &r.SettledThirdRatio },
	func(r *benchRound) *float64 { return &r.ServerIn },
	func(r *benchRound) *float64 { return &r.ServerOut },
	func(r *benchRound) *float64 { return &r.RawServerIn },
	func(r *benchRound) *float64 { return &r.RawServerOut },
	func(r *benchRound) *float64 { return &r.Plumbing },
	func(r *benchRound) *float64 { return &r.PlumbingThirdRatio },
	func(r *benchRound) *float64 { return &r.SettledPlumbingRatio },
	func(r *benchRound) *float64 { return &r.RawAllocs },
	func(r *benchRound) *float64 { return &r.RawAllocBytes },
	func(r *benchRound) *float64 { return &r.PlumbingAllocs },
	func(r *benchRound) *float64 { return &r.PlumbingAllocBytes },
	func(r *benchRound) *float64 { return &r.FailbusAllocs },
	func(r *benchRound) *float64 { return &r.FailbusAllocBytes },
	func(r *benchRound) *float64 { return &r.RawCPUUS },
	func(r *benchRound) *float64 { return &r.PlumbingCPUUS },
	func(r *benchRound) *float64 { return &r.FailbusCPUUS },
}

// benchCPUFigures is how many of benchFigures, at its end, are CPU
// times: zero where cpuTime reports nothing.
const benchCPUFigures = 3

// summarize returns the median, minimum and maximum of every figure over
// the rounds.
func summarize(rounds []benchRound) (med, lo, hi benchRound) {
	for _, f := range benchFigures {
		v := make([]float64, len(rounds))
		for i := range rounds {
			v[i] = *f(&rounds[i])
		}
		*f(&med) = median(v) // sorts v
		*f(&lo), *f(&hi) = v[0], v[len(v)-1]
	}
	return med, lo, hi
}

// printBench writes the readable report.
func printBench(w io.Writer, rep *benchReport) {
	m, p := rep.Machine, rep.Params
	servers := "one embedded nats-server"
	if p.Nodes > 1 {
		servers = fmt.Sprintf("%d embedded nats-servers in a cluster, every stream at %d replicas,", p.Nodes, p.Nodes)
	}
	fmt.Fprintf(w, "failbus bench: %s %s (file store in a temporary folder), every service in this process\n", servers, m.NATSServer)
	cpu := ""
	if m.CPU != "" {
		cpu = m.CPU + ", "
	}
	fmt.Fprintf(w, "machine: %s/%s, %s%d CPUs, GOMAXPROCS %d, %s\n", m.GOOS, m.GOARCH, cpu, m.NumCPU, m.GOMAXPROCS, m.GoVersion)
	fmt.Fprintf(w, "corpus:  %s (%d outcomes, cycled)\n", p.Corpus, p.CorpusRows)
	fmt.Fprintf(w, "run:     %d outcomes per round, %d rounds (median, min–max over rounds); async publish window %d; %.1fs in all\n",
		p.N, p.Rounds, p.Window, rep.ElapsedS)
	fmt.Fprintln(w)

	med, lo, hi := rep.Median, rep.Min, rep.Max
	t := benchTable{align: "lrrrll"}
	t.add("THROUGHPUT", "median", "min", "max", "", "")
	row := func(name string, f func(*benchRound) float64, unit, note string) {
		t.add(name, human(f(&med)), human(f(&lo)), human(f(&hi)), unit, note)
	}
	row("raw JetStream publish (async, Nats-Msg-Id)", func(r *benchRound) float64 { return r.RawPublish }, "msgs/s", "")
	row("raw JetStream consume (pull, ack each)", func(r *benchRound) float64 { return r.RawConsume }, "msgs/s", "")
	row("raw publish + consume: N/(t_pub + t_cons)", func(r *benchRound) float64 { return r.RawPipeline }, "msgs/s", "baseline")
	row(fmt.Sprintf("raw relay, the classifier's shape (%d at a time)", classifier.DefaultConcurrency), func(r *benchRound) float64 { return r.RawRelay }, "msgs/s",
		"consume → publish, wait for ack → double-ack")
	row("raw/3: raw publish ÷ 3 (an outcome is 3 stream writes)", func(r *benchRound) float64 { return r.RawThird }, "msgs/s", "goal ceiling")
	row("failbus plumbing: the bus's stream writes, no policy", func(r *benchRound) float64 { return r.Plumbing }, "outcomes/s",
		fmt.Sprintf("%.2f× raw/3 (%.2f–%.2f); consumer runners, classify → ledger, schedule, decision", med.PlumbingThirdRatio, lo.PlumbingThirdRatio, hi.PlumbingThirdRatio))
	row("failbus ingest → FAILBUS_CLASSIFIED", func(r *benchRound) float64 { return r.Ingest }, "outcomes/s",
		fmt.Sprintf("%.2f× raw/3 (%.2f–%.2f); %.3f× baseline, %.2f× raw relay", med.IngestThirdRatio, lo.IngestThirdRatio, hi.IngestThirdRatio, med.IngestRatio, med.IngestRelayRatio))
	row("failbus ingest → every service caught up", func(r *benchRound) float64 { return r.Settled }, "outcomes/s",
		fmt.Sprintf("%.2f× raw/3 (%.2f–%.2f); %.3f× baseline, %.2f× plumbing", med.SettledThirdRatio, lo.SettledThirdRatio, hi.SettledThirdRatio, med.SettledRatio, med.SettledPlumbingRatio))
	t.add("server messages per outcome, in / out", fmt.Sprintf("%.1f / %.1f", med.ServerIn, med.ServerOut), "", "", "msgs",
		fmt.Sprintf("raw publish + consume: %.1f / %.1f per message, same run", med.RawServerIn, med.RawServerOut))
	if med.FailbusCPUUS > 0 {
		t.add("CPU per outcome, the whole process", fmt.Sprintf("%.0f µs", med.FailbusCPUUS), fmt.Sprintf("%.0f µs", lo.FailbusCPUUS), fmt.Sprintf("%.0f µs", hi.FailbusCPUUS), "failbus",
			fmt.Sprintf("plumbing %.0f µs; raw publish + consume %.0f µs per message (×3 = %.0f)", med.PlumbingCPUUS, med.RawCPUUS, 3*med.RawCPUUS))
	}
	t.add("heap allocations per outcome, the whole process", fmt.Sprintf("%.0f (%s)", med.FailbusAllocs, kib(med.FailbusAllocBytes)),
		fmt.Sprintf("%.0f", lo.FailbusAllocs), fmt.Sprintf("%.0f", hi.FailbusAllocs), "failbus",
		fmt.Sprintf("plumbing %.0f (%s); raw publish + consume %.0f (%s) per message", med.PlumbingAllocs, kib(med.PlumbingAllocBytes), med.RawAllocs, kib(med.RawAllocBytes)))
	row("classify only (classify.Classify, 1 goroutine)", func(r *benchRound) float64 { return r.Classify }, "/s per core",
		fmt.Sprintf("%.0f ns/op, %.1f allocs/op", med.ClassifyNsOp, med.ClassifyAllocOp))
	t.write(w)
	fmt.Fprintln(w, "Ratios are the median (and range) of the per-round ratios; raw and failbus alternate within each round.")
	if last := rep.Rounds[len(rep.Rounds)-1].ServerByConn; len(last) > 0 {
		names := slices.Sorted(maps.Keys(last))
		parts := make([]string, len(names))
		for i, name := range names {
			parts[i] = fmt.Sprintf("%s %.1f/%.1f", name, last[name][0], last[name][1])
		}
		fmt.Fprintf(w, "Server messages per outcome by connection, in/out (last round): %s.\n", strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)

	l := rep.Lateness
	t = benchTable{align: "lrrrrr"}
	t.add(fmt.Sprintf("SCHEDULED-RETRY LATENESS (%d each, due %gs–%gs ahead)", l.K, p.DelayMinS, p.DelayMaxS), "n", "p50", "p99", "min", "max")
	lrow := func(name string, s benchPercentiles) {
		t.add(name, strconv.Itoa(s.N), fmtMS(s.P50MS), fmtMS(s.P99MS), fmtMS(s.MinMS), fmtMS(s.MaxMS))
	}
	lrow("raw JetStream @at: stored − due", l.Raw)
	lrow("failbus scheduler: stored − due_at", l.Failbus)
	t.add("failbus − raw", "", fmtSignedMS(l.DiffP50MS), fmtSignedMS(l.DiffP99MS), "", "")
	lrow("failbus end to end: stored − (outcome at + retry-after)", l.FailbusEndToEnd)
	t.write(w)
	fmt.Fprintf(w, "End to end includes classifying and scheduling all %d outcomes, published at once.\n", l.K)
	printLatency(w, rep)
	fmt.Fprintln(w)
	printGoals(w, rep.Goals)
}

// kib formats a byte count per outcome.
func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

// benchTable is a plain-text table: column i is left-aligned when align[i]
// is 'l', right-aligned otherwise.
type benchTable struct {
	align string
	rows  [][]string
}

func (t *benchTable) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *benchTable) write(w io.Writer) {
	width := make([]int, len(t.align))
	for _, r := range t.rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range t.rows {
		var b strings.Builder
		for i, c := range r {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if t.align[i] == 'l' {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// human renders a figure with three significant digits and a k/M suffix.
func human(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', digits(a/1e6), 64) + "M"
	case a >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', digits(a/1e3), 64) + "k"
	default:
		return strconv.FormatFloat(v, 'f', digits(a), 64)
	}
}

// digits is how many decimals give three significant digits for a in
// [0, 1000).
func digits(a float64) int {
	switch {
	case a >= 100:
		return 0
	case a >= 10:
		return 1
	default:
		return 2
	}
}

func fmtMS(v float64) string       { return strconv.FormatFloat(v, 'f', 1, 64) + " ms" }
func fmtSignedMS(v float64) string { return fmt.Sprintf("%+.1f ms", v) }

// benchMachineInfo describes the machine and the software measured.
func benchMachineInfo(store string) benchMachine {
	return benchMachine{
		GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPU: cpuModel(),
		NumCPU: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
		NATSServer: server.VERSION, StoreFolder: store,
	}
}

// cpuModel is the CPU's name on Linux; empty elsewhere.
func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loadBenchCorpus reads the outcomes to classify and ingest: path, or the
// repository's classification corpus found from the working directory up
// to the module root, or, outside the repository, benchBuiltinMix. It
// returns where they came from.
func loadBenchCorpus(path string) ([]events.Outcome, string, error) {
	source := path
	if path == "" {
		root, ok := moduleRoot()
		if !ok {
			return benchBuiltinMix(), "built-in mix (run inside the failbus repository for the corpus)", nil
		}
		path = filepath.Join(root, benchDefaultCorpus)
		source = filepath.ToSlash(benchDefaultCorpus)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			return benchBuiltinMix(), "built-in mix (" + source + " not found)", nil
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, "", fmt.Errorf("corpus: %w", err)
	}
	defer f.Close()
	var outs []events.Outcome
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var o events.Outcome
		if err := events.UnmarshalJSON(b, &o); err != nil {
			return nil, "", fmt.Errorf("corpus %s line %d: %w", path, line, err)
		}
		// The bench sets id, agent and at itself.
		o.ID, o.Agent = "x", benchAgent
		if err := o.Validate(); err != nil {
			return nil, "", fmt.Errorf("corpus %s line %d: %w", path, line, err)
		}
		outs = append(outs, o)
	}
	if err := sc.Err(); err != nil {
		return nil, "", fmt.Errorf("corpus %s: %w", path, err)
	}
	if len(outs) == 0 {
		return nil, "", fmt.Errorf("corpus %s: no outcomes", path)
	}
	return outs, source, nil
}

// moduleRoot is the nearest folder, from the working directory up, whose
// go.mod declares the failbus module.
func moduleRoot() (string, bool) {
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			for line := range strings.SplitSeq(string(data), "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == "module" && f[1] == benchModule {
					return dir, true
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// benchBuiltinMix is a small mix of the common shapes (success, rate limit
// with a hint, 5xx page, fabricated overflow claim, true overflow,
// transport error, content refusal) for runs outside the repository.
func benchBuiltinMix() []events.Outcome {
	return []events.Outcome{
		{Provider: "openai", Model: "gpt-4.1", Profile: "key-a", OK: true, Status: 200, Body: `{"choices":[{"message":{"content":"Hello!"}}]}`},
		{Provider: "openai", Model: "gpt-4.1", Profile: "key-a", Status: 429, Headers: map[string]string{"retry-after": "7"},
			Body: `{"error":{"message":"Rate limit reached for gpt-4.1 on tokens per min","type":"tokens","code":"rate_limit_exceeded"}}`},
		{Provider: "anthropic", Model: "claude-sonnet-4", Profile: "key-b", Status: 503,
			Body: `<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>`},
		{Provider: "my-gateway", Model: "deepseek-v3", Profile: "key-c", Status: 400,
			UpstreamCode: "CONTEXT_WINDOW_EXCEEDED", RequestTokens: 41_000, ContextWindow: 256_000},
		{Provider: "cerebras", Model: "qwen-3-235b", Profile: "key-d", Status: 413, RequestTokens: 130_900, ContextWindow: 131_000},
		{Provider: "openai", Model: "gpt-4.1", Profile: "key-a",
			TransportError: "read tcp 10.0.0.5:51234->104.18.7.192:443: read: connection reset by peer (ECONNRESET)"},
		{Provider: "openai", Model: "gpt-4o", Profile: "key-a", Status: 200, StopReason: "content_filter", Session: "s1", Segment: 1},
	}
}

// startCPUProfile profiles the whole process into path until the
// returned stop is called; "" profiles nothing.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
