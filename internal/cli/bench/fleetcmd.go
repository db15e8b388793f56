package bench

// The fleet mode's flags, its bus (in this process or --server) and its
// report.

import (
	"bufio"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// fleetUsage is the fleet mode's part of the command's usage.
const fleetUsage = `
failbus bench --fleet [--agents N] [--ok SHARE] [--storm | --loads mix,storm]
      [--fleet-rates R1,R2,… | --start-rate R --max-rate R --bisect B]
      [--hold D] [--drain D] [--latency-hold D] [--cpu-n N --cpu-rate R --cpu-rounds K]
      [--server URL [--creds F | --nkey F | --user U --password P] [--metrics URL]] [--json]

The rates a fleet sees (none of the figures above is measured in this mode).
The load is a fleet of --agents agents (200) calling 5 providers with 3
profiles each, every outcome the first of its own step:

  mix    --ok (0.9) of the outcomes successes, the rest failures drawn from
         the classification corpus (retryable 429s and 5xx, non-retryable
         400s, overflows, refusals), each keeping its provider: the fleet's
         providers are the corpus's 5 with the most failures;
  storm  every outcome a 429 with retry-after: 30, so every one gets a
         retry scheduled.

--agents 1 sends all of it under one agent name (a gateway that reports
its subagents' calls as one). Outcomes are published paced, async
(--window in flight), from the bench's own connection.

Highest rate held: each load is held at a rate for --hold (30s); the rate
is held when the publisher reached it and the backlog of every service
(every durable consumer on FAILBUS_OUTCOMES and FAILBUS_CLASSIFIED:
nothing pending, nothing unacknowledged) drained within --drain (5s) of
the end of the hold. The search starts at --start-rate (2000/s), doubles
while held (halves while not) up to --max-rate, then bisects --bisect
times between the highest held and the lowest not held; --fleet-rates
instead steps through the given rates until one is not held. A hold whose
backlog outgrows twice what the rate publishes in --drain stops early.
At half the held rate (or --latency-rate), for --latency-hold (10s): decision latency, each
failure's publish → its decision stored on failbus.decision.<agent>
(p50, p99; content refusals are the refusal tiers' and not counted),
once the search's retries have come due (--cpu-settle after its last
hold); then split by hop (outcome stored, classified, decided: the
stored times read back from the streams), with the slowest 1 % of
decisions apart, to show which hop the tail waited in.

Beside it, raw JetStream on the same server in the same run (--fleet-raw,
on by default): the same outcomes' bytes published to a scratch stream and
relayed by a pull consumer (async publish, ack once stored) to a second
(raw/2: two writes per outcome) and on to a third (raw/3: three), each
searched the same way from the highest rate failbus held; raw/3's latency
is measured at each failbus load's latency rate. Two more have the bus's
own shape, the least any implementation of the contract writes and reads
for a kind: raw/ok a success's (the relayed copy read by a second
consumer, written nowhere: two writes, two reads) and raw/429 a retried
failure's (three writes from each relayed copy, as ledger entry, schedule
and decision: five writes, two reads; the schedule fires 30s later, as
the storm's retries, and JetStream writes its due message). raw/429 is
searched when the storm runs ("× own shape"), and both are in the CPU
figures. Each load's search (failbus's or raw's) starts once the retries
of the load before came due (--cpu-settle), so it does not pay for them;
within a search, a step pays for the retries of the step before, the
storm's and raw/429's alike.

CPU per outcome by kind: --cpu-n outcomes of each kind (successes only,
the storm's 429s, non-retryable 400s) and of the raw pipelines, paced at
--cpu-rate, from the first publish until drained, less what the idle bus
spends; the median of --cpu-rounds rounds. The 429s run last in a round,
and the next round waits until their retries came due (30s). In process: the process's CPU time (bus, services,
load). With --server: the bus's process_cpu_seconds_total read from
--metrics (failbus dev serves it at http://127.0.0.1:9400/metrics) plus
this process's; unknown without --metrics.

--server drives an already running bus (e.g. failbus dev in another
terminal) instead of starting one in this process; the connection flags
are every command's. The bench writes real outcomes to it (their
retries come due 30s later) and creates, then deletes, the raw scratch
streams BENCH_FLEET_*.`

// fleetFlags are the fleet mode's flags, registered on the bench's flag
// set.
type fleetFlags struct {
	fleet, storm, raw           *bool
	agents, providers, profiles *int
	ok                          *float64
	loads, rates, metrics       *string
	start, maxRate, bisect      *int
	hold, drain, latencyHold    *time.Duration
	latencyRate                 *int
	cpuN, cpuRate, cpuRounds    *int
	cpuSettle                   *time.Duration
	trace                       *string
	conn                        cli.Conn
}

func registerFleetFlags(fs *flag.FlagSet) *fleetFlags {
	f := &fleetFlags{
		fleet:       fs.Bool("fleet", false, "measure the rates a fleet sees instead (see above)"),
		storm:       fs.Bool("storm", false, "--fleet: the storm load only (same as --loads storm)"),
		raw:         fs.Bool("fleet-raw", true, "--fleet: search raw/2 and raw/3 too, and measure their CPU"),
		agents:      fs.Int("agents", fleetDefaultAgents, "--fleet: agents in the fleet"),
		providers:   fs.Int("providers", fleetDefaultProviders, "--fleet: providers the fleet calls"),
		profiles:    fs.Int("profiles", fleetDefaultProfiles, "--fleet: profiles (keys) of each provider"),
		ok:          fs.Float64("ok", fleetDefaultOK, "--fleet: share of successes in the mix"),
		loads:       fs.String("loads", loadMix+","+loadStorm, "--fleet: loads to search (mix, storm)"),
		rates:       fs.String("fleet-rates", "", "--fleet: rates to step through, ascending, instead of the search"),
		metrics:     fs.String("metrics", "", "--fleet --server: the bus's Prometheus endpoint, for its process_cpu_seconds_total"),
		start:       fs.Int("start-rate", fleetDefaultStart, "--fleet: first rate of the search, outcomes/s"),
		maxRate:     fs.Int("max-rate", fleetDefaultMax, "--fleet: highest rate the search tries"),
		bisect:      fs.Int("bisect", fleetDefaultBisect, "--fleet: bisection steps after the doubling"),
		hold:        fs.Duration("hold", fleetDefaultHold, "--fleet: how long each rate is held"),
		drain:       fs.Duration("drain", fleetDefaultDrain, "--fleet: how soon after a hold every backlog must be empty"),
		latencyHold: fs.Duration("latency-hold", fleetDefaultLatencyHold, "--fleet: how long the latency runs at half the held rate last; 0 skips them"),
		latencyRate: fs.Int("latency-rate", 0, "--fleet: rate of the latency runs, outcomes/s; 0: half the held rate"),
		cpuN:        fs.Int("cpu-n", fleetDefaultCPUN, "--fleet: outcomes of each kind for CPU per outcome; 0 skips it"),
		cpuRate:     fs.Int("cpu-rate", fleetDefaultCPURate, "--fleet: rate of the CPU runs, outcomes/s"),
		cpuRounds:   fs.Int("cpu-rounds", fleetDefaultCPURounds, "--fleet: rounds of the CPU runs (median)"),
		trace:       fs.String("trace", "", "--fleet: write an execution trace of the first latency run's publish span (the bus, in process, at a rate it holds) to this file, for go tool trace (-pprof=sync, net, sched: where decisions waited)"),
		cpuSettle:   fs.Duration("cpu-settle", fleetStormDue, "--fleet: how long after the latest retried failure (the loads', a CPU round's 429s) CPU and decision latency are measured: their retries come due first, JetStream's writes, not the next span's"),
	}
	f.conn.Register(fs)
	return f
}

// config checks the flags; server reports whether --server was given.
func (f *fleetFlags) config(fs *flag.FlagSet, window int) (c fleetConfig, server bool, err error) {
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "server" {
			server = true
		}
	})
	c = fleetConfig{
		agents: *f.agents, providers: *f.providers, profiles: *f.profiles, ok: *f.ok,
		start: *f.start, maxRate: *f.maxRate, bisect: *f.bisect,
		hold: *f.hold, drain: *f.drain, latencyHold: *f.latencyHold, latencyRate: *f.latencyRate,
		cpuN: *f.cpuN, cpuRate: *f.cpuRate, cpuRounds: *f.cpuRounds, cpuSettle: *f.cpuSettle, tracePath: *f.trace,
		window: window, raw: *f.raw, metrics: *f.metrics,
	}
	for l := range strings.SplitSeq(*f.loads, ",") {
		switch l = strings.TrimSpace(l); l {
		case "":
		case loadMix, loadStorm:
			c.loads = append(c.loads, l)
		default:
			return c, server, fmt.Errorf("--loads: %q is not mix or storm", l)
		}
	}
	if *f.storm {
		c.loads = []string{loadStorm}
	}
	for v := range strings.SplitSeq(*f.rates, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || (len(c.rates) > 0 && n <= c.rates[len(c.rates)-1]) {
			return c, server, fmt.Errorf("--fleet-rates: %q is not a rate above the one before it", v)
		}
		c.rates = append(c.rates, n)
	}
	switch {
	case len(c.loads) == 0:
		return c, server, fmt.Errorf("--loads: no load")
	case c.agents < 1 || c.providers < 1 || c.profiles < 1:
		return c, server, fmt.Errorf("--agents, --providers and --profiles must be at least 1")
	case c.ok < 0 || c.ok > 1:
		return c, server, fmt.Errorf("--ok %v: a share between 0 and 1", c.ok)
	case c.start < 1 || c.maxRate < c.start || c.bisect < 0:
		return c, server, fmt.Errorf("need 1 <= --start-rate <= --max-rate and --bisect >= 0")
	case c.hold <= 0 || c.drain <= 0 || c.latencyHold < 0 || c.latencyRate < 0:
		return c, server, fmt.Errorf("--hold and --drain must be positive, --latency-hold and --latency-rate at least 0")
	case c.cpuN < 0 || c.cpuRate < 1 || c.cpuRounds < 0:
		return c, server, fmt.Errorf("--cpu-n and --cpu-rounds at least 0, --cpu-rate at least 1")
	case c.metrics != "" && !server:
		return c, server, fmt.Errorf("--metrics is for --server: in process the bench reads its own CPU time")
	}
	return c, server, nil
}

