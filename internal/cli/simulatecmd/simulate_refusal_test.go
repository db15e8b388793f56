package simulatecmd

// The refusal tiers' "4 sends however long the clock runs", through the command: a
// test agent drives `failbus simulate` line by line over pipes, as an agent
// program would. Each turn it asks `route`, sends to the first allowed
// provider, and reports the refusing provider's answer as a content_refusal
// outcome; ticks move the clock between turns. Over 100+ virtual hours the
// refusing provider receives the segment exactly four times (the first
// refusal, then +15m, +1h, +6h measured from the latest refusal), exactly
// two notifications are sent (reprobes 0 normal, 3 critical), and a boundary
// lets it try the new segment once more.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/refusal"
)

var simRefusalT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// simDriver is a running `failbus simulate` fed through a pipe; step writes
// lines followed by a sync and returns the output they caused.
type simDriver struct {
	t     *testing.T
	in    *io.PipeWriter
	lines chan string
	done  chan int
	syncs int
	// notes are every notification the command printed, in order.
	notes []map[string]any
}

func startSimDriver(t *testing.T) *simDriver {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	d := &simDriver{t: t, in: inW, lines: make(chan string, 64), done: make(chan int, 1)}
	go func() {
		code := run(nil, inR, outW, io.Discard)
		_ = outW.Close()
		d.done <- code
	}()
	go func() {
		sc := bufio.NewScanner(outR)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			d.lines <- sc.Text()
		}
		close(d.lines)
	}()
	t.Cleanup(func() { _ = inW.Close() })
	return d
}

// step writes the lines and a sync, and returns the records printed before
// the sync's answer.
func (d *simDriver) step(lines ...string) []map[string]any {
	d.t.Helper()
	d.syncs++
	id := fmt.Sprintf(`"s%d"`, d.syncs)
	if _, err := io.WriteString(d.in, strings.Join(lines, "\n")+"\n"+`{"type":"sync","id":`+id+"}\n"); err != nil {
		d.t.Fatal(err)
	}
	var out []map[string]any
	for {
		var l string
		var ok bool
		select {
		case l, ok = <-d.lines:
		case <-time.After(30 * time.Second):
			d.t.Fatal("no answer from simulate within 30s")
		}
		if !ok {
			d.t.Fatal("simulate closed its output early")
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			d.t.Fatalf("output line is not JSON: %q", l)
		}
		switch m["type"] {
		case "sync":
			if b, _ := json.Marshal(m["id"]); string(b) != id {
				d.t.Fatalf("sync %s answered out of order: %s", id, l)
			}
			return out
		case "error":
			d.t.Fatalf("error record for %q: %s", lines, l)
		case "notification":
			d.notes = append(d.notes, m)
		}
		out = append(out, m)
	}
}

func (d *simDriver) close() {
	d.t.Helper()
	_ = d.in.Close()
	select {
	case code := <-d.done:
		if code != 0 {
			d.t.Fatalf("simulate exited %d", code)
		}
	case <-time.After(30 * time.Second):
		d.t.Fatal("simulate did not exit at the end of its input")
	}
}

// simRefusalRun is one segment's life as seen through the command.
type simRefusalRun struct {
	d       *simDriver
	t       *testing.T
	session string
	segment int
	seq     int
	// sends per segment: when the refuser received it.
	sends map[int][]time.Time
	// frozenSeen is set once a route said the refuser is frozen.
	frozenSeen bool
	// held counts route answers that another agent's re-probe was in
	// flight.
	held int
}

const simRefuser = "strict"

// at writes t in the two shapes the contract accepts, alternating, so every
// refusal time on the way in is read from either.
func simRefusalAt(t time.Time, n int) string {
	if n%2 == 0 {
		return fmt.Sprintf("%d", t.UnixMilli())
	}
	return `"` + t.Format(time.RFC3339Nano) + `"`
}

func (r *simRefusalRun) routeLine(now time.Time, agent string) string {
	return fmt.Sprintf(`{"type":"route","at":%q,"agent":%q,"session":%q,"segment":%d,"providers":[%q,"spare"]}`,
		now.Format(time.RFC3339Nano), agent, r.session, r.segment, simRefuser)
}

