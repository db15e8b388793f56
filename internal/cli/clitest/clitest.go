// Package clitest holds what the tests of the failbus commands share: a
// buffer a command writes while the test polls it, and a deadline-bound
// poll. The server side is internal/bustest.
package clitest

import (
	"bytes"
	"sync"
	"testing"
	"time"
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
