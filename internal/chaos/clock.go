package chaos

import (
	"sort"
	"sync"
	"time"
)

// Clock is the server's time: when a request arrived (so which windows are
// open) and how long a delay, a stall or a refused window lasts. The
// default is the machine's clock; a test gives a ManualClock and moves it.
// Waits are until a time, not for a duration, so a wait set up a moment
// late (after a test moved the clock) still ends where it should.
type Clock interface {
	// Now is the current time.
	Now() time.Time
	// At sends the time once the clock reaches t (at once when it has).
	At(t time.Time) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                  { return time.Now() }
func (realClock) At(t time.Time) <-chan time.Time { return time.After(time.Until(t)) }

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

// At implements Clock: the channel fires when Advance reaches t.
func (c *ManualClock) At(t time.Time) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if !t.After(c.now) {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, waiter{at: t, ch: ch})
	return ch
}

// Advance moves the clock on by d and fires every At that fell due, in
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

// Waiting is how many At channels have not fired yet (abandoned ones
// included): a test waits for the server to be waiting (on a stall, say)
// before it advances.
func (c *ManualClock) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}