// checkRoute checks one route record against CONTRACT.md and the refusal
// schedule, and reports whether the refuser is allowed first.
func (r *simRefusalRun) checkRoute(rec map[string]any, now time.Time, agent string, cfg refusal.Config) bool {
	r.t.Helper()
	var keys []string
	for k := range rec {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if got := strings.Join(keys, " "); got != "agent allowed at segment session skipped type" {
		r.t.Fatalf("route record keys %q: %v", got, rec)
	}
	if rec["type"] != "route" || rec["agent"] != agent || rec["session"] != r.session || rec["segment"] != float64(r.segment) ||
		rec["at"] != now.UTC().Format("2006-01-02T15:04:05.000Z07:00") {
		r.t.Fatalf("route identity %v", rec)
	}
	allowed, _ := rec["allowed"].([]any)
	skipped, _ := rec["skipped"].([]any)
	if allowed == nil || skipped == nil || len(allowed)+len(skipped) != 2 || !slices.Contains(allowed, any("spare")) {
		r.t.Fatalf("route %v: the spare must always be allowed and every provider answered", rec)
	}
	for _, s := range skipped {
		sk, _ := s.(map[string]any)
		if sk["provider"] != simRefuser || sk["reason"] == "" {
			r.t.Fatalf("skip %v", sk)
		}
		next, hasNext := sk["next_probe_at"].(string)
		frozen, _ := sk["frozen"].(bool)
		if hasNext == frozen {
			r.t.Fatalf("skip %v: want exactly one of next_probe_at and frozen: true", sk)
		}
		sends := r.sends[r.segment]
		if frozen {
			r.frozenSeen = true
			if len(sends) != 1+cfg.MaxReprobes() {
				r.t.Fatalf("frozen after %d sends: %v", len(sends), sk)
			}
			continue
		}
		// A waiting provider's next probe is the latest refusal plus the
		// delay of its tier, never later turns (skipped turns never move
		// the clock) — unless another agent's probe is in flight.
		if strings.Contains(sk["reason"].(string), "in flight") {
			r.held++
			if want := now.Add(refusal.DefaultProbeLease).UTC().Format("2006-01-02T15:04:05.000Z07:00"); next != want {
				r.t.Fatalf("held re-probe: next_probe_at %s, want the claim's end %s", next, want)
			}
			continue
		}
		want := sends[len(sends)-1].Add(cfg.ReprobeDelays[len(sends)-1]).UTC().Format("2006-01-02T15:04:05.000Z07:00")
		if next != want {
			r.t.Fatalf("next_probe_at %s, want %s (latest refusal + reprobe_delays[%d]): %v", next, want, len(sends)-1, sk)
		}
	}
	return len(allowed) == 2 && allowed[0] == simRefuser
}

// refuse reports the refuser's answer to a send at now and checks the
// decision.
func (r *simRefusalRun) refuse(now time.Time, agent string) {
	r.t.Helper()
	r.seq++
	r.sends[r.segment] = append(r.sends[r.segment], now)
	line := fmt.Sprintf(`{"type":"outcome","id":"o-%d","at":%s,"agent":%q,"provider":%q,"model":"m-1","session":%q,"segment":%d,"turn":%d,"step":1,"ok":true,"status":200,"stop_reason":"refusal","refusal_scope":"history"}`,
		r.seq, simRefusalAt(now, r.seq), agent, simRefuser, r.session, r.segment, r.seq)
	var decision map[string]any
	for _, rec := range r.d.step(line) {
		switch rec["type"] {
		case "classification":
			if rec["class"] != "content_refusal" {
				r.t.Fatalf("classification %v", rec)
			}
		case "decision":
			decision = rec
		}
	}
	if decision == nil || decision["action"] != "skip_provider" || decision["provider"] != simRefuser || decision["reason"] == "" {
		r.t.Fatalf("decision for a history refusal: %v", decision)
	}
}

// turn is one round at now: every agent asks route (all before any of them
// sends, when race is set), then each one the route allowed sends to the
// refuser and reports its refusal, and asks again to fall back.
func (r *simRefusalRun) turn(now time.Time, agents []string, race bool, cfg refusal.Config) {
	r.t.Helper()
	if race {
		lines := make([]string, len(agents))
		for i, a := range agents {
			lines[i] = r.routeLine(now, a)
		}
		recs := r.d.step(lines...)
		if len(recs) != len(agents) {
			r.t.Fatalf("%d records for %d route lines: %v", len(recs), len(agents), recs)
		}
		var senders []string
		for i, rec := range recs {
			if r.checkRoute(rec, now, agents[i], cfg) {
				senders = append(senders, agents[i])
			}
		}
		for _, a := range senders {
			r.refuse(now, a)
		}
		return
	}
	for _, a := range agents {
		for attempt := 0; ; attempt++ {
			recs := r.d.step(r.routeLine(now, a))
			if len(recs) != 1 {
				r.t.Fatalf("route: %v", recs)
			}
			if !r.checkRoute(recs[0], now, a, cfg) {
				break
			}
			if attempt > 0 {
				r.t.Fatalf("%s was allowed the refuser twice at %v", a, now)
			}
			r.refuse(now, a)
		}
	}
}

func TestSimulateRefusalFourSendsHoweverLongTheClockRuns(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		every  time.Duration
		agents []string
		race   bool
	}{
		{"one agent, a turn every 7 minutes", 7 * time.Minute, []string{"agent-1"}, false},
		{"two agents taking turns every 4 minutes", 4 * time.Minute, []string{"agent-1", "agent-2"}, false},
		{"two agents asking route at once every 5 minutes", 5 * time.Minute, []string{"agent-1", "agent-2"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := refusal.DefaultConfig()
			d := startSimDriver(t)
			r := &simRefusalRun{d: d, t: t, session: "sess-1", segment: 1, sends: map[int][]time.Time{}}
			tick := func(at time.Time) {
				if recs := d.step(fmt.Sprintf(`{"type":"tick","at":%q}`, at.Format(time.RFC3339Nano))); len(recs) != 0 {
					t.Fatalf("tick at %v printed %v", at, recs)
				}
			}

			// 108 hours of turns, with a tick between every two.
			end := simRefusalT0.Add(108 * time.Hour)
			var turns int
			var clock time.Time
			for now := simRefusalT0; !now.After(end); now = now.Add(tt.every) {
				// The first send is one agent's: two agents that both send
				// before any refusal is known both reach the provider, on
				// the bus too (nothing was known yet).
				r.turn(now, tt.agents, tt.race && turns > 0, cfg)
				clock = now.Add(tt.every / 2)
				tick(clock)
				turns++
			}

			sends := r.sends[1]
			if len(sends) != 1+cfg.MaxReprobes() {
				t.Fatalf("over %d turns (%v) the refuser received segment 1 %d times, want %d: %v",
					turns, end.Sub(simRefusalT0), len(sends), 1+cfg.MaxReprobes(), sends)
			}
			if !sends[0].Equal(simRefusalT0) {
				t.Fatalf("first send at %v, want %v", sends[0], simRefusalT0)
			}
			for i := 1; i < len(sends); i++ {
				// Each probe is the first turn at or after the latest
				// refusal plus its delay: measured from the latest refusal.
				gap, delay := sends[i].Sub(sends[i-1]), cfg.ReprobeDelays[i-1]
				if gap < delay || gap >= delay+tt.every {
					t.Fatalf("probe %d came %v after the latest refusal, want the first turn at or after +%v (sends %v)", i, gap, delay, sends)
				}
			}
			if !r.frozenSeen {
				t.Fatal("no route answer said the refuser is frozen")
			}
			if tt.race && r.held != cfg.MaxReprobes() {
				// Each due re-probe was asked for by both agents at once:
				// one claimed it, the other was told it is in flight.
				t.Fatalf("%d route answers with a re-probe in flight, want %d", r.held, cfg.MaxReprobes())
			}

			var keys []string
			for _, n := range d.notes {
				keys = append(keys, n["severity"].(string)+" "+n["dedupe_key"].(string))
			}
			want := []string{
				"normal " + refusal.DedupeKey("sess-1#1", 0, []string{simRefuser}),
				"critical " + refusal.DedupeKey("sess-1#1", cfg.MaxReprobes(), []string{simRefuser}),
			}
			if want[0] != "normal provider-refusal:sess-1#1:0:strict" || !slices.Equal(keys, want) {
				t.Fatalf("notifications %q, want exactly %q", keys, want)
			}

			// A tool-surface change starts segment 2: the refuser is tried
			// once more there, and refused again it waits its 15 minutes.
			now := clock.Add(time.Minute)
			if recs := d.step(fmt.Sprintf(`{"type":"boundary","at":%q,"agent":%q,"session":"sess-1","segment":2,"reason":"tool_surface"}`,
				now.Format(time.RFC3339Nano), tt.agents[0])); len(recs) != 0 {
				t.Fatalf("boundary printed %v", recs)
			}
			r.segment = 2
			for i := range 3 {
				r.turn(now.Add(time.Duration(i)*tt.every), tt.agents, tt.race && i > 0, cfg)
			}
			if n := len(r.sends[2]); n != 1 {
				t.Fatalf("after the boundary the refuser received segment 2 %d times in 3 turns, want 1", n)
			}
			if len(r.sends[1]) != 1+cfg.MaxReprobes() {
				t.Fatalf("segment 1 sends changed to %d", len(r.sends[1]))
			}
			if len(d.notes) != 3 || d.notes[2]["dedupe_key"] != "provider-refusal:sess-1#2:0:strict" {
				t.Fatalf("notifications after the boundary: %v", d.notes)
			}
			d.close()
		})
	}
}
