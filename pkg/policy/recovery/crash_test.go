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

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy/recovery"
)

var errCrash = errors.New("crash")

// faulty wraps a store and a publisher and "crashes" (returns errCrash) at
// the n-th durable operation — a provider save, a publish or a ledger
// mark — before or after performing it, the way SIGKILL at that point would
// leave things. Nothing of the core's survives a crash but the store.
type faulty struct {
	*recovery.MemStore
	rec   *recovery.Recorder
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
			f.MemStore.SaveProvider(ctx, r, rev)
		}
		return 0, errCrash
	}
	return f.MemStore.SaveProvider(ctx, r, rev)
}

func (f *faulty) MarkSent(ctx context.Context, id string, at time.Time) error {
	if f.hit() {
		if f.after {
			f.MemStore.MarkSent(ctx, id, at)
		}
		return errCrash
	}
	return f.MemStore.MarkSent(ctx, id, at)
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

// crashStory is the eight-hour story with probes every 30 minutes (fewer
// outputs to crash in), run to the end with a crash at operation n; each
// failed step is retried, as a redelivery or the next tick of a restarted
// service does. It returns every output (one per id, as a stream keeps them),
// how many operations ran, and whether the crash point was reached.
func crashStory(t *testing.T, at int, after bool) ([]recovery.Output, *faulty, bool) {
	t.Helper()
	ctx := context.Background()
	cfg := recovery.DefaultConfig()
	cfg.ProbeInterval = 30 * time.Minute
	mem, rec := recovery.NewMemStore(), &recovery.Recorder{}
	f := &faulty{MemStore: mem, rec: rec, at: at, after: after, published: map[string]int{}}
	sim, err := recovery.NewSimOn(cfg, f, f, mem, rec)
	if err != nil {
		t.Fatal(err)
	}
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
	var out []recovery.Output
	for _, l := range eightHourStory(30) {
		in := l.in
		if in.Task != nil {
			seq, err := mem.AppendTask(ctx, *in.Task, l.at) // stored once, like a stream
			if err != nil {
				t.Fatal(err)
			}
			in.TaskSeq = seq
		}
		retry("step", func() error {
			o, err := sim.Step(ctx, in, l.at)
			out = append(out, o...)
			return err
		})
	}
	retry("tick", func() error {
		o, err := sim.Tick(ctx, recovered.Add(time.Minute))
		out = append(out, o...)
		return err
	})
	return out, f, crashed
}

// ids lists the outputs as "id content", sorted: the same commands with
// the same content compare equal. The time a message was sent is left out:
// a restart sends what is left later than an uninterrupted run would.
func ids(out []recovery.Output) []string {
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
// repeats nothing and skips nothing: the same commands, each once.
func TestCrashAnywhereRepeatsNothingSkipsNothing(t *testing.T) {
	base, f, _ := crashStory(t, 0, false)
	want := ids(base)
	if len(want) == 0 {
		t.Fatal("no outputs")
	}
	// Every operation of the checklist's steps and of the end of the
	// release, every 5th while held tasks are released, and every 50th
	// before (the outage: holds and probes). FAILBUS_LONG_TESTS=1 crashes
	// at every operation.
	n := f.n
	rid := recovery.RecoveryID(down, t0)
	first := f.published["recovery:"+rid+":"+events.StepConfirm]
	releaseFrom := f.published["recovery:dispatch:q-000:1"]
	releaseTo := f.published["recovery:"+rid+":"+events.StepRelease]
	if first == 0 || releaseFrom == 0 || releaseTo == 0 {
		t.Fatal("checklist not published")
	}
	var points []int
	for k := 1; k <= n; k++ {
		switch {
		case os.Getenv("FAILBUS_LONG_TESTS") != "",
			k >= first-3 && k <= releaseFrom+3,
			k >= releaseTo-6,
			k > releaseFrom && k < releaseTo && k%5 == 0,
			k%50 == 0:
			points = append(points, k)
		}
	}
	crashes := 0
	for _, k := range points {
		for _, after := range []bool{false, true} {
			out, _, crashed := crashStory(t, k, after)
			if !crashed {
				t.Fatalf("crash point %d not reached", k)
			}
			crashes++
			if got := ids(out); !slices.Equal(got, want) {
				t.Fatalf("crash at operation %d (after=%v): %d outputs, want %d; first difference %s",
					k, after, len(got), len(want), firstDiff(got, want))
			}
		}
	}
	t.Logf("%d crash points of %d operations: same %d commands each time", crashes, n, len(want))
}

func firstDiff(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("%q vs %q", a[i], b[i])
		}
	}
	return "in length"
}
