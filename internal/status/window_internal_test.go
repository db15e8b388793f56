package status

import (
	"testing"
	"time"
)

// The window counts by minute over its span and forgets older minutes;
// past maxKeys distinct keys a minute's others count together.
func TestWindowCountsTheLastSpan(t *testing.T) {
	w := newWindow(time.Hour, 2)
	t0 := time.Date(2026, 1, 1, 10, 0, 30, 0, time.UTC)
	w.add(t0, "a")
	w.add(t0.Add(10*time.Second), "a")
	w.add(t0.Add(20*time.Second), "b")
	w.add(t0.Add(25*time.Second), "c") // a third key in the same minute
	w.add(t0.Add(30*time.Minute), "c")
	if got := w.totals(t0.Add(31 * time.Minute)); got["a"] != 2 || got["b"] != 1 || got["c"] != 1 || got[otherKey] != 1 {
		t.Errorf("totals after 31m = %v", got)
	}
	// An hour and a minute later, the first minute has left the window.
	got := w.totals(t0.Add(61 * time.Minute))
	if got["a"] != 0 || got["b"] != 0 || got["c"] != 1 || got[otherKey] != 0 {
		t.Errorf("totals after 61m = %v, want only the later c", got)
	}
	if len(w.minutes) != 1 {
		t.Errorf("%d minutes kept, want 1", len(w.minutes))
	}
}
