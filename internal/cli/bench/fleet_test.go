package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/pkg/events"
)

// fleetTiny are sizes that run the fleet mode in a few seconds: one
// low rate per load, short holds; the tests check what the report says
// and that its counts add up, never its speeds.
var fleetTiny = []string{"--fleet", "--json", "--agents", "20", "--fleet-rates", "200", "--hold", "1s", "--drain", "30s",
	"--latency-hold", "500ms", "--latency-rate", "100", "--cpu-n", "100", "--cpu-rate", "200", "--cpu-rounds", "1", "--cpu-settle", "0s"}

// runFleetJSON runs `failbus bench` with args and decodes its report.
func runFleetJSON(t *testing.T, args []string) *fleetReport {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(args, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstderr: %s\nstdout: %s", code, stderr.String(), stdout.String())
	}
	var rep fleetReport
	dec := json.NewDecoder(&stdout)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("not one report: %v\n%s", err, stdout.String())
	}
	var text bytes.Buffer
	printFleet(&text, &rep)
	t.Log("\n" + text.String())
	return &rep
}

// checkFleetLoad checks one failbus load of a report: its step, its
// counts (every outcome published stored, none dead-lettered) and its
// latency run (a decision read for every failure the scheduler decides).
func checkFleetLoad(t *testing.T, l fleetLoadResult) {
	t.Helper()
	// Whether the rate was held depends on the machine: not checked.
	if len(l.Steps) != 1 || l.Steps[0].RatePerS != 200 || l.Steps[0].Published != 200 || l.Steps[0].DrainedS < 0 {
		t.Errorf("%s: steps %+v, want one of 200 outcomes at 200/s, drained", l.Name, l.Steps)
	}
	if st := l.Steps[0]; st.Held != (l.HeldPerS == 200) || st.Held != (st.Why == "") {
		t.Errorf("%s: step %+v, held rate %d", l.Name, st, l.HeldPerS)
	}
	c := l.Counts
	if c == nil {
		t.Fatalf("%s: no counts", l.Name)
	}
	if c.Successes+c.Retryable+c.NotRetryable+c.Refusals != c.Published {
		t.Errorf("%s: kinds %+v do not add up to what was published", l.Name, *c)
	}
	if c.Stored != uint64(c.Published) || c.DeadLetters != 0 {
		t.Errorf("%s: published %d, stored %d, dead letters %d", l.Name, c.Published, c.Stored, c.DeadLetters)
	}
	if c.Classified == 0 || c.Classified > c.Stored {
		t.Errorf("%s: classified %d of %d stored", l.Name, c.Classified, c.Stored)
	}
	lat := l.Latency
	if lat == nil {
		t.Fatalf("%s: no latency run", l.Name)
	}
	if lat.RatePerS != 100 || lat.Expected == 0 || lat.Failbus.N != lat.Expected {
		t.Errorf("%s: latency at %d/s read %d decisions of %d failures", l.Name, lat.RatePerS, lat.Failbus.N, lat.Expected)
	}
	total := 0
	for _, n := range lat.Actions {
		total += n
	}
	if total != lat.Failbus.N {
		t.Errorf("%s: actions %v add up to %d, not %d", l.Name, lat.Actions, total, lat.Failbus.N)
	}
	if p := lat.Failbus; p.MinMS > p.P50MS || p.P50MS > p.P99MS || p.P99MS > p.MaxMS {
		t.Errorf("%s: percentiles out of order %+v", l.Name, p)
	}
	// Every decision split by hop, read back from the streams; the
	// slowest 1 % are all at or above p99, so their hops' means add up
	// to between p99 and the slowest.
	n := lat.Failbus.N
	if h := lat.Hops; h == nil || h.Publish.N != n || h.Classifier.N != n || h.Scheduler.N != n {
		t.Fatalf("%s: hops %+v, want each of the %d decisions split", l.Name, lat.Hops, n)
	}
	s := lat.Slowest
	if s == nil || s.N != max(n/100, 1) || s.SpanMS < 0 {
		t.Fatalf("%s: slowest %+v of %d decisions", l.Name, s, n)
	}
	if sum := s.PublishMS + s.ClassifierMS + s.SchedulerMS; sum < lat.Failbus.P99MS-0.01 || sum > lat.Failbus.MaxMS+0.01 {
		t.Errorf("%s: the slowest's hops add up to %.3f ms, not between p99 %.3f and max %.3f", l.Name, sum, lat.Failbus.P99MS, lat.Failbus.MaxMS)
	}
}

