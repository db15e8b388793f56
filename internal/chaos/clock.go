package chaos

import (
	"sort"
	"sync"
	"time"
)

// Clock is the server's time: when a request arrived (so which windows are
// open) and how long a delay, a stall or a refused window lasts. The
// default is the machine's clock; a test gives a ManualClock and moves it.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// After sends the time once d has passed on this clock (at once for
	// d <= 0), like time.After.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// ManualClock is a Clock that moves only when told: a test opens a window
// by advancing past its start, with no sleep. Safe for concurrent use.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

// NewManualClock returns a clock standing at start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now implements Clock.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After implements Clock: the channel fires when Advance reaches now+d.
func (c *ManualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{at: c.now.Add(d), ch: ch})
	return ch
}

// Advance moves the clock on by d and fires every After that fell due, in
// time order.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	sort.SliceStable(c.waiters, func(i, j int) bool { return c.waiters[i].at.Before(c.waiters[j].at) })
	n := 0
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			break
		}
		w.ch <- c.now
		n++
	}
	c.waiters = c.waiters[n:]
}

// Waiting is how many After channels have not fired yet: a test waits for
// the server to be waiting (on a delay, say) before it advances.
func (c *ManualClock) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}
