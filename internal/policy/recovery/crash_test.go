package recovery_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/memstore"
	"github.com/failbus/failbus/internal/policy/recovery/simulate"
	"github.com/failbus/failbus/pkg/events"
)

var errCrash = errors.New("crash")

// faulty wraps a store and a publisher and "crashes" (returns errCrash) at
// the n-th durable operation — a provider save, a publish or a ledger
// mark — before or after performing it, the way SIGKILL at that point would
// leave things. Nothing of the core's survives a crash but the store.
type faulty struct {
	*memstore.Store
	rec   *simulate.Recorder
	mu    sync.Mutex
	n     int
	at    int
	after bool
	// published: the operation number of each id's first publish.
	published map[string]int
}

func (f *faulty) hit() (crash bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	return f.n == f.at
}

func (f *faulty) SaveProvider(ctx context.Context, r *recovery.ProviderRecord, rev uint64) (uint64, error) {
	if f.hit() {
		if f.after {
			f.Store.SaveProvider(ctx, r, rev)
		}
		return 0, errCrash
	}
	return f.Store.SaveProvider(ctx, r, rev)
}

func (f *faulty) MarkSent(ctx context.Context, id string, at time.Time) error {
	if f.hit() {
		if f.after {
			f.Store.MarkSent(ctx, id, at)
		}
		return errCrash
	}
	return f.Store.MarkSent(ctx, id, at)
}

func (f *faulty) Publish(ctx context.Context, id, subject string, msg events.Message, verify time.Time) error {
	f.mu.Lock()
	if _, ok := f.published[id]; !ok {
		f.published[id] = f.n + 1
	}
	f.mu.Unlock()
	if f.hit() {
		if f.after {
			f.rec.Publish(ctx, id, subject, msg, verify)
		}
		return errCrash
	}
	return f.rec.Publish(ctx, id, subject, msg, verify)
}

// crashLines is the eight-hour story with 30 tasks, its tasks stored once
// up front (as the stream holds them), split at the recovery: before it
// the outage (holds, probes), from it the checklist and the release.
func crashLines(t *testing.T, mem *memstore.Store) (outage, checklist []storyLine) {
	t.Helper()
	lines := eightHourStory(30)
	for i, l := range lines {
		if l.in.Task != nil {
			seq, err := mem.AppendTask(context.Background(), *l.in.Task, l.at)
			if err != nil {
				t.Fatal(err)
			}
			lines[i].in.TaskSeq = seq
		}
		if l.in.Health != nil && l.in.Health.State == events.HealthRecovered && checklist == nil {
			outage, checklist = lines[:i], lines[i:]
		}
	}
	return outage, checklist
}

// crashRun runs lines on sim with a crash at operation f.at; each failed
// step is retried, as a redelivery or the next tick of a restarted service
// does. It returns the outputs (one per id, as a stream keeps them) and
// whether the crash point was reached.
func crashRun(t *testing.T, sim *simulate.Sim, lines []storyLine, end time.Time) ([]simulate.Output, bool) {
	t.Helper()
	ctx := context.Background()
	crashed := false
	retry := func(what string, fn func() error) {
		for range 3 {
			err := fn()
			if err == nil {
				return
			}
			if !errors.Is(err, errCrash) {
				t.Fatalf("%s: %v", what, err)
			}
			crashed = true
		}
		t.Fatalf("%s: still failing after a restart", what)
	}
	var out []simulate.Output
	for _, l := range lines {
		retry("step", func() error {
			o, err := sim.Step(ctx, l.in, l.at)
			out = append(out, o...)
			return err
		})
	}
	retry("tick", func() error {
		o, err := sim.Tick(ctx, end)
		out = append(out, o...)
		return err
	})
	return out, crashed
}

func crashConfig() recovery.Config {
	cfg := recovery.DefaultConfig()
	cfg.ProbeInterval = 30 * time.Minute
	return cfg
}

// crashWhole runs the whole story with a crash at operation at.
func crashWhole(t *testing.T, at int, after bool) ([]simulate.Output, *faulty, bool) {
	mem, rec := memstore.New(), &simulate.Recorder{}
	outage, checklist := crashLines(t, mem)
	f := &faulty{Store: mem, rec: rec, at: at, after: after, published: map[string]int{}}
	sim, err := simulate.NewOn(crashConfig(), f, f, mem, rec)
	if err != nil {
		t.Fatal(err)
	}
	out, crashed := crashRun(t, sim, append(outage, checklist...), recovered.Add(time.Minute))
	return out, f, crashed
}

