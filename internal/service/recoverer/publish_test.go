package recoverer

import (
	"testing"
	"time"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/pkg/events"
)

// A command planned longer ago than the duplicate window remembers, and
// missing from the ledger, is looked for in its stream first: found, it is
// not published again (the window could not drop it), also when the
// planning replica's clock ran ahead of the server's; not found, it is.
func TestPublisherLooksForALateCommandInTheStream(t *testing.T) {
	bus := bustest.Start(t, time.Minute)
	var published []string
	p := &publisher{js: bus.JS, timeout: 10 * time.Second, sent: func(m events.Message, dup bool) {
		published = append(published, m.(*events.Control).Subagent)
	}}
	kill := func(sub string) *events.Control {
		return &events.Control{At: events.At(time.Now()), Agent: "a", Action: events.ControlKill, Subagent: sub}
	}
	before := time.Now().Add(-time.Minute)
	if err := p.Publish(bus.Ctx, "kill-1", events.ControlSubject("a"), kill("one"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	// Published before a "crash" whose restart comes after the window:
	// found in the stream, not sent again.
	if err := p.Publish(bus.Ctx, "kill-1", events.ControlSubject("a"), kill("one"), before); err != nil {
		t.Fatal(err)
	}
	// Never published: sent.
	if err := p.Publish(bus.Ctx, "kill-2", events.ControlSubject("a"), kill("two"), before); err != nil {
		t.Fatal(err)
	}
	// Planned on a replica whose clock runs 30 s ahead of the server's:
	// still found.
	if err := p.Publish(bus.Ctx, "kill-1", events.ControlSubject("a"), kill("one"), time.Now().Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if len(published) != 2 || published[0] != "one" || published[1] != "two" {
		t.Fatalf("published %v, want one then two, each once", published)
	}
}
