// Package bustest starts what every failbus integration test needs: a real
// embedded nats-server in the test's temp dir, a client connection, and the
// failbus topology applied. One place, so no test package builds its own.
package bustest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
)

// Bus is a running server with the topology applied. Ctx ends after the
// timeout given to Start or when the test ends.
type Bus struct {
	Srv *embedded.Server
	NC  *nats.Conn
	JS  jetstream.JetStream
	Ctx context.Context
}

// Start starts the server, connects and applies the default topology; all
// of it is torn down when the test ends.
func Start(t testing.TB, timeout time.Duration) *Bus {
	t.Helper()
	srv := embedded.StartTest(t)
	nc := embedded.ConnectTest(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	if err := topology.Apply(ctx, js, topology.Options{}); err != nil {
		t.Fatalf("apply topology: %v", err)
	}
	return &Bus{Srv: srv, NC: nc, JS: js, Ctx: ctx}
}
