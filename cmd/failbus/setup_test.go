package main

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/embedded"
)

// bundle is what a CLI test needs: a real server with the topology applied
// and a client.
type bundle struct {
	srv *embedded.Server
	nc  *nats.Conn
	js  jetstream.JetStream
	ctx context.Context
}

func setup(t *testing.T) *bundle {
	t.Helper()
	bus := bustest.Start(t, 60*time.Second)
	nc := bus.NC
	srv, js, ctx := bus.Srv, bus.JS, bus.Ctx
	return &bundle{srv: srv, nc: nc, js: js, ctx: ctx}
}

// syncBuffer is a bytes.Buffer safe for a writer and a polling reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor polls cond until it holds or 30s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
