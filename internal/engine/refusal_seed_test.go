package engine_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/pkg/events"
)

// On the virtual clock: the refusal tiers run by the engine's
// stages (Route, Refuse, Boundary) on in-memory stores, as simulate runs
// them and as the refusal service runs them on KV.

// refusalSim drives a Book the way an agent does: each turn it asks
// Route, sends to the first allowed provider, and the refusing provider
// refuses every request that reaches it. A send is counted when Route lets
// the segment reach the refusing provider. No sleeps: time is a variable.
type refusalSim struct {
	t       *testing.T
	book    *book
	now     time.Time
	session string
	segment int
	turn    int
	refuser string
	scope   string
	sends   map[int][]time.Time // per segment: when the refuser received it
	notes   []events.Notification
	actions []string
	agents  []string // turns rotate over these agents
}

func newRefusalSim(t *testing.T, cfg refusal.Config) *refusalSim {
	return &refusalSim{
		t: t, book: newBook(t, cfg), now: refusalT0, session: "sess-1",
		refuser: "refuser", scope: refusal.ScopeHistory, sends: map[int][]time.Time{},
		agents: []string{"agent-1"},
	}
}

// turnAt runs one agent turn at now.
func (s *refusalSim) turnAt(now time.Time) {
	s.t.Helper()
	s.now = now
	s.turn++
	agent := s.agents[s.turn%len(s.agents)]
	providers := []string{s.refuser, "fallback"}
	for attempt := 0; ; attempt++ {
		r := s.book.Route(now, agent, s.session, s.segment, providers)
		if len(r.Allowed) == 0 || r.Allowed[len(r.Allowed)-1] != "fallback" {
			s.t.Fatalf("turn %d: the fallback must always be allowed: %+v", s.turn, r)
		}
		if r.Allowed[0] != s.refuser {
			return // the fallback takes the turn; nothing is refused
		}
		if attempt > 10 {
			s.t.Fatalf("turn %d: the refuser received the segment %d times in one turn", s.turn, attempt)
		}
		s.sends[s.segment] = append(s.sends[s.segment], now)
		d, ns := s.book.OnClassified(events.Classification{
			OutcomeID: fmt.Sprintf("o-%d-%d", s.turn, attempt), Agent: agent, Provider: s.refuser,
			Class: events.ClassContentRefusal, Scope: events.ScopeContent,
			Session: s.session, Segment: s.segment, Turn: s.turn, RefusalScope: s.scope,
		}, now)
		s.actions = append(s.actions, d.Action)
		s.notes = append(s.notes, ns...)
		if d.Reason == "" || d.Agent != agent || d.Provider != s.refuser || d.OutcomeID == "" {
			s.t.Fatalf("turn %d: incomplete decision %+v", s.turn, d)
		}
		if d.Action == events.ActionSkipProvider {
			// The agent falls back in the same turn: Route must now skip
			// the refuser (the loop asks again and takes the fallback).
			continue
		}
		if d.Action != events.ActionRerender {
			s.t.Fatalf("turn %d: action %q", s.turn, d.Action)
		}
		// rerender: the agent re-renders the increment and retries the
		// same provider in the same turn (the loop asks Route again).
	}
}

// run takes a turn every `every` from the current time until end.
func (s *refusalSim) run(every time.Duration, end time.Time) {
	s.t.Helper()
	for at := s.now.Add(every); !at.After(end); at = at.Add(every) {
		s.turnAt(at)
	}
}

func (s *refusalSim) boundaryAt(now time.Time, reason string) {
	s.now = now
	s.segment++
	s.book.OnBoundary(events.Boundary{At: events.At(now), Agent: s.agents[0], Session: s.session, Segment: s.segment, Reason: reason})
}

// expectedSends is the default re-probe schedule measured from the latest refusal, for
// turns at refusalT0 + k·every: each probe is the first turn at or after the
// previous send plus the next delay.
func expectedSends(cfg refusal.Config, first time.Time, every time.Duration) []time.Time {
	out := []time.Time{first}
	for _, d := range cfg.ReprobeDelays {
		due := out[len(out)-1].Add(d)
		k := (due.Sub(refusalT0) + every - 1) / every
		out = append(out, refusalT0.Add(k*every))
	}
	return out
}

