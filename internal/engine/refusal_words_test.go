package engine_test

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/pkg/events"
)

// refusalWords runs one segment's whole refusal life on cfg and collects
// every text failbus produces on the way, as emitted: decision reasons,
// route reasons and notification titles and texts. It also checks that each
// "Next probe at" the words announce is the time the code then allows.
func refusalWords(t *testing.T, cfg refusal.Config) map[string]string {
	t.Helper()
	b := newBook(t, cfg)
	words := map[string]string{}
	c := events.Classification{OutcomeID: "o", Agent: "agent-1", Provider: "p", Class: events.ClassContentRefusal,
		Session: "s", Segment: 0, Turn: 1, RefusalScope: refusal.ScopeIncrement}
	now := refusalT0

	d, _ := b.OnClassified(c, now)
	if d.Action != events.ActionRerender {
		t.Fatalf("want rerender, got %+v", d)
	}
	words["rerender reason"] = d.Reason

	c.RefusalScope = refusal.ScopeHistory
	c.OutcomeID = "o-history" // each report is its own outcome
	d, ns := b.OnClassified(c, now)
	if len(ns) != 1 {
		t.Fatalf("first refusal notifications: %+v", ns)
	}
	words["first refusal reason"] = d.Reason
	words["first refusal title"] = ns[0].Title
	words["first refusal text"] = ns[0].Text
	checkAnnouncedProbe(t, cfg, b, d.Reason, d.DueAt)

	r := b.Route(now.Add(time.Second), "agent-1", "s", 0, []string{"p"})
	if len(r.Skipped) != 1 {
		t.Fatalf("route after the first refusal: %+v", r)
	}
	words["route reason, waiting"] = r.Skipped[0].Reason
	checkAnnouncedProbe(t, cfg, b, r.Skipped[0].Reason, *r.Skipped[0].NextProbeAt)

	for i := 0; i < cfg.MaxReprobes(); i++ {
		now = d.DueAt.Time
		c.OutcomeID = fmt.Sprintf("o-probe-%d", i)
		d, ns = b.OnClassified(c, now)
		if i < cfg.MaxReprobes()-1 {
			checkAnnouncedProbe(t, cfg, b, d.Reason, d.DueAt)
			words["re-probe reason"] = d.Reason
		}
	}
	if len(ns) != 1 || ns[0].Severity != events.SeverityCritical {
		t.Fatalf("freeze notifications: %+v", ns)
	}
	words["frozen reason"] = d.Reason
	words["frozen title"] = ns[0].Title
	words["frozen text"] = ns[0].Text
	r = b.Route(now.Add(20*time.Hour), "agent-1", "s", 0, []string{"p"})
	if len(r.Skipped) != 1 || !r.Skipped[0].Frozen {
		t.Fatalf("route after freezing: %+v", r)
	}
	words["route reason, frozen"] = r.Skipped[0].Reason

	legacy := refusal.RouteProviders(now, cfg, []string{"p"}, func(string) (refusal.State, bool) {
		return refusal.State{Segment: "s#0", Provider: "p", Legacy: true}, true
	})
	words["route reason, legacy"] = legacy.Skipped[0].Reason
	words["rule"] = refusal.Rule(cfg)
	return words
}

var nextProbeRE = regexp.MustCompile(`Next probe at (\S+) \(\+(\S+) after the latest refusal`)

// checkAnnouncedProbe: the time and delay the words announce are the ones
// the code runs — one instant before it the provider is skipped, at it the
// provider is allowed.
func checkAnnouncedProbe(t *testing.T, cfg refusal.Config, b *book, reason string, due events.Time) {
	t.Helper()
	m := nextProbeRE.FindStringSubmatch(reason)
	if m == nil {
		t.Fatalf("reason announces no next probe: %q", reason)
	}
	at, err := time.Parse(time.RFC3339Nano, m[1])
	if err != nil || !at.Equal(due.Time) {
		t.Fatalf("reason announces %q, the decision says %v", m[1], due)
	}
	if r := b.Route(at.Add(-time.Millisecond), "x", "s", 0, []string{"p"}); len(r.Allowed) != 0 {
		t.Fatalf("allowed before the announced probe %v", at)
	}
	if r := b.Route(at, "x", "s", 0, []string{"p"}); len(r.Allowed) != 1 {
		t.Fatalf("not allowed at the announced probe %v: %+v", at, r)
	}
	st, _ := b.State(at, "s", 0, "p")
	if d := "+" + durWords(cfg.ReprobeDelays[st.Reprobes()]); "+"+m[2] != d || !st.RefusedAt.Add(cfg.ReprobeDelays[st.Reprobes()]).Equal(at) {
		t.Fatalf("reason announces +%s, the rule runs %s from %v", m[2], d, st.RefusedAt)
	}
}

