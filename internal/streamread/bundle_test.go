package streamread_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
)

// bundle is what a test against a real server needs.
type bundle struct {
	ctx context.Context
	nc  *nats.Conn
	js  jetstream.JetStream
}

// setup starts an embedded nats-server for one test.
func setup(t *testing.T) *bundle {
	t.Helper()
	srv := embedded.StartTest(t)
	nc := embedded.ConnectTest(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return &bundle{ctx: ctx, nc: nc, js: js}
}
