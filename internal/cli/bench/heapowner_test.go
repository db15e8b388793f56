package bench

import (
	"math"
	"runtime"
	"testing"
)

func TestHeapOwner(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		funcs []string
		want  string
	}{
		{"the server's own", []string{"github.com/nats-io/nats-server/v2/server.(*stream).processJetStreamMsg", "runtime.goexit"}, ownerServer},
		{"a client allocation is its caller's", []string{"github.com/nats-io/nats.go.(*Conn).newRespInbox", "github.com/nats-io/nats.go/jetstream.(*jetStream).PublishMsgAsync", "github.com/failbus/failbus/pkg/consumer.(*Runner).publishAsync"}, ownerRunner},
		{"msgpack under the scheduler", []string{"github.com/vmihailenco/msgpack/v5.(*Decoder).DecodeString", "github.com/failbus/failbus/internal/service/scheduler.(*ledgerIndex).scanned"}, ownerScheduler},
		{"the fault-scope store is the scheduler's", []string{"bytes.Clone", "github.com/failbus/failbus/internal/scopestore.(*Store).Update"}, ownerScheduler},
		{"the innermost owner decides", []string{"github.com/failbus/failbus/pkg/events.Marshal", "github.com/failbus/failbus/internal/service/scheduler.(*Service).decide", "github.com/failbus/failbus/pkg/consumer.(*pipeline).process"}, ownerServices},
		{"the bench's load", []string{"github.com/failbus/failbus/internal/cli/bench.failures"}, ownerBench},
		{"a client's read loop", []string{"github.com/nats-io/nats.go.(*Conn).readLoop", "runtime.goexit"}, ownerOther},
		{"no frames", nil, ownerOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := heapOwner(tc.funcs); got != tc.want {
				t.Errorf("heapOwner(%v) = %q, want %q", tc.funcs, got, tc.want)
			}
		})
	}
}

// heldByBench keeps TestHeapByOwnerFindsWhatTheBenchHolds's allocation
// alive while it measures.
var heldByBench [][]byte

// TestHeapByOwnerFindsWhatTheBenchHolds: 64 MiB allocated in this package
// and held shows up as the bench's, within the profile's sampling (4 MiB
// objects are sampled at the default rate with near certainty), and goes
// once released. Not parallel: it measures the process's heap.
func TestHeapByOwnerFindsWhatTheBenchHolds(t *testing.T) {
	before := heapByOwner()[ownerBench]
	heldByBench = make([][]byte, 16)
	for i := range heldByBench {
		heldByBench[i] = make([]byte, 4<<20)
	}
	held := heapByOwner()
	grew := held[ownerBench] - before
	if math.Abs(grew-64) > 4 {
		t.Errorf("the bench's heap grew %.1f MiB holding 64 MiB (by owner: %v)", grew, held)
	}
	runtime.KeepAlive(heldByBench)
	heldByBench = nil
	if after := heapByOwner()[ownerBench]; math.Abs(after-before) > 4 {
		t.Errorf("the bench's heap is %.1f MiB once released, %.1f before", after, before)
	}
}
