package e2e

// The fault scope's differential test (network failures spread in
// time): scenarios of network failures a few seconds, a minute and a
// quarter of an hour apart, of several agents and sessions of one
// provider interleaved with another provider, run through `failbus
// simulate` and published to a bus running the classifier and the
// scheduler. Published in time order, each line handled before the next
// (as outcomes a minute apart reach a bus), the classifications, decisions
// and health records are identical record for record. Published out of
// time order, both follow the documented rule (docs/POLICY.md, scope):
// network failures count at their own times on the provider's own clock.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/servicespec"
	topology "github.com/failbus/failbus/jetstream"
)

// orderPolicy: the default scope (window 5m, 3 network failures), no
// jitter (the scheduler's randomness is not simulate's), no probes.
const orderPolicy = "retry:\n  jitter_ratio: 0\nrecovery:\n  probe_interval: 1h\n"

// orderLine is one outcome of a scenario: seconds after the scenario's
// start, and who reports what.
type orderLine struct {
	sec                      float64
	agent, session, provider string
	ok                       bool
}

func (l orderLine) json(id string, start time.Time) string {
	at := start.Add(time.Duration(l.sec * float64(time.Second))).Format(time.RFC3339Nano)
	body := `"transport_error":"read tcp: ECONNRESET"`
	if l.ok {
		body = `"ok":true,"status":200`
	}
	return fmt.Sprintf(`{"type":"outcome","id":%q,"at":%q,"agent":%q,"session":%q,"turn":1,"step":%d,"provider":%q,"profile":"k1",%s}`,
		id, at, l.agent, l.session, int(l.sec)+1, l.provider, body)
}

// failures are n network failures of one agent's session of anthropic,
// gap apart from second 0, after a success gap before the first.
func failures(n int, gap float64) []orderLine {
	out := []orderLine{{-gap, "bot-1", "s1", "anthropic", true}}
	for i := range n {
		out = append(out, orderLine{float64(i) * gap, "bot-1", "s1", "anthropic", false})
	}
	return out
}