// runFleet starts the bus (or connects to --server) and runs the fleet.
func runFleet(ctx context.Context, c fleetConfig, f *fleetFlags, server bool, corpus []events.Outcome, source string, log zerolog.Logger, progress io.Writer) (_ *fleetReport, err error) {
	start := time.Now()
	gen, err := newFleetGen(corpus, c.agents, c.providers, c.profiles, c.ok)
	if err != nil {
		return nil, err
	}
	r := &fleetRunner{cfg: c, gen: gen, progress: progress, run: "fl" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	rep := &fleetReport{
		Params: fleetParams{
			Agents: c.agents, Providers: gen.providers, Profiles: c.profiles, OK: c.ok,
			HoldS: c.hold.Seconds(), DrainS: c.drain.Seconds(), LatencyS: c.latencyHold.Seconds(),
			Rates: c.rates, Window: c.window, Corpus: source, CorpusRows: len(corpus),
		},
	}
	if len(c.rates) == 0 {
		rep.Params.StartRate, rep.Params.MaxRate, rep.Params.Bisect = c.start, c.maxRate, c.bisect
	}
	errHandler := jetstream.WithPublishAsyncErrHandler(func(jetstream.JetStream, *nats.Msg, error) { r.pubErrs.Add(1) })
	var nc *nats.Conn
	if server {
		conn, err := f.conn.Connect("bench")
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		nc = conn.Conn
		r.dial = func(name string) (*nats.Conn, error) {
			cn, err := f.conn.Connect(name)
			if err != nil {
				return nil, err
			}
			return cn.Conn, nil
		}
		rep.Bus = nc.ConnectedUrlRedacted()
		rep.Machine = benchMachineInfo("")
		rep.Machine.NATSServer = nc.ConnectedServerVersion()
		metrics := c.metrics
		r.cpuCovers = "the bus's process_cpu_seconds_total at --metrics " + metrics + " and this process's CPU time"
		r.cpu = func(ctx context.Context) (time.Duration, bool) {
			if metrics == "" {
				return 0, false
			}
			bus, err := scrapeCPU(ctx, metrics)
			own, ok := cpuTime()
			if err != nil || !ok {
				return 0, false
			}
			return bus + own, true
		}
	} else {
		b, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-bench"}, Log: log})
		if err != nil {
			return nil, err
		}
		defer func() {
			if serr := b.Stop(); serr != nil && err == nil {
				err = serr
			}
		}()
		if nc, err = b.Srv.Connect(nats.Name("failbus-bench")); err != nil {
			return nil, err
		}
		defer nc.Close()
		r.dial = func(name string) (*nats.Conn, error) { return b.Srv.Connect(nats.Name("failbus-" + name)) }
		r.failed = b.Failed()
		rep.Bus = "in-process"
		rep.Machine = benchMachineInfo(b.Srv.Dir())
		r.cpu = func(context.Context) (time.Duration, bool) { return cpuTime() }
		r.cpuCovers = "this process's CPU time: server, every service and the load"
	}
	if r.js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(c.window), errHandler); err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if server {
		if err := cli.Diagnose(ctx, r.js, rep.Bus, topology.StreamOutcomes, topology.StreamClassified, topology.StreamDecisions); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(progress, "failbus bench --fleet: bus %s; %d agents, providers %s × %d profiles; hold %v, drained within %v\n",
		rep.Bus, c.agents, strings.Join(gen.providers, ", "), c.profiles, c.hold, c.drain)
	if err := r.fleet(ctx, rep); err != nil {
		return nil, err
	}
	rep.ElapsedS = time.Since(start).Seconds()
	return rep, nil
}

// scrapeCPU reads process_cpu_seconds_total from a Prometheus text
// endpoint.
func scrapeCPU(ctx context.Context, url string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_cpu_seconds_total "); ok {
			s, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, fmt.Errorf("%s: process_cpu_seconds_total %q: %w", url, v, err)
			}
			return time.Duration(s * float64(time.Second)), nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s serves no process_cpu_seconds_total", url)
}

