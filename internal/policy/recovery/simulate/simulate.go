// Package simulate runs the recovery checklist (package recovery) the way
// `failbus simulate` does: on a virtual clock (Clock) that does what fell
// due in time order, nothing waiting for real time; the simulate input
// records read as the core's inputs (ParseRecord) and what the core sends
// written as output records (Output, Recorder, Collector). Sim puts them
// together over the in-memory store for the checklist's tests.
package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/memstore"
	"github.com/failbus/failbus/pkg/events"
)

// Output record types of `failbus simulate` (CONTRACT.md § "Recovery").
const (
	OutputDispatch     = "dispatch"
	OutputControl      = "control"
	OutputRecovery     = "recovery"
	OutputNotification = "notification"
)

// Output is one message the core sent, as the simulate engine writes it.
type Output struct {
	Type    string
	ID      string
	Subject string
	Msg     events.Message
}

// At is the time the message carries.
func (o Output) At() time.Time {
	switch m := o.Msg.(type) {
	case *events.Dispatch:
		return m.At.Time
	case *events.Control:
		return m.At.Time
	case *events.Recovery:
		return m.At.Time
	case *events.Notification:
		return m.At.Time
	}
	return time.Time{}
}

// MarshalJSON writes the message's own keys with "type" first.
func (o Output) MarshalJSON() ([]byte, error) {
	body, err := json.Marshal(o.Msg)
	if err != nil {
		return nil, fmt.Errorf("output %s: %w", o.Type, err)
	}
	typ, _ := json.Marshal(o.Type)
	out := append([]byte(`{"type":`), typ...)
	if len(body) > 2 {
		out = append(out, ',')
		out = append(out, body[1:]...)
		return out, nil
	}
	return append(out, '}'), nil
}

// Recorder is a recovery.Publisher that keeps what it is given, in order.
// Like a stream it keeps one message per id (Nats-Msg-Id), however often it
// is published: Attempts counts the publishes. It is safe for concurrent
// use.
type Recorder struct {
	mu       sync.Mutex
	out      []Output
	attempts int
	seen     map[string]bool
}

// Attempts counts every Publish call, duplicates included.
func (r *Recorder) Attempts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempts
}

// Take returns what was recorded since the last Take.
func (r *Recorder) Take() []Output {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.out
	r.out = nil
	return out
}

// Publish implements recovery.Publisher.
func (r *Recorder) Publish(_ context.Context, id, subject string, msg events.Message, _ time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts++
	if r.seen == nil {
		r.seen = map[string]bool{}
	}
	if r.seen[id] {
		return nil
	}
	r.seen[id] = true
	typ, err := outputType(msg)
	if err != nil {
		return err
	}
	r.out = append(r.out, Output{Type: typ, ID: id, Subject: subject, Msg: msg})
	return nil
}

// Collector is a recovery.Publisher for engines that run one recovery.Core
// for many callers (the decision engine's Step): each caller collects what
// it caused in the collection its context carries (Collect). Publishing
// with a context without one is an error.
type Collector struct{}

type collectionKey struct{}

// Collect returns a context whose publishes through a Collector are
// appended to *out.
func Collect(ctx context.Context, out *[]Output) context.Context {
	return context.WithValue(ctx, collectionKey{}, out)
}

// Publish implements recovery.Publisher.
func (Collector) Publish(ctx context.Context, id, subject string, msg events.Message, _ time.Time) error {
	out, ok := ctx.Value(collectionKey{}).(*[]Output)
	if !ok {
		return errors.New("recovery: publish without a collection (simulate.Collect)")
	}
	typ, err := outputType(msg)
	if err != nil {
		return err
	}
	*out = append(*out, Output{Type: typ, ID: id, Subject: subject, Msg: msg})
	return nil
}

func outputType(msg events.Message) (string, error) {
	switch msg.(type) {
	case *events.Dispatch:
		return OutputDispatch, nil
	case *events.Control:
		return OutputControl, nil
	case *events.Recovery:
		return OutputRecovery, nil
	case *events.Notification:
		return OutputNotification, nil
	}
	return "", fmt.Errorf("recovery: unexpected output %T", msg)
}

// Sim runs the core on a virtual clock over a memstore, the way `failbus
// simulate` does: before an input at time t is handled, everything that
// fell due by t (probes, checklist steps, releases) is done at its own due
// time, in time order; nothing waits for real time. It is not safe for
// concurrent use.
type Sim struct {
	Core  *recovery.Core
	Store *memstore.Store
	rec   *Recorder
	vc    *Clock
	clock time.Time
}

// New returns a Sim running cfg.
func New(cfg recovery.Config) (*Sim, error) {
	st, rec := memstore.New(), &Recorder{}
	return NewOn(cfg, st, rec, st, rec)
}