// TestFleet runs the fleet mode in process on tiny sizes: the mix and
// the storm each held at one rate, the CPU by kind (the raw pipelines
// are TestFleetServer's); every outcome published is stored, every failure decided, and
// the storm's decisions are retries.
func TestFleet(t *testing.T) {
	t.Parallel()
	traceFile := filepath.Join(t.TempDir(), "latency.trace")
	rep := runFleetJSON(t, append([]string{"--fleet-raw=false", "--trace", traceFile}, fleetTiny...))
	if fi, err := os.Stat(traceFile); err != nil || fi.Size() == 0 {
		t.Errorf("--trace: %v (want an execution trace of the first latency run)", err)
	}
	if rep.Bus != "in-process" || rep.Machine.NATSServer == "" || len(rep.Params.Providers) != 5 || rep.Params.Agents != 20 {
		t.Errorf("bus %q, machine %+v, params %+v", rep.Bus, rep.Machine, rep.Params)
	}
	if len(rep.Loads) != 2 || rep.Loads[0].Name != loadMix || rep.Loads[1].Name != loadStorm {
		t.Fatalf("loads %+v, want mix and storm", rep.Loads)
	}
	for _, l := range rep.Loads {
		checkFleetLoad(t, l)
	}
	mix, storm := rep.Loads[0].Counts, rep.Loads[1].Counts
	if mix.Successes == 0 || mix.Retryable+mix.NotRetryable == 0 {
		t.Errorf("mix %+v: want successes and failures", *mix)
	}
	if storm.Retryable != storm.Published {
		t.Errorf("storm %+v: want every outcome a retryable failure", *storm)
	}
	if n := rep.Loads[1].Latency.Actions[events.ActionRetry]; n == 0 {
		t.Errorf("storm decisions %v: no retry", rep.Loads[1].Latency.Actions)
	}
	if len(rep.Raw) != 0 {
		t.Errorf("raw %+v with --fleet-raw=false", rep.Raw)
	}
	c := rep.CPU
	if _, ok := cpuTime(); ok {
		if !c.Measured || len(c.RoundsUS) != 1 || len(c.RoundsUS[0]) != 3 {
			t.Errorf("cpu %+v: want one round of three figures", c)
		}
		for _, v := range []float64{c.SuccessUS, c.RetryUS, c.NoRetryUS} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Errorf("cpu %+v", c)
			}
		}
	}
}

// TestFleetServer drives a bus started apart from the bench (here in the
// same process, reached only by its URL) with --server: the storm and
// the raw pipelines, the CPU read from the bus's /metrics; the raw scratch streams it made
// on that bus are gone afterwards.
func TestFleetServer(t *testing.T) {
	t.Parallel()
	b, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "fleet-server-test"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(metrics.Close)

	args := append([]string{"--server", b.Srv.ClientURL(), "--metrics", metrics.URL, "--storm"}, fleetTiny...)
	rep := runFleetJSON(t, args)
	if rep.Bus == "in-process" || !strings.HasPrefix(rep.Bus, "nats://") {
		t.Errorf("bus %q, want the server's URL", rep.Bus)
	}
	if len(rep.Loads) != 1 || rep.Loads[0].Name != loadStorm {
		t.Fatalf("loads %+v, want the storm only", rep.Loads)
	}
	l := rep.Loads[0]
	checkFleetLoad(t, l)
	// The storm ran, so raw/429 (its own shape) is searched too.
	if len(rep.Raw) != 3 || rep.Raw[0].Name != fleetRawTwoName || rep.Raw[1].Name != fleetRawThrName || rep.Raw[2].Name != fleetRaw429Name {
		t.Fatalf("raw %+v", rep.Raw)
	}
	for _, r := range rep.Raw {
		if len(r.Steps) != 1 {
			t.Errorf("%s: steps %+v, want one", r.Name, r.Steps)
		}
	}
	if r2 := rep.Raw[0].HeldPerS; r2 > 0 && l.Raw2Ratio != float64(l.HeldPerS)/float64(r2) {
		t.Errorf("× raw/2 %v, held %d and %d", l.Raw2Ratio, l.HeldPerS, r2)
	}
	if r := rep.Raw[2].HeldPerS; r > 0 && l.Raw429Ratio != float64(l.HeldPerS)/float64(r) {
		t.Errorf("× raw/429 %v, held %d and %d", l.Raw429Ratio, l.HeldPerS, r)
	}
	if l.Latency.Raw3.N != 50 {
		t.Errorf("raw/3 latency over %d copies, want 50 (100/s for 0.5s)", l.Latency.Raw3.N)
	}
	if c := rep.CPU; c.Measured && (len(c.RoundsUS) != 1 || len(c.RoundsUS[0]) != 7 || c.RawOKUS != c.RoundsUS[0][4] || c.Raw429US != c.RoundsUS[0][5]) {
		t.Errorf("cpu %+v: want one round of seven figures, raw/ok and raw/429 fifth and sixth", c)
	}
	if _, ok := cpuTime(); ok && (!rep.CPU.Measured || !strings.Contains(rep.CPU.Covers, "metrics")) {
		t.Errorf("cpu %+v: want it measured from --metrics", rep.CPU)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range []string{fleetRawIn, fleetRawTwo, fleetRawThree} {
		if _, err := b.JS.Stream(ctx, s); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("scratch stream %s after the run: %v, want it deleted", s, err)
		}
	}
}