// printFleet writes the fleet report: the loads first.
func printFleet(w io.Writer, rep *fleetReport) {
	m, p := rep.Machine, rep.Params
	bus := "one embedded nats-server " + m.NATSServer + " with every service, in this process"
	if rep.Bus != "in-process" {
		bus = rep.Bus + " (nats-server " + m.NATSServer + "), driven from this process"
	}
	fmt.Fprintf(w, "failbus bench --fleet: %s\n", bus)
	cpu := ""
	if m.CPU != "" {
		cpu = m.CPU + ", "
	}
	fmt.Fprintf(w, "machine: %s/%s, %s%d CPUs, GOMAXPROCS %d, %s\n", m.GOOS, m.GOARCH, cpu, m.NumCPU, m.GOMAXPROCS, m.GoVersion)
	fmt.Fprintf(w, "fleet:   %d agents, %d providers (%s) × %d profiles; mix %.0f %% successes, failures from %s\n",
		p.Agents, len(p.Providers), strings.Join(p.Providers, ", "), p.Profiles, 100*p.OK, p.Corpus)
	search := fmt.Sprintf("from %d/s doubling up to %d/s, then %d bisections", p.StartRate, p.MaxRate, p.Bisect)
	if len(p.Rates) > 0 {
		search = "rates " + joinInts(p.Rates) + " until one is not held"
	}
	fmt.Fprintf(w, "held:    each rate for %gs, every backlog drained within %gs after; %s; %.0fs in all\n", p.HoldS, p.DrainS, search, rep.ElapsedS)
	fmt.Fprintln(w)

	t := benchTable{align: "lrrrrrrrl"}
	t.add("LOAD", "held", "× raw/2", "× raw/3", "× own shape", "at half: p50", "p99", "raw/3 p99", "decisions at half")
	for _, l := range rep.Loads {
		name := l.Name
		switch l.Name {
		case loadMix:
			name = fmt.Sprintf("mix (%.0f %% ok)", 100*p.OK)
		case loadStorm:
			name = "storm (429s, each retried)"
		}
		if l.Agents == 1 {
			name += ", one agent"
		}
		row := []string{name, human(float64(l.HeldPerS)) + "/s", ratio(l.Raw2Ratio), ratio(l.Raw3Ratio), ratio(l.Raw429Ratio), "", "", "", ""}
		if lat := l.Latency; lat != nil {
			row[5], row[6] = fmtMS(lat.Failbus.P50MS), fmtMS(lat.Failbus.P99MS)
			if lat.Raw3.N > 0 {
				row[7] = fmtMS(lat.Raw3.P99MS)
			}
			row[8] = fmt.Sprintf("%d of %d at %s/s: %s", lat.Failbus.N, lat.Expected, human(float64(lat.RatePerS)), actions(lat.Actions))
		}
		t.add(row...)
	}
	for _, l := range rep.Raw {
		t.add(l.Name+" ("+rawWhat(l.Name)+")", human(float64(l.HeldPerS))+"/s", "", "", "", "", "", "", "")
	}
	t.write(w)
	fmt.Fprintln(w, "held: the highest rate held; × raw: that over raw's held rate, same run (own shape: the storm over raw/429, what the contract")
	fmt.Fprintln(w, "writes for a retried failure). At half: decision latency, publish → decision stored, at half the held rate; raw/3 p99:")
	fmt.Fprintln(w, "publish → second relayed copy stored, at the same rate.")
	printHops(w, rep.Loads)

	c := rep.CPU
	fmt.Fprintln(w)
	if !c.Measured {
		fmt.Fprintf(w, "CPU PER OUTCOME: unknown (%s)\n", c.Why)
	} else {
		t := benchTable{align: "lrrrr"}
		t.add(fmt.Sprintf("CPU PER OUTCOME (%d each at %d/s, median of %d)", c.N, c.RatePerS, c.Rounds), "µs", "× raw/2", "× raw/3", "× own shape")
		k := func(name string, us, own float64) {
			t.add(name, fmt.Sprintf("%.0f", us), ratioOf(us, c.Raw2US), ratioOf(us, c.Raw3US), ratioOf(us, own))
		}
		k("success", c.SuccessUS, c.RawOKUS)
		k("failure with a retry (429)", c.RetryUS, c.Raw429US)
		k("failure without a retry (400)", c.NoRetryUS, 0)
		if c.Raw2US > 0 {
			for _, r := range []struct {
				name string
				us   float64
			}{{fleetRawTwoName, c.Raw2US}, {fleetRawThrName, c.Raw3US}, {fleetRawOKName, c.RawOKUS}, {fleetRaw429Name, c.Raw429US}} {
				t.add(r.name+" ("+rawWhat(r.name)+")", fmt.Sprintf("%.0f", r.us), "", "", "")
			}
		}
		t.write(w)
		if c.RawOKUS > 0 {
			fmt.Fprintln(w, "× own shape: over the raw pipeline that writes and reads what the contract asks of that kind (success: raw/ok; 429: raw/429).")
		}
		if rep.Bus == "in-process" {
			fmt.Fprint(w, "CPU: the whole process (server, every service, the load)")
		} else {
			fmt.Fprint(w, "CPU: the bus's process (process_cpu_seconds_total) plus this one's (the load, raw's relays)")
		}
		fmt.Fprintf(w, ", from the first publish until drained,\nless what the idle bus spends (%.1f ms/s, measured before).\n", c.IdleMSPerS)
	}

	fmt.Fprintln(w)
	fmt.Fprintln(w, "STEPS (rate: ✓ held / ✗ not; drained after the hold's end; max backlog)")
	for _, l := range append(append([]fleetLoadResult{}, rep.Loads...), rep.Raw...) {
		parts := make([]string, 0, len(l.Steps))
		for _, s := range l.Steps {
			mark := "✓"
			if !s.Held {
				mark = "✗"
			}
			part := fmt.Sprintf("%s %s %s %d", human(float64(s.RatePerS)), mark, fmtDrain(s.DrainedS), s.MaxBacklog)
			if s.Why != "" {
				part += " (" + s.Why + ")"
			}
			parts = append(parts, part)
		}
		fmt.Fprintf(w, "  %-6s %s\n", l.Name+":", strings.Join(parts, " · "))
		if cn := l.Counts; cn != nil {
			fmt.Fprintf(w, "         published %d (%d ok, %d retryable, %d not, %d refusals), stored %d, classified %d, dead letters %d\n",
				cn.Published, cn.Successes, cn.Retryable, cn.NotRetryable, cn.Refusals, cn.Stored, cn.Classified, cn.DeadLetters)
		}
	}
}