// TestRefusalTiersOnTheVirtualClock: the refusal tiers' integration
// story on the virtual clock: turns every few minutes; the refusing provider receives the
// segment at the first refusal and at +15m, +1h, +6h measured from the latest
// refusal; another 100 hours of turns send it nothing; exactly two
// notifications (reprobes 0 and 3); a tool-surface change lets it try once
// more.
func TestRefusalTiersOnTheVirtualClock(t *testing.T) {
	for _, tt := range []struct {
		name   string
		every  time.Duration
		agents []string
	}{
		{"one agent, a turn every 7 minutes", 7 * time.Minute, []string{"agent-1"}},
		{"one agent, a turn every 5 minutes", 5 * time.Minute, []string{"agent-1"}},
		{"two agents alternating on one segment, a turn every 3 minutes", 3 * time.Minute, []string{"agent-1", "agent-2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := refusal.DefaultConfig()
			s := newRefusalSim(t, cfg)
			s.agents = tt.agents
			s.turnAt(refusalT0)
			s.run(tt.every, refusalT0.Add(8*time.Hour))

			want := expectedSends(cfg, refusalT0, tt.every)
			got := s.sends[0]
			if len(got) != 4 || len(want) != 4 {
				t.Fatalf("sends in the first 8h: %v, want %v", got, want)
			}
			for i := range want {
				if !got[i].Equal(want[i]) {
					t.Fatalf("send %d at +%v, want +%v (all: %v)", i, got[i].Sub(refusalT0), want[i].Sub(refusalT0), got)
				}
				if i > 0 && got[i].Sub(got[i-1]) < cfg.ReprobeDelays[i-1] {
					t.Fatalf("probe %d came %v after the latest refusal, before its delay %v", i, got[i].Sub(got[i-1]), cfg.ReprobeDelays[i-1])
				}
			}
			if tt.every == 7*time.Minute {
				// Spelled out once: 0, 21m (≥15m), 84m (≥21m+1h), 448m (≥84m+6h).
				for i, m := range []time.Duration{0, 21, 84, 448} {
					if got[i].Sub(refusalT0) != m*time.Minute {
						t.Fatalf("send %d at +%v, want +%vm", i, got[i].Sub(refusalT0), int(m))
					}
				}
			}

			// Skipped turns never moved the clock: the anchor is the last send.
			st, ok := s.book.State(s.now, s.session, 0, s.refuser)
			if !ok || st.Refusals != 4 || !st.RefusedAt.Equal(got[3]) || !st.Frozen(cfg) {
				t.Fatalf("state after the fourth refusal: %+v (found %v)", st, ok)
			}

			// Another 100 hours of turns: nothing more reaches the refuser.
			s.run(tt.every, s.now.Add(100*time.Hour))
			if n := len(s.sends[0]); n != 4 {
				t.Fatalf("after 100 more hours the refuser received the segment %d times, want 4", n)
			}

			if len(s.notes) != 2 {
				t.Fatalf("notifications: %+v, want exactly 2", s.notes)
			}
			wantKeys := []struct{ key, sev string }{
				{"provider-refusal:sess-1#0:0:refuser", events.SeverityNormal},
				{"provider-refusal:sess-1#0:3:refuser", events.SeverityCritical},
			}
			for i, w := range wantKeys {
				if n := s.notes[i]; n.DedupeKey != w.key || n.Severity != w.sev || n.Title == "" || n.Text == "" || !n.At.Equal(got[3*i]) {
					t.Fatalf("notification %d = %+v, want key %q severity %s at %v", i, n, w.key, w.sev, got[3*i])
				}
			}

			// A tool-surface change is a boundary: a new segment starts
			// fresh, the provider is tried once more, and the old state is
			// retired.
			s.boundaryAt(s.now.Add(time.Minute), "tool_surface")
			if _, ok := s.book.State(s.now, s.session, 0, s.refuser); ok {
				t.Fatal("the boundary left the old segment's state behind")
			}
			s.run(tt.every, s.now.Add(14*time.Minute))
			if n := len(s.sends[1]); n != 1 {
				t.Fatalf("after the boundary the refuser received the new segment %d times within 14m, want 1", n)
			}
			if len(s.notes) != 3 || s.notes[2].DedupeKey != "provider-refusal:sess-1#1:0:refuser" {
				t.Fatalf("the new segment's first refusal: notifications %+v", s.notes)
			}
			if n := len(s.sends[0]); n != 4 {
				t.Fatalf("old segment sends changed to %d", n)
			}
		})
	}
}

