package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/pkg/events"
)

// benchTiny are sizes that run the whole bench in a few seconds: the test
// checks the report's shape, never its figures.
var benchTiny = []string{"--n", "200", "--rounds", "2", "--k", "20", "--delay-min", "100ms", "--delay-max", "300ms",
	"--rates", "100,200", "--rate-seconds", "0.5", "--pending", "100"}

// TestBench runs `failbus bench` end to end on tiny sizes and checks the
// shape of both outputs: every figure measured, every lateness sample
// collected, the machine described. Timings are not checked (speed is
// measured, not asserted).
func TestBench(t *testing.T) {
	t.Parallel()
	stepProfile := filepath.Join(t.TempDir(), "failbus-step.prof")
	allocProfile := filepath.Join(t.TempDir(), "failbus-step.allocs")
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, out string)
	}{
		{"a readable table with medians, ratios and lateness", benchTiny, func(t *testing.T, out string) {
			for _, want := range []string{
				"failbus bench: one embedded nats-server",
				"machine: ", "GOMAXPROCS", "go1.",
				"corpus:  internal/policy/classify/testdata/corpus.jsonl",
				"200 outcomes per round, 2 rounds (median",
				"THROUGHPUT", "median", "min", "max", "baseline", "× baseline", "× raw relay",
				"raw JetStream publish", "msgs/s",
				"raw JetStream consume",
				"raw publish + consume: N/(t_pub + t_cons)",
				"raw relay, the classifier's shape",
				"failbus ingest → FAILBUS_CLASSIFIED", "outcomes/s",
				"failbus ingest → every service caught up",
				"failbus plumbing: the bus's stream writes, no policy", "× plumbing",
				"CPU per outcome, the whole process", "µs", "raw publish + consume",
				"classify only", "/s per core", "ns/op", "allocs/op",
				"SCHEDULED-RETRY LATENESS (20 each, due 0.1s–0.3s ahead)", "p50", "p99",
				"raw JetStream @at: stored − due",
				"failbus scheduler: stored − due_at",
				"failbus − raw",
				"failbus end to end", "published at once",
				"raw/3", "× raw/3",
				"DECISION LATENCY (publish → stored)", "100/s", "200/s", "raw p99", "failbus p99", "cores needed",
				"FAILBUS BY HOP (p50 / p99)", "publish → outcome", "→ classified", "→ decided",
				"WITH 100 RETRIES PENDING (failbus) AND 100 RAW @at SCHEDULES", "process RSS", "Go heap",
				"the failbus step's live objects by who allocated them (heap profile)", "nats-server ", "scheduler ", "runner ",
				"LATENESS WITH THEM PENDING (20 each)",
				"GOALS", "ingest ≥ 0.60× raw/3", "every service caught up ≥ 0.30× raw/3",
				"not measured (--rates without 5000)", "fewer than 100000",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q", want)
				}
			}
			if strings.Count(out, "×") < 2 {
				t.Errorf("output lacks the failbus/raw ratios")
			}
		}},
		{"one JSON object with every figure", append([]string{"--json", "--cpuprofile-failbus", stepProfile, "--allocprofile-failbus", allocProfile}, benchTiny...), func(t *testing.T, out string) {
			// Profiles of the failbus step: pprof's gzipped protobuf; the
			// allocations as two, before and after the step.
			for _, p := range []struct{ flag, path string }{
				{"--cpuprofile-failbus", stepProfile}, {"--allocprofile-failbus", allocProfile}, {"--allocprofile-failbus base", allocProfile + ".base"},
			} {
				if prof, err := os.ReadFile(p.path); err != nil || len(prof) < 100 || prof[0] != 0x1f || prof[1] != 0x8b {
					t.Errorf("%s wrote %d bytes (%v), want a gzipped profile", p.flag, len(prof), err)
				}
			}
			after, _ := os.ReadFile(allocProfile)
			if base, _ := os.ReadFile(allocProfile + ".base"); bytes.Equal(after, base) {
				t.Errorf("--allocprofile-failbus: the profile after the step is its base")
			}
			var rep benchReport
			dec := json.NewDecoder(strings.NewReader(out))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&rep); err != nil {
				t.Fatalf("not one report: %v", err)
			}
			if rep.Machine.GOMAXPROCS < 1 || rep.Machine.GoVersion == "" || rep.Machine.NATSServer == "" {
				t.Errorf("machine %+v", rep.Machine)
			}
			if rep.Params.N != 200 || rep.Params.Rounds != 2 || rep.Params.K != 20 || rep.Params.CorpusRows < 100 {
				t.Errorf("params %+v", rep.Params)
			}
			if len(rep.Rounds) != 2 {
				t.Fatalf("%d rounds, want 2", len(rep.Rounds))
			}
			_, cpuMeasured := cpuTime()
			for i, r := range append(rep.Rounds, rep.Median, rep.Min, rep.Max) {
				for j, f := range benchFigures {
					if !cpuMeasured && j >= len(benchFigures)-benchCPUFigures {
						continue
					}
					if v := *f(&r); !(v > 0) {
						t.Errorf("round/summary %d: figure %d is %v", i, j, v)
					}
				}
			}
			if len(rep.Goals) != 5 || !rep.Goals[0].Measured || rep.Goals[2].Measured || rep.Goals[3].Measured || rep.Goals[4].Measured {
				t.Errorf("goals %+v: want five, ingest measured, latency at 5000/s and the 100000 pending not", rep.Goals)
			}
			l := rep.Lateness
			for name, p := range map[string]benchPercentiles{"raw": l.Raw, "failbus": l.Failbus, "end to end": l.FailbusEndToEnd} {
				if p.N != 20 || p.MinMS > p.P50MS || p.P50MS > p.P99MS || p.P99MS > p.MaxMS {
					t.Errorf("%s lateness %+v", name, p)
				}
			}
			if len(rep.Latency) != 2 || rep.Latency[0].Rate != 100 || rep.Latency[1].Rate != 200 {
				t.Fatalf("latency %+v, want the rates 100 and 200", rep.Latency)
			}
			for _, lt := range rep.Latency {
				// Every message of the rate measured: 0.5 s of it.
				if lt.Raw.N != lt.Rate/2 || lt.Failbus.N != lt.Rate/2 || !(lt.AchievedPerS > 0) || lt.Failbus.P50MS > lt.Failbus.P99MS {
					t.Errorf("latency at %d/s: %+v", lt.Rate, lt)
				}
				// By hop, every outcome: a classification is stored after
				// its outcome, a decision after its classification.
				if h := lt.Hops; h == nil || h.Publish.N != lt.Rate/2 || h.Classifier.N != lt.Rate/2 || h.Scheduler.N != lt.Rate/2 ||
					h.Classifier.MinMS <= 0 || h.Scheduler.MinMS <= 0 || h.Scheduler.MaxMS > lt.Failbus.MaxMS {
					t.Errorf("latency at %d/s by hop: %+v", lt.Rate, lt.Hops)
				}
				// The CPU the rate needs: the rate × the throughput rounds'
				// failbus CPU per outcome.
				// CPU time is measured on linux (getrusage); elsewhere it may be 0.
				if want := float64(lt.Rate) * rep.Median.FailbusCPUUS / 1e6; (runtime.GOOS == "linux" && !(want > 0)) || math.Abs(lt.CoresNeeded-want) > 1e-9 {
					t.Errorf("latency at %d/s: cores needed %v, want %v (CPU per outcome %v µs)", lt.Rate, lt.CoresNeeded, want, rep.Median.FailbusCPUUS)
				}
			}
			p := rep.Pending
			if p == nil || p.N != 100 || !(p.DecidedPerS > 0) || !(p.RSSAfterMiB > 0) || !(p.HeapAfterMiB > 0) ||
				p.Lateness.Raw.N != 20 || p.Lateness.Failbus.N != 20 {
				t.Errorf("pending %+v", p)
			}
			// Every owner, in order; the server holds the bus's state at
			// every point (streams, consumers, the topology).
			if p != nil {
				var owners []string
				for _, o := range p.HeapByOwner {
					owners = append(owners, o.Owner)
					if o.Owner == ownerServer && !(o.BeforeMiB > 0 && o.RawMiB > 0 && o.AfterMiB > 0) {
						t.Errorf("nats-server's heap %+v, want some at every point", o)
					}
				}
				if !slices.Equal(owners, heapOwners) {
					t.Errorf("heap owners %v, want %v", owners, heapOwners)
				}
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, nil, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d\nstderr: %s\nstdout: %s", code, stderr.String(), stdout.String())
			}
			if !strings.Contains(stderr.String(), "round 2/2: ") {
				t.Errorf("no progress on stderr: %q", stderr.String())
			}
			tt.check(t, stdout.String())
			t.Log("\n" + stdout.String())
		})
	}
}

