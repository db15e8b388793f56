package bench

import "runtime/metrics"

// heapAllocs is how many heap objects and bytes this process has allocated
// so far (runtime/metrics, no stop-the-world): the server, every service
// and the bench's own load. Per outcome, it is the garbage the collector
// pays for (12–20 % of a failbus step's CPU in its profiles), counted
// steadily where CPU time and throughput move with the neighbours.
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

// allocMeter measures the allocations of one phase.
type allocMeter struct{ objects, bytes uint64 }

func startAllocs() allocMeter {
	o, b := heapAllocs()
	return allocMeter{o, b}
}

// per returns the objects and bytes allocated since the meter started,
// divided by n.
func (m allocMeter) per(n float64) (objects, bytes float64) {
	o, b := heapAllocs()
	return float64(o-m.objects) / n, float64(b-m.bytes) / n
}