// TestFleetCPUProfile: --fleet --cpuprofile writes a profile of the run.
// Not parallel: the process has one CPU profiler, and TestBench's runs
// use it too (parallel tests start only after this one has ended).
func TestFleetCPUProfile(t *testing.T) {
	profile := filepath.Join(t.TempDir(), "fleet.prof")
	runFleetJSON(t, append(slices.Clone(fleetTiny), "--loads", "mix", "--fleet-raw=false", "--latency-hold", "0s", "--cpu-n", "0", "--cpuprofile", profile))
	if fi, err := os.Stat(profile); err != nil || fi.Size() == 0 {
		t.Errorf("--cpuprofile: %v (want a CPU profile of the run)", err)
	}
}

// TestFleetArguments: flags that cannot work together are usage errors.
func TestFleetArguments(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		err  string
	}{
		{"--server without --fleet", []string{"--server", "nats://127.0.0.1:1"}, "add --fleet"},
		{"--metrics without --server", []string{"--fleet", "--metrics", "http://x"}, "--metrics is for --server"},
		{"an unknown load", []string{"--fleet", "--loads", "mix,flood"}, `"flood" is not mix or storm`},
		{"rates out of order", []string{"--fleet", "--fleet-rates", "200,100"}, "not a rate above the one before it"},
		{"a share above one", []string{"--fleet", "--ok", "1.5"}, "a share between 0 and 1"},
		{"no hold", []string{"--fleet", "--hold", "0s"}, "--hold and --drain must be positive"},
		{"the throughput bench's profile", []string{"--fleet", "--memprofile", "heap.prof"}, "the other profiles are the throughput bench's"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, nil, &stdout, &stderr); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(stderr.String(), tt.err) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.err)
			}
		})
	}
}

// The fleet's shapes classify as their kinds for every provider, and
// the mix draws successes and failures in about the share asked.
func TestFleetGen(t *testing.T) {
	t.Parallel()
	corpus, _, err := loadBenchCorpus("")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		corpus []events.Outcome
	}{{"corpus", corpus}, {"built-in mix", benchBuiltinMix()}} {
		g, err := newFleetGen(c.corpus, 7, 5, 3, 0.9)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		ok, agents, n := 0, map[string]bool{}, 2000
		for i := range n {
			o, kind := g.outcome(loadMix, "t", i)
			if kind == kindOK {
				ok++
				if got := classify.Classify(&o).Class; got != events.ClassOK {
					t.Errorf("%s: a success classified %s", c.name, got)
				}
			}
			agents[o.Agent] = true
			if o.Turn != i+1 || o.Step != 1 || o.ID != "t-"+strconv.Itoa(i) {
				t.Errorf("%s: outcome %d: id %s, turn %d, step %d", c.name, i, o.ID, o.Turn, o.Step)
			}
		}
		if share := float64(ok) / float64(n); share < 0.85 || share > 0.95 {
			t.Errorf("%s: %.2f successes, want about 0.9", c.name, share)
		}
		if len(agents) != 7 {
			t.Errorf("%s: %d agents, want 7", c.name, len(agents))
		}
	}
	for _, c := range []struct{ load, want string }{{loadStorm, events.ClassRateLimit}, {loadSuccess, events.ClassOK}} {
		g, _ := newFleetGen(corpus, 1, 5, 3, 0.9)
		for i := range 50 {
			o, _ := g.outcome(c.load, "t", i)
			if got := classify.Classify(&o).Class; got != c.want {
				t.Errorf("%s outcome %d classified %s, want %s", c.load, i, got, c.want)
			}
		}
	}
	for v, want := range map[int]int{4567: 4600, 123: 120, 99: 99, 15000: 15000, 11250: 11000} {
		if got := roundRate(v); got != want {
			t.Errorf("roundRate(%d) = %d, want %d", v, got, want)
		}
	}
}