// TestRefusalWordsFollowThePolicy changes the delays (and the re-render
// bound) in the policy and sees every text change with them: the human's
// text, the model's reason and the rule are one function of the same values.
func TestRefusalWordsFollowThePolicy(t *testing.T) {
	def := refusal.DefaultConfig()
	changed := refusal.Config{ReprobeDelays: []time.Duration{10 * time.Minute, 2*time.Hour + 30*time.Minute}, MaxRerenders: 3, StateTTL: 48 * time.Hour}
	if err := changed.Validate(); err != nil {
		t.Fatal(err)
	}
	before, after := refusalWords(t, def), refusalWords(t, changed)
	if len(before) != len(after) || len(before) < 12 {
		t.Fatalf("collected %d and %d texts", len(before), len(after))
	}
	const defRule = "skipped for this segment; bounded re-probes at +15m, +1h, +6h after the latest refusal; frozen after that until a boundary"
	if before["rule"] != defRule {
		t.Fatalf("default rule %q, want %q", before["rule"], defRule)
	}
	for name, b := range before {
		a := after[name]
		if a == b {
			t.Errorf("%s did not change with the policy: %q", name, a)
		}
		if name != "first refusal title" && name != "frozen title" {
			if !strings.Contains(b, defRule) {
				t.Errorf("%s does not state the rule the code runs: %q", name, b)
			}
			if !strings.Contains(a, "+10m, +2h30m") {
				t.Errorf("%s does not state the changed delays: %q", name, a)
			}
		}
		for _, stale := range []string{"+15m", "+6h", "15m", "4 times"} {
			if strings.Contains(a, stale) {
				t.Errorf("%s still says %q after the policy changed: %q", name, stale, a)
			}
		}
	}
	if !strings.Contains(after["rerender reason"], "re-render 1 of 3") {
		t.Errorf("rerender reason ignores max_rerenders: %q", after["rerender reason"])
	}
	if !strings.Contains(after["frozen title"], "refused 3 times") || !strings.Contains(after["frozen text"], "its 2 re-probes are used up") {
		t.Errorf("frozen words ignore the number of delays: %q / %q", after["frozen title"], after["frozen text"])
	}
}

// TestRefusalWordsNoReprobes: a policy without re-probes says so, and
// freezes at once.
func TestRefusalWordsNoReprobes(t *testing.T) {
	cfg := refusal.Config{StateTTL: time.Hour}
	b := newBook(t, cfg)
	d, ns := b.OnClassified(events.Classification{OutcomeID: "o", Agent: "a", Provider: "p", Class: events.ClassContentRefusal,
		Session: "s", RefusalScope: refusal.ScopeHistory}, refusalT0)
	if len(ns) != 1 || ns[0].Severity != events.SeverityCritical || ns[0].DedupeKey != "provider-refusal:s#0:0:p" {
		t.Fatalf("notifications %+v", ns)
	}
	for _, s := range []string{d.Reason, ns[0].Text} {
		if !strings.Contains(s, "no re-probes: frozen until a boundary") || !strings.Contains(s, "the policy allows no re-probes") {
			t.Fatalf("words: %q", s)
		}
	}
}

// TestRouteNeverMovesTheClock: asking again and again changes no state, so a
// busy thread cannot keep renewing its own cooldown.
func TestRouteNeverMovesTheClock(t *testing.T) {
	cfg := refusal.DefaultConfig()
	b := newBook(t, cfg)
	b.OnClassified(events.Classification{OutcomeID: "o", Agent: "a", Provider: "p", Class: events.ClassContentRefusal,
		Session: "s", RefusalScope: refusal.ScopeHistory}, refusalT0)
	before := b.States(refusalT0)
	for m := 1; m < 15; m++ {
		r := b.Route(refusalT0.Add(time.Duration(m)*time.Minute), "a", "s", 0, []string{"p"})
		if len(r.Allowed) != 0 || !r.Skipped[0].NextProbeAt.Equal(refusalT0.Add(15*time.Minute)) {
			t.Fatalf("minute %d: %+v", m, r)
		}
	}
	if after := b.States(refusalT0); !reflect.DeepEqual(before, after) {
		t.Fatalf("route changed state: %+v -> %+v", before, after)
	}
	// An allowed probe that is not refused moves nothing either.
	for i := 0; i < 3; i++ {
		if r := b.Route(refusalT0.Add(15*time.Minute+time.Duration(i)*time.Hour), "a", "s", 0, []string{"p"}); len(r.Allowed) != 1 {
			t.Fatalf("probe %d not allowed: %+v", i, r)
		}
	}
	if after := b.States(refusalT0); !reflect.DeepEqual(before, after) {
		t.Fatalf("allowed probes changed state: %+v -> %+v", before, after)
	}
}

// The bus service's decision is the book's decision for the same refusal.
func TestRefusalDecisionMatchesTheBook(t *testing.T) {
	cfg := refusal.DefaultConfig()
	book := newBook(t, cfg)
	c := events.Classification{
		OutcomeID: "o-1", Agent: "a", Provider: "p", Model: "m", Profile: "k",
		Class: events.ClassContentRefusal, Session: "s", Segment: 1, Turn: 3, RefusalScope: refusal.ScopeHistory,
	}
	want, notes := book.OnClassified(c, refusalT0)

	rec := refusal.Record{State: refusal.State{Segment: "s#1", Provider: "p"}}
	_, ev := rec.Refused(c.Agent, c.RefusalScope, refusal.Increment(c.Turn, c.Step), refusalT0, cfg)
	t0 := refusal.Notice(cfg, ev, refusal.Peers(cfg, ev, nil))
	got := refusal.Decision(c, ev, t0, refusalT0)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Decision = %+v\nbook gives %+v", got, want)
	}
	if n := t0.Notification(ev, refusalT0); len(notes) != 1 || !reflect.DeepEqual(n, notes[0]) {
		t.Errorf("notification = %+v\nbook gives %+v", n, notes)
	}
}