// ids lists the outputs as "id content", sorted: the same commands with
// the same content compare equal. The time a message was sent is left out:
// a restart sends what is left later than an uninterrupted run would.
func ids(out []simulate.Output) []string {
	var s []string
	for _, o := range out {
		b, err := json.Marshal(o)
		if err != nil {
			panic(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			panic(err)
		}
		delete(m, "at")
		b, _ = json.Marshal(m)
		s = append(s, o.ID+" "+string(b))
	}
	slices.Sort(s)
	return s
}

// A crash at any durable operation of the story — before or after it —
// repeats nothing and skips nothing: the same commands, each once. Every
// operation from the recovery on (the checklist steps, the release, the
// final record and notification) is a crash point, forked from the store as
// it was when the provider recovered; a sample of the outage's operations
// (holds, probes) runs the whole story. FAILBUS_LONG_TESTS=1 crashes at
// every operation of the whole story.
func TestCrashAnywhereRepeatsNothingSkipsNothing(t *testing.T) {
	whole, _, _ := crashWhole(t, 0, false)
	want := ids(whole)
	if len(want) == 0 {
		t.Fatal("no outputs")
	}

	// The outage, run once; the checklist forked from its end.
	mem, rec := memstore.New(), &simulate.Recorder{}
	outage, checklist := crashLines(t, mem)
	base, err := simulate.NewOn(crashConfig(), mem, rec, mem, rec)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := crashRun(t, base, outage, outage[len(outage)-1].at)
	fork := func(at int, after bool) ([]simulate.Output, *faulty, bool) {
		m, r := mem.Clone(), &simulate.Recorder{}
		f := &faulty{Store: m, rec: r, at: at, after: after, published: map[string]int{}}
		sim, err := base.Fork(f, f, m, r)
		if err != nil {
			t.Fatal(err)
		}
		out, crashed := crashRun(t, sim, checklist, recovered.Add(time.Minute))
		return append(slices.Clone(before), out...), f, crashed
	}
	_, f, _ := fork(0, false)
	n := f.n
	// Releasing one held task is the same few operations each time: every
	// 7th of them is a crash point (all of them with FAILBUS_LONG_TESTS).
	releaseFrom := f.published["recovery:dispatch:q-000:1"]
	releaseTo := f.published["recovery:"+recovery.RunID(down, t0)+":"+events.StepRelease]
	if releaseFrom == 0 || releaseTo == 0 {
		t.Fatal("release not seen")
	}
	long := os.Getenv("FAILBUS_LONG_TESTS") != ""
	crashes := 0
	check := func(label string, out []simulate.Output, crashed bool) {
		if !crashed {
			t.Fatalf("%s: crash point not reached", label)
		}
		crashes++
		if got := ids(out); !slices.Equal(got, want) {
			t.Fatalf("%s: %d outputs, want %d; first difference %s", label, len(got), len(want), firstDiff(got, want))
		}
	}
	for k := 1; k <= n; k++ {
		if !long && k > releaseFrom+8 && k < releaseTo-8 && k%7 != 0 {
			continue
		}
		for _, after := range []bool{false, true} {
			out, _, crashed := fork(k, after)
			check(fmt.Sprintf("crash at checklist operation %d of %d (after=%v)", k, n, after), out, crashed)
		}
	}
	_, wf, _ := crashWhole(t, 0, false)
	stride := wf.n / 8
	if long {
		stride = 1
	}
	for k := 1; k <= wf.n-n; k += stride {
		out, _, crashed := crashWhole(t, k, k%2 == 0)
		check(fmt.Sprintf("crash at outage operation %d", k), out, crashed)
	}
	t.Logf("%d crash points (operations from the recovery on: %d, each before and after, every 7th while releasing; and a sample of the %d before it): the same %d commands each time",
		crashes, n, wf.n-n, len(want))
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("%q vs %q", a[i], b[i])
		}
	}
	return "in length"
}
