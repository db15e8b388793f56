package classifier

import (
	"testing"

	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// TestSessionLaneOrdersASessionNotAnAgent: a session's outcomes of a
// provider share a lane (classified in order, whatever their steps);
// another session, provider or agent is another lane, so one busy agent's
// sessions are classified in parallel. A boundary or an outcome that does
// not decode has no lane.
func TestSessionLaneOrdersASessionNotAnAgent(t *testing.T) {
	msg := func(o events.Outcome) *consumer.Msg {
		t.Helper()
		if o.ID == "" {
			o.ID = "o1"
		}
		if o.Agent == "" {
			o.Agent = "bot"
		}
		if o.Provider == "" {
			o.Provider = "openai"
		}
		data, h, err := events.Encode(&o)
		if err != nil {
			t.Fatal(err)
		}
		return &consumer.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: h, Data: data}
	}
	step1 := events.Outcome{Session: "s", Turn: 1, Step: 1, Status: 503}
	same := map[string][2]events.Outcome{
		"two attempts of one step":         {step1, {ID: "o2", Session: "s", Turn: 1, Step: 1, Status: 429}},
		"a session's calls without a step": {{Session: "s", Status: 503}, {ID: "o2", Session: "s", OK: true, Status: 200}},
	}
	for name, p := range same {
		if a, b := sessionLane(msg(p[0])), sessionLane(msg(p[1])); a != b || a == "" {
			t.Errorf("%s: lanes %q and %q, want one", name, a, b)
		}
	}
	other := map[string]events.Outcome{
		"another session":  {Session: "t", Turn: 1, Step: 1, Status: 503},
		"another provider": {Provider: "anthropic", Session: "s", Turn: 1, Step: 1, Status: 503},
		"another agent":    {Agent: "bot-2", Session: "s", Turn: 1, Step: 1, Status: 503},
	}
	for name, o := range other {
		if a, b := sessionLane(msg(step1)), sessionLane(msg(o)); a == b {
			t.Errorf("%s shares the lane %q", name, a)
		}
	}
	for name, m := range map[string]*consumer.Msg{
		"a boundary":     {Subject: events.SegmentPrefix + ".bot", Data: []byte{0x80}},
		"not an outcome": {Subject: events.OutcomeSubject("openai", "bot"), Data: []byte("junk")},
	} {
		if k := sessionLane(m); k != "" {
			t.Errorf("%s has lane %q", name, k)
		}
	}
}