// TestRefusalIncrementPath: a refused increment is re-rendered at most twice
// (same turn, same provider), then the provider is skipped and the history
// path takes over with the same schedule and notifications.
func TestRefusalIncrementPath(t *testing.T) {
	cfg := refusal.DefaultConfig()
	s := newRefusalSim(t, cfg)
	s.scope = refusal.ScopeIncrement
	s.turnAt(refusalT0)
	if got := len(s.sends[0]); got != 1+cfg.MaxRerenders {
		t.Fatalf("first turn: %d sends, want the request plus %d re-renders", got, cfg.MaxRerenders)
	}
	wantActions := []string{events.ActionRerender, events.ActionRerender, events.ActionSkipProvider}
	if fmt.Sprint(s.actions) != fmt.Sprint(wantActions) {
		t.Fatalf("actions %v, want %v", s.actions, wantActions)
	}
	if len(s.notes) != 1 || s.notes[0].DedupeKey != "provider-refusal:sess-1#0:0:refuser" {
		t.Fatalf("notifications after skip_provider: %+v", s.notes)
	}
	// The refused content is now part of the segment: later refusals are
	// real whatever scope the agent reports, so the three re-probes follow.
	s.run(5*time.Minute, refusalT0.Add(100*time.Hour))
	if got, want := len(s.sends[0]), 1+cfg.MaxRerenders+cfg.MaxReprobes(); got != want {
		t.Fatalf("sends %d, want %d", got, want)
	}
	for i, a := range s.actions[3:] {
		if a != events.ActionSkipProvider {
			t.Fatalf("re-probe %d answered %q", i+1, a)
		}
	}
	if len(s.notes) != 2 || s.notes[1].DedupeKey != "provider-refusal:sess-1#0:3:refuser" || s.notes[1].Severity != events.SeverityCritical {
		t.Fatalf("notifications %+v", s.notes)
	}
}

func TestRefusalBookBoundaryRetiresEarlierSegmentsOfTheSession(t *testing.T) {
	cfg := refusal.DefaultConfig()
	b := newBook(t, cfg)
	refuse := func(session string, segment int, agent string) {
		b.OnClassified(events.Classification{OutcomeID: "o", Agent: agent, Provider: "p", Class: events.ClassContentRefusal,
			Session: session, Segment: segment, RefusalScope: refusal.ScopeHistory}, refusalT0)
	}
	refuse("s", 0, "a1")
	refuse("s", 1, "a2") // another agent on the same session
	refuse("s", 2, "a1")
	refuse("s", 3, "a1") // later than the boundary: a late boundary must not wipe it
	refuse("other", 0, "a1")
	b.OnBoundary(events.Boundary{At: events.At(refusalT0), Agent: "a1", Session: "s", Segment: 2, Reason: "compaction"})
	var left []string
	for _, st := range b.States(refusalT0) {
		left = append(left, st.Segment)
	}
	if want := "[other#0 s#2 s#3]"; fmt.Sprint(left) != want {
		t.Fatalf("states left %v, want %s", left, want)
	}
}

func TestRefusalBookIgnoresOtherClasses(t *testing.T) {
	b := newBook(t, refusal.DefaultConfig())
	d, ns := b.OnClassified(events.Classification{OutcomeID: "o", Class: events.ClassRateLimit, Provider: "p"}, refusalT0)
	if d.Action != "" || ns != nil || len(b.States(refusalT0)) != 0 {
		t.Fatalf("a rate limit touched refusal state: %+v %+v", d, ns)
	}
}

// TestRefusalBookTTL: the TTL backstop retires a segment nobody asks about,
// but a segment that is still routed keeps its frozen state however long
// the clock runs.
func TestRefusalBookTTL(t *testing.T) {
	cfg := refusal.DefaultConfig()
	cfg.StateTTL = 24 * time.Hour

	s := newRefusalSim(t, cfg)
	s.turnAt(refusalT0)
	s.run(10*time.Minute, refusalT0.Add(30*24*time.Hour))
	if n := len(s.sends[0]); n != 4 {
		t.Fatalf("a segment routed for 30 days with a 24h TTL sent %d times, want 4", n)
	}

	idle := newRefusalSim(t, cfg)
	idle.turnAt(refusalT0)
	if _, ok := idle.book.State(refusalT0.Add(24*time.Hour-1), idle.session, 0, idle.refuser); !ok {
		t.Fatal("state expired before its TTL")
	}
	if _, ok := idle.book.State(refusalT0.Add(24*time.Hour), idle.session, 0, idle.refuser); ok {
		t.Fatal("state outlived its TTL without being routed")
	}
}