// printHops writes where each load's decision latency at half went, by
// hop, and its slowest 1 %.
func printHops(w io.Writer, loads []fleetLoadResult) {
	t := benchTable{align: "lrrrrl"}
	for _, l := range loads {
		lat := l.Latency
		if lat == nil || lat.Hops == nil {
			continue
		}
		if len(t.rows) == 0 {
			t.add("BY HOP AT HALF (ms)", "", "outcome stored", "classified", "decided", "")
		}
		h := lat.Hops
		f := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
		pp := func(p benchPercentiles) string { return f(p.P50MS) + " / " + f(p.P99MS) }
		t.add(l.Name, human(float64(lat.RatePerS))+"/s", pp(h.Publish), pp(h.Classifier), pp(h.Scheduler), "p50 / p99")
		if s := lat.Slowest; s != nil {
			t.add("", "", f(s.PublishMS), f(s.ClassifierMS), f(s.SchedulerMS),
				fmt.Sprintf("the slowest %d, on average; published within %s", s.N, fmtMS(s.SpanMS)))
		}
	}
	if len(t.rows) == 0 {
		return
	}
	fmt.Fprintln(w)
	t.write(w)
	fmt.Fprintln(w, "by hop: publish → outcome stored → its classification stored (the classifier) → its decision stored (the scheduler), read back")
	fmt.Fprintln(w, "from the streams after the run; each hop's percentiles are its own. The slowest 1 %: where the tail waited, and whether in one burst.")
}

