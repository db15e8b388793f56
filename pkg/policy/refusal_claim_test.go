package policy

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

func TestRefusalRecordProbe(t *testing.T) {
	cfg := DefaultRefusalConfig()
	at := events.At(refusalT0)
	due := refusalT0.Add(15 * time.Minute)
	lease := time.Minute
	once := RefusalState{Segment: "s#1", Provider: "p", Refusals: 1, RefusedAt: at}
	tests := []struct {
		name      string
		rec       RefusalRecord
		now       time.Time
		agent     string
		want      RefusalProbe
		wantClaim RefusalClaim
	}{
		{"never refused: free, nothing to write", RefusalRecord{}, due, "a", ProbeFree, RefusalClaim{}},
		{"re-render phase: free", RefusalRecord{State: RefusalState{Increment: "1.0", Rerenders: 1}}, due, "a", ProbeFree, RefusalClaim{}},
		{"before the next probe: skip", RefusalRecord{State: once}, due.Add(-1), "a", ProbeSkip, RefusalClaim{}},
		{"re-probe due: claimed for the asker", RefusalRecord{State: once}, due, "a", ProbeClaimed, RefusalClaim{"a", due.Add(lease)}},
		{"due, another agent's claim running: held", RefusalRecord{State: once, Claim: RefusalClaim{"b", due.Add(time.Second)}}, due, "a", ProbeHeld, RefusalClaim{"b", due.Add(time.Second)}},
		{"due, own claim running: free, no new lease", RefusalRecord{State: once, Claim: RefusalClaim{"a", due.Add(time.Second)}}, due, "a", ProbeFree, RefusalClaim{"a", due.Add(time.Second)}},
		{"due, another agent's claim ran out: claimed", RefusalRecord{State: once, Claim: RefusalClaim{"b", due}}, due, "a", ProbeClaimed, RefusalClaim{"a", due.Add(lease)}},
		{"frozen: skip even with no claim", RefusalRecord{State: RefusalState{Refusals: 4, RefusedAt: at}}, refusalT0.Add(1000 * time.Hour), "a", ProbeSkip, RefusalClaim{}},
		{"legacy: skip", RefusalRecord{State: RefusalState{Legacy: true}}, refusalT0.Add(1000 * time.Hour), "a", ProbeSkip, RefusalClaim{}},
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
	cfg := RefusalConfig{ReprobeDelays: []time.Duration{time.Minute, 2 * time.Minute}, MaxRerenders: 2, StateTTL: time.Hour}
	st := RefusalState{Segment: "s#1", Provider: "p", Refusals: 1, RefusedAt: events.At(refusalT0)}
	due := refusalT0.Add(time.Minute)

	held := RefusalRecord{State: st, Claim: RefusalClaim{"agent-b", due.Add(30 * time.Second)}}.Skip(due, cfg, "p")
	if held.NextProbeAt == nil || !held.NextProbeAt.Equal(due.Add(30*time.Second)) || held.Frozen {
		t.Errorf("held claim: %+v; want next_probe_at at the end of the lease", held)
	}
	for _, want := range []string{"agent-b", "re-probe 1 of 2", RefusalRule(cfg)} {
		if !strings.Contains(held.Reason, want) {
			t.Errorf("held reason %q lacks %q", held.Reason, want)
		}
	}

	waiting := RefusalRecord{State: st}.Skip(due.Add(-time.Second), cfg, "p")
	want := RouteProviders(due.Add(-time.Second), cfg, []string{"p"}, func(string) (RefusalState, bool) { return st, true }).Skipped[0]
	if !reflect.DeepEqual(waiting, want) {
		t.Errorf("waiting skip = %+v; want RouteProviders' %+v", waiting, want)
	}
}

func TestRefusalRecordRefusedEndsOnlyTheReportersClaim(t *testing.T) {
	cfg := DefaultRefusalConfig()
	due := refusalT0.Add(15 * time.Minute)
	rec := RefusalRecord{
		State: RefusalState{Segment: "s#1", Provider: "p", Refusals: 1, RefusedAt: events.At(refusalT0)},
		Claim: RefusalClaim{"a", due.Add(time.Minute)},
	}
	other, ev := rec.Refused("b", RefusalScopeHistory, "2.0", due, cfg)
	if other.Claim != rec.Claim || ev.Refusals != 2 || other.State.Agent != "b" {
		t.Errorf("another agent's refusal: claim %+v, refusals %d; want the claim kept and 2 refusals", other.Claim, ev.Refusals)
	}
	own, ev := rec.Refused("a", RefusalScopeHistory, "2.0", due, cfg)
	if own.Claim != (RefusalClaim{}) || ev.Refusals != 2 || ev.Action != events.ActionSkipProvider {
		t.Errorf("the claimant's refusal: claim %+v, event %+v; want the claim ended", own.Claim, ev)
	}
}

func TestRefusalRecordRemembersBoundedApplications(t *testing.T) {
	cfg := DefaultRefusalConfig()
	var rec RefusalRecord
	for i := range RefusalAppliedMax + 3 {
		var ev RefusalEvent
		rec, ev = rec.Refused("a", RefusalScopeHistory, "1.0", refusalT0.Add(time.Duration(i)*time.Hour), cfg)
		rec = rec.Remember(fmt.Sprintf("o-%d", i), ev, []string{"p"})
	}
	if len(rec.Applied) != RefusalAppliedMax {
		t.Fatalf("remembers %d applications, want %d", len(rec.Applied), RefusalAppliedMax)
	}
	if _, ok := rec.AppliedRefusal("o-0"); ok {
		t.Error("the oldest application is still remembered")
	}
	a, ok := rec.AppliedRefusal(fmt.Sprintf("o-%d", RefusalAppliedMax+2))
	if !ok || a.Event.Refusals != RefusalAppliedMax+3 || !reflect.DeepEqual(a.Peers, []string{"p"}) {
		t.Errorf("latest application = %+v, %v", a, ok)
	}
	if _, ok := rec.AppliedRefusal(""); ok {
		t.Error("an empty outcome id matched")
	}
}

func TestRefusalRecordCodec(t *testing.T) {
	cfg := DefaultRefusalConfig()
	var rec RefusalRecord
	rec.State = RefusalState{Segment: "s#1", Provider: "p"}
	rec, ev := rec.Refused("a", RefusalScopeHistory, "3.1", refusalT0, cfg)
	rec = rec.Remember("o-1", ev, []string{"p", "q"})
	rec.Claim = RefusalClaim{Agent: "b", Until: refusalT0.Add(20 * time.Minute)}

	data, err := EncodeRefusalRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRefusalRecord(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, rec)
	}
	// A reader that knows only the state reads the same state.
	st, err := DecodeRefusalState(data)
	if err != nil || !reflect.DeepEqual(st, rec.State) {
		t.Errorf("DecodeRefusalState of a record = %+v, %v; want %+v", st, err, rec.State)
	}

	tests := []struct {
		name    string
		data    string
		want    RefusalRecord
		wantErr bool
	}{
		{"state only (EncodeRefusalState): no claim, nothing applied", string(mustState(t, rec.State)), RefusalRecord{State: rec.State}, false},
		{"operator JSON with a claim", `{"segment":"s#1","provider":"p","refusals":1,"refused_at":"2025-10-07T09:00:00Z","probe_agent":"x","probe_until":1759828500000}`,
			RefusalRecord{State: RefusalState{Segment: "s#1", Provider: "p", Refusals: 1, RefusedAt: events.At(refusalT0)}, Claim: RefusalClaim{"x", refusalT0.Add(15 * time.Minute)}}, false},
		{"operator JSON without a count: legacy", `{"segment":"s#1","provider":"p"}`, RefusalRecord{State: RefusalState{Segment: "s#1", Provider: "p", Legacy: true}}, false},
		{"garbage: legacy with an error", "\xc1", RefusalRecord{State: RefusalState{Legacy: true}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeRefusalRecord([]byte(tt.data))
			if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecodeRefusalRecord = %+v, %v; want %+v (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func mustState(t *testing.T, s RefusalState) []byte {
	t.Helper()
	b, err := EncodeRefusalState(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The bus service's decision is the book's decision for the same refusal.
func TestRefusalDecisionMatchesTheBook(t *testing.T) {
	cfg := DefaultRefusalConfig()
	book := NewRefusalBook(cfg)
	c := events.Classification{
		OutcomeID: "o-1", Agent: "a", Provider: "p", Model: "m", Profile: "k",
		Class: events.ClassContentRefusal, Session: "s", Segment: 1, Turn: 3, RefusalScope: RefusalScopeHistory,
	}
	want, notes := book.OnClassified(c, refusalT0)

	rec := RefusalRecord{State: RefusalState{Segment: "s#1", Provider: "p"}}
	_, ev := rec.Refused(c.Agent, c.RefusalScope, RefusalIncrement(c.Turn, c.Step), refusalT0, cfg)
	t0 := RefusalNotice(cfg, ev, RefusalPeers(cfg, ev, nil))
	got := RefusalDecision(c, ev, t0, refusalT0)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("RefusalDecision = %+v\nbook gives %+v", got, want)
	}
	if n := t0.Notification(ev, refusalT0); len(notes) != 1 || !reflect.DeepEqual(n, notes[0]) {
		t.Errorf("notification = %+v\nbook gives %+v", n, notes)
	}
}