// TestRawPipelinesWriteTheirShape runs each raw pipeline on a real
// server and counts what its streams stored: raw/ok reads the relayed
// copy without writing it on, raw/429 writes three from each, so their
// figures stand for a success's and a retried failure's least work.
func TestRawPipelinesWriteTheirShape(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	corpus, _, err := loadBenchCorpus("")
	if err != nil {
		t.Fatal(err)
	}
	gen, err := newFleetGen(corpus, 4, 5, 3, 0.9)
	if err != nil {
		t.Fatal(err)
	}
	// The schedules do not fire during the shapes' checks; the last
	// part of the test has them fire.
	r := &fleetRunner{js: b.JS, gen: gen, run: "shape", progress: io.Discard, cfg: fleetConfig{window: 64}, rawDue: time.Hour}
	r.dial = func(name string) (*nats.Conn, error) { return b.Srv.Connect(nats.Name(name)) }
	raw, err := r.startRaw(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i, tc := range []struct {
		shape     fleetRawShape
		name      string
		two, thr  uint64
		retries   uint64 // ledger entries and schedules
		scheds    int    // subjects holding a schedule
		consumers int    // whose backlog counts
	}{
		{rawTwo, fleetRawTwoName, n, 0, 0, 0, 1},
		{rawThree, fleetRawThrName, n, n, 0, 0, 2},
		{rawOK, fleetRawOKName, n, 0, 0, 0, 2},
		{raw429, fleetRaw429Name, n, n, 2 * n, n, 2},
		// The second relay stopped again; raw/429's schedules, not yet
		// fired, outlive its reset.
		{rawTwo, fleetRawTwoName, n, 0, n, n, 1},
	} {
		p := raw.pipeline(r, tc.shape)
		if p.name != tc.name {
			t.Errorf("shape %v named %q, want %q", tc.shape, p.name, tc.name)
		}
		if sent, _, err := r.publish(b.Ctx, p, strconv.Itoa(i), 400, n*time.Second/400, nil, nil); err != nil || sent != n {
			t.Fatalf("%s: published %d: %v", tc.name, sent, err)
		}
		if _, err := r.drain(b.Ctx, p, time.Now()); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		// Drained means relayed: the writes are stored before the reads
		// are acknowledged.
		for _, s := range []struct {
			stream string
			want   uint64
		}{{fleetRawIn, n}, {fleetRawTwo, tc.two}, {fleetRawThree, tc.thr}, {fleetRawRetries, tc.retries}} {
			st, err := b.JS.Stream(b.Ctx, s.stream)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.CachedInfo().State.Msgs; got != s.want {
				t.Errorf("%s: %s holds %d, want %d", tc.name, s.stream, got, s.want)
			}
		}
		if got := rawSubjects(t, b, fleetRawRetPfx+".sched.>"); len(got) != tc.scheds {
			t.Errorf("%s: %d schedule subjects, want %d", tc.name, len(got), tc.scheds)
		}
		for k, rl := range raw.relays {
			ci, err := rl.cons.Info(b.Ctx)
			if err != nil {
				t.Fatal(err)
			}
			running := rl.cc != nil
			if running != (k < tc.consumers) {
				t.Errorf("%s: relay %d running %v", tc.name, k+1, running)
			}
			if running && (ci.NumPending != 0 || ci.NumAckPending != 0) {
				t.Errorf("%s: relay %d left %d pending, %d unacknowledged", tc.name, k+1, ci.NumPending, ci.NumAckPending)
			}
		}
		p.reset(b.Ctx)
	}
	raw.close(b.Ctx)

	// raw/429's schedules fire: JetStream writes each one's due message
	// and removes the schedule, as it does for the bus's retries.
	r.rawDue = 200 * time.Millisecond
	raw, err = r.startRaw(b.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.close(b.Ctx)
	p := raw.pipeline(r, raw429)
	if sent, _, err := r.publish(b.Ctx, p, "fire", 400, n*time.Second/400, nil, nil); err != nil || sent != n {
		t.Fatalf("published %d: %v", sent, err)
	}
	if _, err := r.drain(b.Ctx, p, time.Now()); err != nil {
		t.Fatal(err)
	}
	var (
		due    uint64
		scheds int
	)
	if err := waitFor(b.Ctx, 30*time.Second, func() bool {
		due = rawSubjects(t, b, fleetRawDueSubject)[fleetRawDueSubject]
		scheds = len(rawSubjects(t, b, fleetRawRetPfx+".sched.>"))
		return due == n && scheds == 0
	}); err != nil {
		t.Fatalf("%d due messages and %d schedules left, want %d and none: %v", due, scheds, n, err)
	}
}

// rawSubjects counts the messages on each subject of the raw retries
// stream that matches filter.
func rawSubjects(t *testing.T, b *bustest.Bus, filter string) map[string]uint64 {
	t.Helper()
	st, err := b.JS.Stream(b.Ctx, fleetRawRetries)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(b.Ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects
}
