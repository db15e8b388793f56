package bench

import (
	"runtime/metrics"
	"time"
)

// usage is what the whole process (the server, every service and the
// bench's own load) spent over one measured span: CPU time (zero where
// cpuTime reports none) and heap allocations, objects and bytes. Per
// outcome, CPU holds steadier than throughput on a shared machine, and
// allocations (the collector's work, 12–20 % of a failbus step's CPU in
// its profiles) steadier still.
type usage struct {
	cpu                time.Duration
	allocs, allocBytes float64
}

// cpuUSPer is the span's CPU time in µs per one of n.
func (u usage) cpuUSPer(n float64) float64 { return float64(u.cpu/time.Microsecond) / n }

// meter measures one span: startMeter at its start, since at its end.
type meter struct {
	cpu            time.Duration
	cpuOK          bool
	objects, bytes uint64
}

func startMeter() meter {
	m := meter{}
	m.cpu, m.cpuOK = cpuTime()
	m.objects, m.bytes = heapAllocs()
	return m
}

// since is what the process spent since m started.
func (m meter) since() usage {
	var u usage
	if cpu, ok := cpuTime(); ok && m.cpuOK {
		u.cpu = cpu - m.cpu
	}
	o, b := heapAllocs()
	u.allocs, u.allocBytes = float64(o-m.objects), float64(b-m.bytes)
	return u
}

// heapAllocs is how many heap objects and bytes this process has allocated
// so far (runtime/metrics, no stop-the-world).
func heapAllocs() (objects, bytes uint64) {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() == metrics.KindUint64 {
		objects = s[0].Value.Uint64()
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		bytes = s[1].Value.Uint64()
	}
	return objects, bytes
}
