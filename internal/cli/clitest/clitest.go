// Package clitest holds what the tests of the failbus commands share: a
// buffer a command writes while the test polls it, a deadline-bound poll,
// a file for a command to read and an outcome stored as an agent stores
// it. The server side is internal/bustest.
package clitest

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/pkg/events"
)

// SyncBuffer is a bytes.Buffer safe for a writer and a polling reader.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// WaitFor polls cond every 10ms until it holds, failing the test after 30s.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WriteFile writes content to a file called name in a fresh temporary
// directory of the test (a policy file for a command, say) and returns its
// path.
func WriteFile(t testing.TB, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// PublishOutcome stores o on its subject, as an agent publishes it, and
// returns its sequence in FAILBUS_OUTCOMES.
func PublishOutcome(t testing.TB, ctx context.Context, js jetstream.JetStream, o *events.Outcome) uint64 {
	t.Helper()
	data, hdr, err := events.Encode(o)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: hdr, Data: data})
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}