// TestBenchFull runs the bench with its defaults when FAILBUS_BENCH_FULL is
// set (`FAILBUS_BENCH_FULL=1 go test -run TestBenchFull -v ./internal/cli/bench/`),
// for machines where `failbus bench` is not at hand; it prints the report.
func TestBenchFull(t *testing.T) {
	if os.Getenv("FAILBUS_BENCH_FULL") == "" {
		t.Skip("set FAILBUS_BENCH_FULL=1 to run the full bench")
	}
	var stdout, stderr bytes.Buffer
	args := strings.Fields(os.Getenv("FAILBUS_BENCH_ARGS"))
	if code := run(args, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	t.Log("\n" + stderr.String() + "\n" + stdout.String())
}

func TestBenchArguments(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		code int
		err  string
	}{
		{"no outcomes", []string{"--n", "0"}, 2, "must be at least 1"},
		{"no rounds", []string{"--rounds", "0"}, 2, "must be at least 1"},
		{"a window of none", []string{"--window", "0"}, 2, "must be at least 1"},
		{"delays the wrong way round", []string{"--delay-min", "3s", "--delay-max", "2s"}, 2, "--delay-min <= --delay-max"},
		{"a delay the policy would not retry", []string{"--delay-max", "2m"}, 2, "above the default policy's retry max_delay"},
		{"a positional argument", []string{"now"}, 2, "unexpected arguments"},
		{"two CPU profiles", []string{"--cpuprofile", "a.prof", "--cpuprofile-failbus", "b.prof"}, 2, "one CPU profile at a time"},
		{"a corpus that is not there", []string{"--corpus", "/nonexistent/corpus.jsonl"}, 1, "corpus:"},
		{"help", []string{"-h"}, 0, "Usage: failbus bench"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, nil, &stdout, &stderr); code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			if !strings.Contains(stderr.String(), tt.err) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.err)
			}
		})
	}
}