func ratio(v float64) string {
	if v == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f×", v)
}

func ratioOf(a, b float64) string {
	if b <= 0 {
		return ""
	}
	return ratio(a / b)
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// actions lists decision counts by action, most first.
func actions(by map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var s []kv
	for k, v := range by {
		s = append(s, kv{k, v})
	}
	slices.SortFunc(s, func(a, b kv) int { return cmp.Or(cmp.Compare(b.v, a.v), cmp.Compare(a.k, b.k)) })
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = fmt.Sprintf("%s %d", x.k, x.v)
	}
	return strings.Join(parts, ", ")
}

// fleetMain is `failbus bench --fleet`.
func fleetMain(c fleetConfig, ff *fleetFlags, server bool, corpusPath string, asJSON, verbose bool, stdout, stderr io.Writer) int {
	log := zerolog.Nop()
	if verbose {
		log = cli.ConsoleLogger(stderr)
	}
	corpus, source, err := loadBenchCorpus(corpusPath)
	if err != nil {
		fmt.Fprintf(stderr, "failbus bench: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, fleetTimeout)
	defer cancel()
	var rep *fleetReport
	pprof.Do(ctx, pprof.Labels("failbus", "bench"), func(ctx context.Context) {
		rep, err = runFleet(ctx, c, ff, server, corpus, source, log, stderr)
	})
	if err != nil {
		fmt.Fprintf(stderr, "failbus bench: %v\n", err)
		return 1
	}
	return writeReport(stdout, stderr, asJSON, rep, func(w io.Writer) { printFleet(w, rep) })
}

// fleetTimeout bounds a fleet run.
const fleetTimeout = 2 * time.Hour
