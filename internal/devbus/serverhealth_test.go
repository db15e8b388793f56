package devbus

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/failbus/failbus/internal/embedded"
)

// TestCannotStoreReadsTheServersHealth: the server's readiness check (a
// millisecond, overrun on a saturated machine) is not a store failure;
// any error of its JetStream, streams or consumers is, named.
func TestCannotStoreReadsTheServersHealth(t *testing.T) {
	conn := server.HealthzError{Type: server.HealthzErrorConn, Error: "failed to be ready for connections after 1ms: "}
	stream := server.HealthzError{Type: server.HealthzErrorStream, Account: "$G", Stream: "FAILBUS_CLASSIFIED",
		Error: "JetStream stream '$G > FAILBUS_CLASSIFIED' write error: no space left on device"}
	js := server.HealthzError{Type: server.HealthzErrorJetStream, Error: "JetStream not enabled"}
	for _, tc := range []struct {
		name string
		st   server.HealthStatus
		want []string // in the error; nil: no error
	}{
		{"ok", server.HealthStatus{Status: "ok"}, nil},
		{"readiness overrun", server.HealthStatus{Status: "error", Errors: []server.HealthzError{conn}}, nil},
		{"a stream's write error", server.HealthStatus{Status: "error", Errors: []server.HealthzError{stream}}, []string{"STREAM FAILBUS_CLASSIFIED", "no space left"}},
		{"JetStream off", server.HealthStatus{Status: "error", Errors: []server.HealthzError{js}}, []string{"JETSTREAM", "not enabled"}},
		{"both", server.HealthStatus{Status: "error", Errors: []server.HealthzError{stream, js}}, []string{"FAILBUS_CLASSIFIED", "not enabled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := cannotStore(&tc.st)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("cannotStore = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrServerCannotStore) {
				t.Fatalf("cannotStore = %v, want ErrServerCannotStore", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
	// A real server with JetStream, asked as serverHealthy asks it.
	srv := embedded.StartTest(t)
	if err := cannotStore(srv.NATS().Healthz(&server.HealthzOptions{Details: true})); err != nil {
		t.Errorf("a healthy server: %v", err)
	}
}

// TestWatchServerStopsTheBusOnTwoFailuresInARow: a failed check followed
// by a passing one leaves the bus running; two in a row fail it with the
// second's error.
func TestWatchServerStopsTheBusOnTwoFailuresInARow(t *testing.T) {
	e1, e2 := errors.New("first"), errors.New("second")
	for _, tc := range []struct {
		name    string
		answers []error
		want    error // the bus's error; nil: still running
	}{
		{"one-off failures", []error{e1, nil, e1, nil, nil, e2, nil}, nil},
		{"two in a row", []error{nil, e1, nil, e1, e2, nil}, e2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Bus{failed: make(chan struct{})}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var mu sync.Mutex
			asked := 0
			check := func() error {
				mu.Lock()
				defer mu.Unlock()
				if asked == len(tc.answers) {
					cancel() // every answer given
					return nil
				}
				asked++
				return tc.answers[asked-1]
			}
			b.watchServer(ctx, time.Millisecond, check)
			select {
			case <-b.failed:
				if tc.want == nil || !slices.Equal(b.errs, []error{tc.want}) {
					t.Fatalf("failed with %v, want %v", b.errs, tc.want)
				}
			default:
				if tc.want != nil {
					t.Fatalf("still running after %v", tc.answers)
				}
			}
		})
	}
}
