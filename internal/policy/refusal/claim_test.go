package refusal

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

func TestRefusalRecordProbe(t *testing.T) {
	cfg := DefaultConfig()
	at := events.At(refusalT0)
	due := refusalT0.Add(15 * time.Minute)
	lease := time.Minute
	once := State{Segment: "s#1", Provider: "p", Refusals: 1, RefusedAt: at}
	tests := []struct {
		name      string
		rec       Record
		now       time.Time
		agent     string
		want      ProbeVerdict
		wantClaim Claim
	}{
		{"never refused: free, nothing to write", Record{}, due, "a", ProbeFree, Claim{}},
		{"re-render phase: free", Record{State: State{Increment: "1.0", Rerenders: 1}}, due, "a", ProbeFree, Claim{}},
		{"before the next probe: skip", Record{State: once}, due.Add(-1), "a", ProbeSkip, Claim{}},
		{"re-probe due: claimed for the asker", Record{State: once}, due, "a", ProbeClaimed, Claim{"a", due.Add(lease)}},
		{"due, another agent's claim running: held", Record{State: once, Claim: Claim{"b", due.Add(time.Second)}}, due, "a", ProbeHeld, Claim{"b", due.Add(time.Second)}},
		{"due, own claim running: free, no new lease", Record{State: once, Claim: Claim{"a", due.Add(time.Second)}}, due, "a", ProbeFree, Claim{"a", due.Add(time.Second)}},
		{"due, another agent's claim ran out: claimed", Record{State: once, Claim: Claim{"b", due}}, due, "a", ProbeClaimed, Claim{"a", due.Add(lease)}},
		{"frozen: skip even with no claim", Record{State: State{Refusals: 4, RefusedAt: at}}, refusalT0.Add(1000 * time.Hour), "a", ProbeSkip, Claim{}},
		{"legacy: skip", Record{State: State{Legacy: true}}, refusalT0.Add(1000 * time.Hour), "a", ProbeSkip, Claim{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next, got := tt.rec.Probe(tt.now, cfg, tt.agent, lease)
			if got != tt.want || next.Claim != tt.wantClaim {
				t.Fatalf("Probe = %s, claim %+v; want %s, claim %+v", got, next.Claim, tt.want, tt.wantClaim)
			}
			if !reflect.DeepEqual(next.State, tt.rec.State) {
				t.Errorf("Probe moved the state: %+v -> %+v", tt.rec.State, next.State)
			}
		})
	}
}

func TestRefusalRecordSkipWords(t *testing.T) {
	cfg := Config{ReprobeDelays: []time.Duration{time.Minute, 2 * time.Minute}, MaxRerenders: 2, StateTTL: time.Hour}
	st := State{Segment: "s#1", Provider: "p", Refusals: 1, RefusedAt: events.At(refusalT0)}
	due := refusalT0.Add(time.Minute)

	held := Record{State: st, Claim: Claim{"agent-b", due.Add(30 * time.Second)}}.Skip(due, cfg, "p")
	if held.NextProbeAt == nil || !held.NextProbeAt.Equal(due.Add(30*time.Second)) || held.Frozen {
		t.Errorf("held claim: %+v; want next_probe_at at the end of the lease", held)
	}
	for _, want := range []string{"agent-b", "re-probe 1 of 2", Rule(cfg)} {
		if !strings.Contains(held.Reason, want) {
			t.Errorf("held reason %q lacks %q", held.Reason, want)
		}
	}

	waiting := Record{State: st}.Skip(due.Add(-time.Second), cfg, "p")
	want := RouteProviders(due.Add(-time.Second), cfg, []string{"p"}, func(string) (State, bool) { return st, true }).Skipped[0]
	if !reflect.DeepEqual(waiting, want) {
		t.Errorf("waiting skip = %+v; want RouteProviders' %+v", waiting, want)
	}
}

func TestRefusalRecordRefusedEndsOnlyTheReportersClaim(t *testing.T) {
	cfg := DefaultConfig()
	due := refusalT0.Add(15 * time.Minute)
	rec := Record{
		State: State{Segment: "s#1", Provider: "p", Refusals: 1, RefusedAt: events.At(refusalT0)},
		Claim: Claim{"a", due.Add(time.Minute)},
	}
	other, ev := rec.Refused("b", ScopeHistory, "2.0", due, cfg)
	if other.Claim != rec.Claim || ev.Refusals != 2 || other.State.Agent != "b" {
		t.Errorf("another agent's refusal: claim %+v, refusals %d; want the claim kept and 2 refusals", other.Claim, ev.Refusals)
	}
	own, ev := rec.Refused("a", ScopeHistory, "2.0", due, cfg)
	if own.Claim != (Claim{}) || ev.Refusals != 2 || ev.Action != events.ActionSkipProvider {
		t.Errorf("the claimant's refusal: claim %+v, event %+v; want the claim ended", own.Claim, ev)
	}
}

func TestRefusalRecordRemembersBoundedApplications(t *testing.T) {
	cfg := DefaultConfig()
	var rec Record
	for i := range AppliedMax + 3 {
		var ev Event
		rec, ev = rec.Refused("a", ScopeHistory, "1.0", refusalT0.Add(time.Duration(i)*time.Hour), cfg)
		rec = rec.Remember(fmt.Sprintf("o-%d", i), ev, []string{"p"})
	}
	if len(rec.Applied) != AppliedMax {
		t.Fatalf("remembers %d applications, want %d", len(rec.Applied), AppliedMax)
	}
	if _, ok := rec.AppliedRefusal("o-0"); ok {
		t.Error("the oldest application is still remembered")
	}
	a, ok := rec.AppliedRefusal(fmt.Sprintf("o-%d", AppliedMax+2))
	if !ok || a.Event.Refusals != AppliedMax+3 || !reflect.DeepEqual(a.Peers, []string{"p"}) {
		t.Errorf("latest application = %+v, %v", a, ok)
	}
	if _, ok := rec.AppliedRefusal(""); ok {
		t.Error("an empty outcome id matched")
	}
}