func TestRefusalBookDecision(t *testing.T) {
	cfg := refusal.DefaultConfig()
	b := newBook(t, cfg)
	c := events.Classification{OutcomeID: "o-1", Agent: "a", Provider: "p", Model: "m", Profile: "k",
		Class: events.ClassContentRefusal, Session: "s", Segment: 2, Turn: 4, Step: 1, RefusalScope: refusal.ScopeIncrement}
	d, ns := b.OnClassified(c, refusalT0)
	if d.Action != events.ActionRerender || d.Retry != 1 || !d.DueAt.IsZero() || ns != nil ||
		d.Model != "m" || d.Profile != "k" || d.Class != events.ClassContentRefusal || !d.At.Equal(refusalT0) {
		t.Fatalf("first increment refusal: %+v %+v", d, ns)
	}
	c.RefusalScope, c.OutcomeID = refusal.ScopeHistory, "o-2"
	d, ns = b.OnClassified(c, refusalT0.Add(time.Second))
	if d.Action != events.ActionSkipProvider || !d.DueAt.Equal(refusalT0.Add(time.Second+15*time.Minute)) || len(ns) != 1 {
		t.Fatalf("history refusal: %+v %+v", d, ns)
	}
	if n := ns[0]; n.Labels["segment"] != "s#2" || n.Labels["provider"] != "p" || n.Labels["rule"] != refusal.RuleSkip || n.Labels["reprobes"] != "0" {
		t.Fatalf("labels %+v", n.Labels)
	}
}

// TestRefusalBookRouteClaimsADueReprobe: the book answers route as the bus's
// route service does (refusal.Record.Probe), so a recorded run with two
// agents asking for one due re-probe before its refusal comes back sends it
// once, not twice.
func TestRefusalBookRouteClaimsADueReprobe(t *testing.T) {
	cfg := refusal.DefaultConfig()
	b := newBook(t, cfg)
	refuse := func(agent string, at time.Time) {
		t.Helper()
		if d, _ := b.OnClassified(events.Classification{OutcomeID: agent + at.String(), Agent: agent, Provider: "p",
			Class: events.ClassContentRefusal, Session: "s", RefusalScope: refusal.ScopeHistory}, at); d.Action != events.ActionSkipProvider {
			t.Fatalf("decision %+v", d)
		}
	}
	allowed := func(agent string, at time.Time) (bool, events.RouteSkip) {
		t.Helper()
		r := b.Route(at, agent, "s", 0, []string{"p"})
		if len(r.Allowed)+len(r.Skipped) != 1 {
			t.Fatalf("route %+v", r)
		}
		if len(r.Skipped) == 1 {
			return false, r.Skipped[0]
		}
		return true, events.RouteSkip{}
	}
	refuse("a", refusalT0)
	due := refusalT0.Add(15 * time.Minute)

	tests := []struct {
		name  string
		agent string
		at    time.Time
		ok    bool
		next  time.Time // skipped: next_probe_at
		held  bool      // skipped because another agent's probe is in flight
	}{
		{"before the delay nobody", "b", due.Add(-time.Second), false, due, false},
		{"the first asker at the due time claims it", "a", due, true, time.Time{}, false},
		{"the other agent is held until the lease ends", "b", due, false, due.Add(refusal.DefaultProbeLease), true},
		{"the claimant may ask again", "a", due.Add(time.Minute), true, time.Time{}, false},
		{"the other is still held within the lease", "b", due.Add(refusal.DefaultProbeLease - time.Second), false, due.Add(refusal.DefaultProbeLease), true},
		{"a probe that was not refused frees it after the lease", "b", due.Add(refusal.DefaultProbeLease), true, time.Time{}, false},
		{"and now b holds it", "a", due.Add(refusal.DefaultProbeLease + time.Second), false, due.Add(2 * refusal.DefaultProbeLease), true},
	}
	for _, tt := range tests {
		ok, skip := allowed(tt.agent, tt.at)
		if ok != tt.ok {
			t.Fatalf("%s: allowed %v, want %v (%+v)", tt.name, ok, tt.ok, skip)
		}
		if ok {
			continue
		}
		if skip.Frozen || skip.NextProbeAt == nil || !skip.NextProbeAt.Equal(tt.next) || strings.Contains(skip.Reason, "in flight") != tt.held {
			t.Fatalf("%s: skip %+v, want next_probe_at %v, held %v", tt.name, skip, tt.next, tt.held)
		}
	}
	// b's probe is refused: the claim ends with it and the next tier is
	// measured from that refusal, for everyone.
	refused := due.Add(refusal.DefaultProbeLease + 2*time.Second)
	refuse("b", refused)
	for _, agent := range []string{"a", "b"} {
		if ok, skip := allowed(agent, refused.Add(time.Second)); ok || !skip.NextProbeAt.Equal(refused.Add(time.Hour)) || strings.Contains(skip.Reason, "in flight") {
			t.Fatalf("%s after b's refusal: allowed %v, %+v", agent, ok, skip)
		}
	}
	if st, _ := b.State(refused, "s", 0, "p"); st.Refusals != 2 || !st.RefusedAt.Equal(refused) {
		t.Fatalf("state %+v", st)
	}
}
