package bench

import (
	"math"
	"runtime"
	"strings"
)

// Heap owners: who holds the heap in use, by the allocation site's stack
// (heapOwner). The bench runs nats-server, every service and its own load
// in one process, so the process's RSS alone cannot say whether retries
// pending cost the scheduler memory or the server; the heap profile can.
const (
	ownerServer    = "nats-server"
	ownerScheduler = "scheduler"
	ownerRunner    = "runner"
	ownerServices  = "other services"
	ownerBench     = "bench"
	ownerOther     = "other"
)

// heapOwners lists the owners in the order they are printed.
var heapOwners = []string{ownerServer, ownerScheduler, ownerRunner, ownerServices, ownerBench, ownerOther}

// ownerPrefixes maps function-name prefixes to owners; the first frame of
// an allocation's stack (from the allocating function outwards) that
// matches one decides. Frames of nats.go, msgpack, the runtime and the
// standard library match none: an allocation is its caller's.
var ownerPrefixes = []struct{ prefix, owner string }{
	{"github.com/nats-io/nats-server/", ownerServer},
	{"github.com/failbus/failbus/internal/cli/bench.", ownerBench},
	{"github.com/failbus/failbus/internal/service/scheduler.", ownerScheduler},
	{"github.com/failbus/failbus/internal/scopestore.", ownerScheduler},
	{"github.com/failbus/failbus/pkg/consumer.", ownerRunner},
	{"github.com/failbus/failbus/", ownerServices},
}

// heapOwner is the owner of an allocation whose stack holds funcs, the
// allocating function first; ownerOther when no frame names one (the
// runtime's own, or a client connection's read buffers).
func heapOwner(funcs []string) string {
	for _, fn := range funcs {
		for _, p := range ownerPrefixes {
			if strings.HasPrefix(fn, p.prefix) {
				return p.owner
			}
		}
	}
	return ownerOther
}

// heapByOwner estimates the heap in use by owner, in MiB, from the
// runtime's heap profile (sampled every runtime.MemProfileRate bytes,
// scaled as pprof scales it). Two collections first: the profile
// reflects the heap as of the last completed one.
func heapByOwner() map[string]float64 {
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, false)
	for {
		recs = make([]runtime.MemProfileRecord, n+50)
		var ok bool
		if n, ok = runtime.MemProfile(recs, false); ok {
			recs = recs[:n]
			break
		}
	}
	out := make(map[string]float64, len(heapOwners))
	owners := map[uintptr]string{} // by allocating PC: one stack walk per site
	funcs := make([]string, 0, 32)
	for i := range recs {
		r := &recs[i]
		bytes := scaleHeapSample(r.InUseObjects(), r.InUseBytes(), int64(runtime.MemProfileRate))
		if bytes == 0 {
			continue
		}
		stk := r.Stack()
		key := uintptr(0)
		if len(stk) > 0 {
			key = stk[0]
		}
		owner, seen := owners[key]
		if !seen || key == 0 {
			funcs = funcs[:0]
			frames := runtime.CallersFrames(stk)
			for {
				f, more := frames.Next()
				funcs = append(funcs, f.Function)
				if !more {
					break
				}
			}
			owner = heapOwner(funcs)
			// One allocating PC can be reached from several owners (a
			// shared helper): cache only sites whose owner is the
			// allocating function's own.
			if len(funcs) > 0 && heapOwner(funcs[:1]) == owner {
				owners[key] = owner
			}
		}
		out[owner] += float64(bytes) / (1 << 20)
	}
	return out
}

// scaleHeapSample is pprof's estimate of the bytes behind a heap
// profile record of count objects and size bytes sampled at rate (see
// runtime/pprof's scaleHeapSample): small objects are sampled less often.
func scaleHeapSample(count, size, rate int64) int64 {
	if count == 0 || size == 0 {
		return 0
	}
	if rate <= 1 {
		return size
	}
	avg := float64(size) / float64(count)
	return int64(float64(size) / (1 - math.Exp(-avg/float64(rate))))
}