// NewOn returns a Sim whose core uses st and pub, which wrap mem and rec
// (tests wrap them to inject faults); the Sim reads mem and rec directly.
func NewOn(cfg recovery.Config, st recovery.Store, pub recovery.Publisher, mem *memstore.Store, rec *Recorder) (*Sim, error) {
	c, err := recovery.New(cfg, st, pub, recovery.Options{})
	if err != nil {
		return nil, err
	}
	return &Sim{Core: c, Store: mem, rec: rec, vc: &Clock{}}, nil
}

// Fork returns a Sim on another store and recorder (a copy of this one's
// store, wrapped) at this Sim's clock: a test runs what follows twice.
func (s *Sim) Fork(st recovery.Store, pub recovery.Publisher, mem *memstore.Store, rec *Recorder) (*Sim, error) {
	f, err := NewOn(s.Core.Config(), st, pub, mem, rec)
	if err != nil {
		return nil, err
	}
	f.clock, f.vc.advanced = s.clock, s.vc.advanced
	return f, nil
}

// Now is the virtual clock.
func (s *Sim) Now() time.Time { return s.clock }

// Step advances the clock to at (never backwards), does what fell due, folds
// in the input and does what that made due at once. It returns the outputs
// in order; an invalid input yields an error wrapping recovery.ErrInvalid
// and the outputs due before it.
func (s *Sim) Step(ctx context.Context, in recovery.Input, at time.Time) ([]Output, error) {
	if at.After(s.clock) {
		s.clock = at
	}
	if err := s.AdvanceTo(ctx, s.clock); err != nil {
		return s.take(), err
	}
	if err := s.Core.Step(ctx, in, s.clock); err != nil {
		return s.take(), err
	}
	err := s.AdvanceTo(ctx, s.clock)
	return s.take(), err
}

// Tick advances the clock to at and does what fell due.
func (s *Sim) Tick(ctx context.Context, at time.Time) ([]Output, error) {
	if at.After(s.clock) {
		s.clock = at
	}
	err := s.AdvanceTo(ctx, s.clock)
	return s.take(), err
}

func (s *Sim) take() []Output { return s.rec.Take() }

// AdvanceTo does, in time order, everything due at or before t.
func (s *Sim) AdvanceTo(ctx context.Context, t time.Time) error {
	return s.vc.AdvanceTo(ctx, s.Core, t)
}

// Clock drives a recovery.Core on a virtual clock, as `failbus simulate`
// does: AdvanceTo(c, t) calls c.Advance for each provider at each time
// something of it falls due (a probe, a step, the next release), in time
// order, up to t — so releases carry their drain-rate times and probes
// their interval, however coarse the input's times. Its clock never runs
// backwards. Not safe for concurrent use. The zero value starts at the zero
// time.
type Clock struct {
	advanced time.Time
}

// revisionPeeker is implemented by stores that can show a provider's
// record and revision without copying it (memstore.Store).
type revisionPeeker interface {
	PeekProvider(provider string) (*recovery.ProviderRecord, uint64, error)
}

func peek(ctx context.Context, c *recovery.Core, p string) (*recovery.ProviderRecord, uint64, error) {
	if pk, ok := c.Store().(revisionPeeker); ok {
		return pk.PeekProvider(p)
	}
	return c.Store().LoadProvider(ctx, p)
}

// AdvanceTo does, in time order, everything of c due at or before t.
func (v *Clock) AdvanceTo(ctx context.Context, c *recovery.Core, t time.Time) error {
	// stuck holds providers that were due but could not move (tasks without
	// a provider wait for every provider), until another one moves.
	stuck := map[string]bool{}
	for range 10_000_000 {
		p, due, rev, err := nextDue(ctx, c, t, stuck)
		if err != nil || due.IsZero() || due.After(t) {
			return err
		}
		if due.Before(v.advanced) {
			due = v.advanced
		}
		v.advanced = due
		if err := c.Advance(ctx, p, due); err != nil {
			return err
		}
		_, after, err := peek(ctx, c, p)
		if err != nil {
			return err
		}
		if after == rev {
			stuck[p] = true
			continue
		}
		clear(stuck)
	}
	return fmt.Errorf("recovery: advance to %s does not settle", t)
}

// nextDue is the provider with the earliest due time (ties by name),
// leaving out the stuck ones, and its record's revision.
func nextDue(ctx context.Context, c *recovery.Core, t time.Time, stuck map[string]bool) (string, time.Time, uint64, error) {
	names, err := c.Store().ListProviders(ctx)
	if err != nil {
		return "", time.Time{}, 0, err
	}
	var best string
	var bestAt time.Time
	var bestRev uint64
	for _, n := range names {
		if stuck[n] {
			continue
		}
		r, rev, err := peek(ctx, c, n)
		if err != nil {
			return "", time.Time{}, 0, err
		}
		if r == nil {
			continue
		}
		due := r.NextDue(t)
		if due.IsZero() {
			continue
		}
		if bestAt.IsZero() || due.Before(bestAt) {
			best, bestAt, bestRev = n, due, rev
		}
	}
	return best, bestAt, bestRev, nil
}
