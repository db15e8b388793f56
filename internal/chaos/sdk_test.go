package chaos_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/chaos"
)

// The tests in sdk_*_test.go run the official SDKs, as they come, against
// the chaos provider and assert what each SDK reports and how often it
// called: what a fleet on its SDK's own retries does to a failing
// provider. They are the only files that import the SDKs.
//
// Many rows wait on an SDK's real backoff (half a second, then a second),
// so the rows of one SDK run at once, each against its own server, and
// are checked afterwards: the test takes as long as its slowest row, not
// the sum (parallel subtests would queue behind -parallel).

// sdkRow is one SDK scenario: a timeline, the calls, and what must hold.
type sdkRow[R any] struct {
	name     string
	timeline string
	// call makes the SDK calls against srv; attempts counts what the SDK
	// sent (a middleware sees each attempt, refused ones included).
	call  func(ctx context.Context, srv *chaos.Server, attempts *atomic.Int32) R
	check func(t *testing.T, got R, attempts int, log chaos.Log)
}

// runSDKRows runs every row at once, then checks each as a subtest. The
// server of a row is closed before its log is read, so every request in
// it is Done.
func runSDKRows[R any](t *testing.T, rows []sdkRow[R]) {
	t.Helper()
	results := make([]R, len(rows))
	attempts := make([]atomic.Int32, len(rows))
	logs := make([]chaos.Log, len(rows))
	var wg sync.WaitGroup
	for i, row := range rows {
		srv := start(t, row.timeline, chaos.Options{})
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			results[i] = row.call(ctx, srv, &attempts[i])
			_ = srv.Close()
			logs[i] = srv.Requests()
		})
	}
	wg.Wait()
	for i, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			row.check(t, results[i], int(attempts[i].Load()), logs[i])
		})
	}
}

// retries are the SDK retry numbers (X-Stainless-Retry-Count) of the
// requests the server got, in order.
func retries(log chaos.Log) []int {
	out := make([]int, len(log))
	for i, r := range log {
		out[i] = r.SDKRetry
	}
	return out
}

// gaps are the times between successive arrivals, on the server's clock.
func gaps(log chaos.Log) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(log); i++ {
		out = append(out, log[i].At.Sub(log[i-1].At).Round(time.Millisecond))
	}
	return out
}

// Timelines the SDK rows share: each fault from the start, for all.
const (
	always503         = "faults:\n  - {name: f, kind: unavailable}\n"
	alwaysOverloaded  = "faults:\n  - {name: f, kind: overloaded}\n"
	alwaysRefused     = "faults:\n  - {name: f, kind: refuse}\n"
	alwaysReset       = "faults:\n  - {name: f, kind: reset}\n"
	always429         = "faults:\n  - {name: f, kind: rate_limit}\n"
	always429AfterMs  = "faults:\n  - {name: f, kind: rate_limit, retry_after: 600ms, retry_after_ms: true}\n"
	always429After1s  = "faults:\n  - {name: f, kind: rate_limit, retry_after: 1s}\n"
	always429After3m  = "faults:\n  - {name: f, kind: rate_limit, retry_after: 3m}\n"
	quotaAfterOne     = "faults:\n  - {name: f, kind: quota, after_requests: 1}\n"
	alwaysEmpty400    = "faults:\n  - {name: f, kind: empty_400}\n"
	refuseMarked      = "faults:\n  - {name: f, kind: refusal, marker: '[[no]]'}\n"
	refuseMarkedError = "faults:\n  - {name: f, kind: refusal, marker: '[[no]]', shape: error}\n"
	overflowAbove100  = "faults:\n  - {name: f, kind: overflow, above_tokens: 100}\n"
	slowHeaders       = "faults:\n  - {name: f, kind: slow, delay: 1h}\n"
	stallAfterTwo     = "faults:\n  - {name: f, kind: slow, stall: 1h, after_chunks: 2}\n"
	breakAfterTwo     = "faults:\n  - {name: f, kind: stream_error, after_chunks: 2}\n"
)

// giveUpAfter is a stream's delta callback that cancels the call a moment
// after the n-th delta: a caller giving up on a stream that stopped. The
// moment leaves the SDK time to end the stream itself, if it would.
func giveUpAfter(n int, cancel context.CancelFunc) func(int) {
	return func(deltas int) {
		if deltas == n {
			time.AfterFunc(200*time.Millisecond, cancel)
		}
	}
}
