package chaos_test

import (
	"maps"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/chaos"
)

// logAt is a log of requests arriving at the given timeline seconds
// (fractions allowed), answered by the given windows.
func logAt(arrivals ...arrival) chaos.Log {
	var l chaos.Log
	for i, a := range arrivals {
		l = append(l, chaos.Request{Seq: i + 1, Offset: time.Duration(a.s * float64(time.Second)), Window: a.window})
	}
	return l
}

// arrival is a request at s seconds of the timeline, answered by window.
type arrival struct {
	s      float64
	window string
}

// The questions a drill asks of the log: calls per window, calls while a
// window was open, and the burst after it closed.
func TestLogQueries(t *testing.T) {
	t.Parallel()
	l := logAt(
		arrival{1, ""}, arrival{60, "outage"}, arrival{61, "outage"}, arrival{149.9, "outage"},
		arrival{150, ""}, arrival{150.1, ""}, arrival{150.5, ""}, arrival{150.99, ""}, arrival{151, ""},
		arrival{151.2, ""}, arrival{151.3, ""}, arrival{151.4, ""}, arrival{151.5, ""}, arrival{300, "storm"},
	)
	if got, want := l.PerWindow(), map[string]int{"": 10, "outage": 3, "storm": 1}; !maps.Equal(got, want) {
		t.Errorf("PerWindow %v; want %v", got, want)
	}
	if n := len(l.Between(60*time.Second, 150*time.Second)); n != 3 {
		t.Errorf("Between(60s, 150s) has %d; want 3 (the window is half-open)", n)
	}
	if n := len(l.Between(150*time.Second, 151*time.Second)); n != 4 {
		t.Errorf("the second after the outage has %d; want 4", n)
	}
	if n := len(l.Window("storm")); n != 1 {
		t.Errorf("Window(storm) has %d; want 1", n)
	}
	// The busiest second after the outage starts at 150.5s: 150.5,
	// 150.99, 151, 151.2, 151.3, 151.4 (151.5 is one second later).
	n, at := l.Peak(time.Second, 150*time.Second, time.Hour)
	if n != 6 || at != 150500*time.Millisecond {
		t.Errorf("Peak = %d at %v; want 6 at 150.5s", n, at)
	}
	if n, _ := chaos.Log(nil).Peak(time.Second, 0, time.Hour); n != 0 {
		t.Errorf("the peak of an empty log is %d", n)
	}
}