func TestScopeSimulateAndBusAgreeOnFailuresSpreadInTime(t *testing.T) {
	t.Parallel()
	interleaved := []orderLine{{-60, "bot-1", "s1", "anthropic", true}}
	for i := range 4 { // three agents, one of them in two sessions, and openai every 30 s
		agent := []string{"bot-1", "bot-2", "bot-3", "bot-2"}[i]
		session := []string{"s1", "s2", "s3", "s4"}[i]
		interleaved = append(interleaved,
			orderLine{float64(i) * 60, agent, session, "anthropic", false},
			orderLine{float64(i)*60 + 30, agent, session, "openai", true})
	}
	// The report's shape: an hour of openai published before anthropic's
	// failures of the same hour, which are in time order among themselves.
	var byProvider []orderLine
	for m := range 4 {
		byProvider = append(byProvider, orderLine{float64(m) * 900, "bot", "", "openai", true})
	}
	for _, l := range failures(3, 60) {
		l.agent, l.session = "bot", ""
		byProvider = append(byProvider, l)
	}
	newestFirst := failures(4, 900)[1:]
	slices.Reverse(newestFirst)
	var fleet []orderLine // four agents, a minute apart
	for i, l := range failures(4, 60) {
		l.agent, l.session = fmt.Sprintf("bot-%d", i), fmt.Sprintf("s%d", i)
		fleet = append(fleet, l)
	}

	for _, tc := range []struct {
		name  string
		lines []orderLine
		// outage is when anthropic's outage begins (seconds), -1: none;
		// outageBy, when later, is the latest it may begin on the bus.
		outage, outageBy float64
		// backlog publishes every line at once, else one at a time, each
		// handled before the next.
		backlog bool
		// unordered: the bus handles the lines in an order of its own
		// (several agents at once, or published out of time order).
		unordered bool
	}{
		{"seconds apart", failures(4, 10), 20, 0, false, false},
		{"a minute apart", failures(4, 60), 120, 0, false, false},
		{"a quarter of an hour apart", failures(4, 900), -1, 0, false, false},
		{"a minute apart, several agents and sessions, another provider between", interleaved, 120, 0, false, false},
		{"a minute apart, after another provider's later outcomes", byProvider, 120, 0, false, false},
		// One agent's session, all at once: the classifier and the
		// scheduler keep a session's order.
		{"a minute apart, at once", failures(4, 60), 120, 0, true, false},
		{"seconds apart, at once", failures(6, 10), 20, 0, true, false},
		// Several agents at once: the bus observes them in an order of its
		// own. The outage is declared once three failures within the
		// window have arrived: at the third's time, or the fourth's.
		{"a minute apart, four agents at once", fleet, 120, 180, true, true},
		{"a quarter of an hour apart, newest first, at once", newestFirst, -1, 0, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Second)
			lines := make([]string, len(tc.lines))
			for i, l := range tc.lines {
				lines[i] = l.json(fmt.Sprintf("o%02d", i), start)
			}
			sim, dev := orderRun(t, lines, tc.backlog)

			// The rule: anthropic's outage where its failures' own times say.
			at := func(sec float64) string {
				return start.Add(time.Duration(sec) * time.Second).Format("2006-01-02T15:04:05.000Z")
			}
			for side, recs := range map[string]map[string][]string{"simulate": sim, "bus": dev} {
				var got []string
				for _, h := range recs["health"] {
					var m map[string]any
					if err := json.Unmarshal([]byte(h), &m); err != nil {
						t.Fatal(err)
					}
					got = append(got, fmt.Sprintf("%s %s", m["state"], m["at"]))
				}
				switch {
				case tc.outage < 0 && len(got) != 0:
					t.Errorf("%s: health %q, want none", side, got)
				case tc.outage >= 0 && side == "bus" && tc.outageBy > tc.outage:
					if len(got) != 1 || got[0] < "outage "+at(tc.outage) || got[0] > "outage "+at(tc.outageBy) {
						t.Errorf("%s: health %q, want one outage from %s to %s", side, got, at(tc.outage), at(tc.outageBy))
					}
				case tc.outage >= 0:
					if want := []string{"outage " + at(tc.outage)}; !slices.Equal(got, want) {
						t.Errorf("%s: health %q, want %q", side, got, want)
					}
				}
			}
			types := []string{"classification", "decision", "health"}
			if tc.unordered {
				// Simulate reads the lines in their order, the bus handles
				// them in its own: the rule holds on both sides (above),
				// and every outcome is classified and decided on both, but
				// a failure is decided by the state it finds (retry before
				// the outage, wait_provider after) at the clock it arrives
				// at. The classifications are identical.
				types = []string{"classification"}
				for _, side := range []map[string][]string{sim, dev} {
					side["decided"] = orderDecided(t, side["decision"])
				}
				types = append(types, "decided")
			}
			for _, typ := range types {
				s, d := slices.Sorted(slices.Values(sim[typ])), slices.Sorted(slices.Values(dev[typ]))
				if !slices.Equal(s, d) {
					t.Errorf("%s records differ:\n%s", typ, diffLinesReport(s, d))
				}
			}
			if n := len(sim["decision"]); n == 0 {
				t.Errorf("no decisions: the scenario decided nothing")
			}
		})
	}
}

// orderRun runs lines through `failbus simulate` and through a bus (the
// classifier and the scheduler) and returns each side's classification,
// decision and health records, canonical.
func orderRun(t *testing.T, lines []string, backlog bool) (sim, dev map[string][]string) {
	t.Helper()
	polFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(polFile, []byte(orderPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	input := strings.Join(lines, "\n") + "\n"
	sim = simulateRecords(t, polFile, input)

	bus := policyBus(t, "failbus-scope-order", polFile, servicespec.Classifier(), servicespec.Scheduler())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if backlog {
		publishInput(t, bus.Srv.ClientURL(), input)
		orderSettle(ctx, t, bus.JS)
	} else {
		for _, l := range lines {
			publishInput(t, bus.Srv.ClientURL(), l+"\n")
			orderSettle(ctx, t, bus.JS) // handled before the next line is published
		}
	}
	dev = busDecided(ctx, t, bus.JS)
	return sim, dev
}

// orderSettle waits until the classifier and the scheduler have
// acknowledged all of their streams.
func orderSettle(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	waitSettled(ctx, t, js, [][2]string{{topology.StreamOutcomes, topology.ConsumerClassifier}, {topology.StreamClassified, topology.ConsumerScheduler}}, nil)
}

// orderDecided lists the outcome ids the decisions answer.
func orderDecided(t *testing.T, recs []string) []string {
	t.Helper()
	ms := recordMaps(t, recs)
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i], _ = m["outcome_id"].(string)
	}
	return out
}
