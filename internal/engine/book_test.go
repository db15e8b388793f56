package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// refusalT0 is the virtual clock's origin in the refusal tests.
var refusalT0 = time.Date(2025, 10, 7, 9, 0, 0, 0, time.UTC)

// book drives the refusal stages of an engine on Memory with the calls an
// agent makes: ask the route, report a refusal, report a boundary.
type book struct {
	t   *testing.T
	eng *engine.Engine
	mem *engine.Memory
}

func newBook(t *testing.T, cfg refusal.Config) *book {
	t.Helper()
	p := policy.Default()
	p.Refusal = cfg
	mem := engine.NewMemory(cfg.StateTTL)
	eng, err := engine.New(engine.Config{Policy: p, Stores: mem.Stores(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return &book{t: t, eng: eng, mem: mem}
}

// Route asks which of providers may receive `<session>#<segment>` at now.
func (b *book) Route(now time.Time, agent, session string, segment int, providers []string) events.RouteResult {
	b.t.Helper()
	r, err := b.eng.Route(context.Background(), events.RouteRequest{Agent: agent, Session: session, Segment: segment, Providers: providers}, now, engine.RouteOptions{})
	if err != nil {
		b.t.Fatal(err)
	}
	return r.RouteResult
}

// OnClassified reports a classification: the decision and the notifications
// requested for a content refusal, nothing for any other class.
func (b *book) OnClassified(c events.Classification, now time.Time) (events.Decision, []events.Notification) {
	b.t.Helper()
	r, err := b.eng.Refuse(context.Background(), c, now)
	if err != nil {
		b.t.Fatal(err)
	}
	if r.Notification == nil {
		return r.Decision, nil
	}
	return r.Decision, []events.Notification{*r.Notification}
}

// OnBoundary reports a segment boundary at its time.
func (b *book) OnBoundary(bd events.Boundary) {
	b.t.Helper()
	if _, err := b.eng.Boundary(context.Background(), bd, bd.At.Time); err != nil {
		b.t.Fatal(err)
	}
}

// State is the live state of provider in `<session>#<segment>` at now.
func (b *book) State(now time.Time, session string, segment int, provider string) (refusal.State, bool) {
	return b.mem.RefusalState(events.SegmentKey(session, segment), provider, now)
}

// States are every live state at now.
func (b *book) States(now time.Time) []refusal.State { return b.mem.RefusalStates(now) }

// durWords writes a duration as the refusal words do ("15m", "1h30m").
func durWords(d time.Duration) string {
	s := d.String()
	if len(s) > 3 && s[len(s)-3:] == "m0s" {
		s = s[:len(s)-2]
	}
	if len(s) > 3 && s[len(s)-3:] == "h0m" {
		s = s[:len(s)-2]
	}
	return s
}
