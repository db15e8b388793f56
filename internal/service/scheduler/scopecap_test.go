package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy/scope"
)

// TestScopeBookForgetsTheLeastRecentlySeenProvider: past MaxProviders the
// least recently seen provider is forgotten, never one held in an outage,
// and the forgetting is reported.
func TestScopeBookForgetsTheLeastRecentlySeenProvider(t *testing.T) {
	forgot := 0
	b := newScopeBook(time.Minute, time.Hour, 10, func(p, _ int) { forgot += p })
	b.seedOutage(events.Health{Provider: "down", State: events.HealthOutage, At: events.At(time.Unix(1, 0))})
	cfg := scope.DefaultConfig()
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for i := range 5_000 {
		at = at.Add(time.Millisecond)
		c := events.Classification{OutcomeID: fmt.Sprint(i), Provider: fmt.Sprintf("p-%d", i), Class: events.ClassOK, At: events.At(at)}
		b.observe(cfg, c, at)
	}
	if len(b.states) != 10 || b.lru.Len() != 10 {
		t.Fatalf("%d providers held (%d in order), want 10", len(b.states), b.lru.Len())
	}
	if !b.down("down") {
		t.Fatal("the provider in an outage was forgotten")
	}
	if forgot != 5_000+1-10 {
		t.Fatalf("%d forgotten, want %d", forgot, 5_000+1-10)
	}
}