// The built-in mix (used outside the repository) is valid input, and
// covers more than one class.
func TestBenchBuiltinMix(t *testing.T) {
	t.Parallel()
	classes := map[string]bool{}
	for i, o := range benchBuiltinMix() {
		o.ID, o.Agent = "x", benchAgent
		if _, _, err := events.Encode(&o); err != nil {
			t.Errorf("row %d: %v", i, err)
		}
		classes[classify.Classify(&o).Class] = true
	}
	if len(classes) < 5 {
		t.Errorf("classes %v: want a mix", classes)
	}
}

func TestBenchSummaries(t *testing.T) {
	t.Parallel()
	t.Run("median, min and max of every figure", func(t *testing.T) {
		rounds := []benchRound{{Ingest: 3, RawPublish: 10}, {Ingest: 1, RawPublish: 30}, {Ingest: 2, RawPublish: 20}, {Ingest: 4, RawPublish: 40}}
		med, lo, hi := summarize(rounds)
		if med.Ingest != 2.5 || lo.Ingest != 1 || hi.Ingest != 4 || med.RawPublish != 25 {
			t.Errorf("median %v %v, min %v, max %v", med.Ingest, med.RawPublish, lo.Ingest, hi.Ingest)
		}
		med, _, _ = summarize(rounds[:3])
		if med.Ingest != 2 {
			t.Errorf("odd median %v, want 2", med.Ingest)
		}
	})
	t.Run("nearest-rank percentiles", func(t *testing.T) {
		var d []time.Duration
		for i := 100; i >= 1; i-- {
			d = append(d, time.Duration(i)*time.Millisecond)
		}
		p := percentiles(d)
		if p.N != 100 || p.MinMS != 1 || p.P50MS != 50 || p.P99MS != 99 || p.MaxMS != 100 {
			t.Errorf("%+v", p)
		}
		if (percentiles(nil) != benchPercentiles{}) {
			t.Error("empty sample")
		}
	})
	t.Run("figures with three significant digits", func(t *testing.T) {
		for v, want := range map[float64]string{0.5: "0.50", 12.34: "12.3", 999: "999", 1234: "1.23k", 123456: "123k", 2.5e6: "2.50M"} {
			if got := human(v); got != want {
				t.Errorf("human(%v) = %q, want %q", v, got, want)
			}
		}
	})
}
