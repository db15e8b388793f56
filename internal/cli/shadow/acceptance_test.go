package shadow

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/engine/sim"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// busState is what must not change while shadow reads: every stream's
// messages and last sequence, and its consumers.
func busState(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]string {
	t.Helper()
	out := map[string]string{}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var consumers []string
		for c := range s.ConsumerNames(ctx).Name() {
			consumers = append(consumers, c)
		}
		slices.Sort(consumers)
		out[name] = fmt.Sprintf("msgs=%d last=%d consumers=%v", info.State.Msgs, info.State.LastSeq, consumers)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestShadowOfHistoryRecordedOnARealBus is the acceptance story: a bus
// running every service under max_retries 10 records agents' failures;
// shadowing that history with max_retries 1 lists each outcome the bus
// retried past the first retry, base retry and new give_up, the summary
// counts them, and the bus is unchanged afterwards (streams, consumers, no
// sink called). Shadowing with the base policy itself lists nothing, and
// the base run's decisions are the ones the bus recorded, jittered delays
// included; simulate, fed the same outcomes, decides those delays too.
func TestShadowOfHistoryRecordedOnARealBus(t *testing.T) {
	t.Parallel()
	var sinkCalls atomic.Int64
	sink := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { sinkCalls.Add(1) }))
	t.Cleanup(sink.Close)
	dir := t.TempDir()
	// A wide jitter: the base run's delays must be the bus's to the
	// millisecond, its draw included.
	baseYAML := fmt.Sprintf("retry:\n  max_retries: 10\n  jitter_ratio: 0.5\nnotify:\n  sinks:\n    - {name: ops, type: webhook, url: %s}\n", sink.URL)
	basePath, newPath := filepath.Join(dir, "base.yaml"), filepath.Join(dir, "new.yaml")
	if err := os.WriteFile(basePath, []byte(baseYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(newPath, []byte(strings.Replace(baseYAML, "max_retries: 10", "max_retries: 1", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Load(basePath)
	if err != nil {
		t.Fatal(err)
	}
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	js := bus.JS
	nc, err := bus.Srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	// Three agents; each fails one step 4 times (retries 1..4 under the
	// base), waiting for each decision as an agent does before it tries
	// again, and succeeds elsewhere; one provider each.
	t0 := time.Now().Add(-time.Hour).UTC()
	outcomes, wantDiffs := 0, map[string]int{} // outcome id → base retry number
	var reported []*events.Outcome
	for a := range 3 {
		bot, err := agent.New(nc, fmt.Sprintf("bot-%d", a))
		if err != nil {
			t.Fatal(err)
		}
		decisions, err := bot.Decisions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 6 {
			o := &events.Outcome{ID: fmt.Sprintf("bot-%d-%d", a, i), At: events.At(t0.Add(time.Duration(a*10+i) * time.Second)),
				Provider: []string{"openai", "anthropic", "my-gateway"}[a], Profile: "p1", Turn: 7, Step: 2}
			if i < 4 {
				o.Status, o.Body = 500, "upstream error"
				if i > 0 {
					wantDiffs[o.ID] = i + 1
				}
			} else {
				o.OK, o.Status, o.Step = true, 200, 3+i
			}
			if err := bot.Report(ctx, o); err != nil {
				t.Fatal(err)
			}
			reported = append(reported, o)
			outcomes++
			if !o.OK {
				select {
				case d := <-decisions:
					if d.OutcomeID != o.ID {
						t.Fatalf("decision for %s while waiting for %s", d.OutcomeID, o.ID)
					}
				case <-ctx.Done():
					t.Fatalf("no decision for %s", o.ID)
				}
			}
		}
	}
	clitest.WaitFor(t, "every outcome decided", func() bool {
		for _, c := range topology.Consumers() {
			stream, _, _ := topology.Consumer(c)
			if ok, err := embedded.CaughtUp(ctx, js, stream, c); err != nil || !ok {
				return false
			}
		}
		return true
	})
	recorded := map[string]events.Decision{}
	if err := watch.Read(ctx, js, watch.Config{Stream: topology.StreamDecisions}, func(m jetstream.Msg) error {
		d, err := events.DecodeAs[*events.Decision](m.Subject(), m.Headers(), m.Data())
		if err == nil {
			recorded[d.OutcomeID] = *d
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for id, retry := range wantDiffs {
		if d := recorded[id]; d.Action != events.ActionRetry || d.Retry != retry {
			t.Fatalf("the bus decided %+v for %s, want retry %d (max_retries 10)", d, id, retry)
		}
	}
	// simulate (its default seed), fed the same outcomes, decides the
	// bus's delays.
	simulated, err := sim.New(sim.Config{Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	jittered := 0
	for _, o := range reported {
		for _, out := range simulated.Step(sim.Input{Type: sim.InputOutcome, At: o.At, Outcome: o}) {
			if out.Decision == nil {
				continue
			}
			rec := recorded[o.ID]
			if out.Decision.Action != rec.Action || out.Decision.Retry != rec.Retry || out.Decision.DelayMS != rec.DelayMS {
				t.Errorf("%s: simulate decided %s %d after %d ms, the bus %s %d after %d ms", o.ID,
					out.Decision.Action, out.Decision.Retry, out.Decision.DelayMS, rec.Action, rec.Retry, rec.DelayMS)
			}
			if rec.Retry > 0 && rec.DelayMS%1000 != 0 {
				jittered++
			}
		}
	}
	if jittered == 0 {
		t.Error("no delay on the bus was jittered: the comparison shows nothing")
	}
	// Every retry was due before now (the outcomes are an hour old), but
	// JetStream fires a schedule on its own timer: wait until each has
	// written its due message, or one firing during shadow would count as
	// shadow changing the bus.
	retries := 0
	for _, d := range recorded {
		if d.Action == events.ActionRetry {
			retries++
		}
	}
	clitest.WaitFor(t, "every scheduled retry fired", func() bool {
		s, err := js.Stream(ctx, topology.StreamRetries)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(events.RetryPrefix+".due.>"))
		if err != nil {
			return false
		}
		fired := uint64(0)
		for _, n := range info.State.Subjects {
			fired += n
		}
		return fired == uint64(retries)
	})

	before, callsBefore := busState(t, ctx, js), sinkCalls.Load()
	shadow := func(policyPath string) ([]Diff, Summary) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := run([]string{"--server", bus.Srv.ClientURL(), "--base", basePath, "--policy", policyPath}, nil, &stdout, &stderr); code != 0 {
			t.Fatalf("shadow: exit %d: %s", code, stderr.String())
		}
		var diffs []Diff
		var sum Summary
		dec := json.NewDecoder(&stdout)
		for dec.More() {
			var line struct {
				Type string `json:"type"`
			}
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				t.Fatal(err)
			}
			_ = json.Unmarshal(raw, &line)
			switch line.Type {
			case "diff":
				var d Diff
				_ = json.Unmarshal(raw, &d)
				diffs = append(diffs, d)
			case "summary":
				_ = json.Unmarshal(raw, &sum)
			default:
				t.Errorf("unexpected line %s", raw)
			}
		}
		return diffs, sum
	}

	diffs, sum := shadow(newPath)
	got := map[string]int{}
	for _, d := range diffs {
		if d.Base == nil || d.Base.Action != events.ActionRetry || d.New == nil || d.New.Action != events.ActionGiveUp || d.Seq == 0 {
			t.Errorf("diff %+v: want base retry, new give_up", d)
			continue
		}
		if rec := recorded[d.OutcomeID]; d.Base.Retry != rec.Retry || d.Base.DelayMS != rec.DelayMS {
			t.Errorf("%s: the base run decided retry %d after %d ms, the bus retry %d after %d ms", d.OutcomeID, d.Base.Retry, d.Base.DelayMS, rec.Retry, rec.DelayMS)
		}
		got[d.OutcomeID] = d.Base.Retry
	}
	if !reflect.DeepEqual(got, wantDiffs) {
		t.Errorf("diffs %v, want %v", got, wantDiffs)
	}
	if sum.Outcomes != outcomes || sum.Differ != len(wantDiffs) || !reflect.DeepEqual(sum.Changes, map[string]int{"retry→give_up": len(wantDiffs)}) {
		t.Errorf("summary %+v: want %d outcomes, %d retry→give_up", sum, outcomes, len(wantDiffs))
	}

	same, sum := shadow(basePath)
	if len(same) != 0 || sum.Differ != 0 || sum.Outcomes != outcomes {
		t.Errorf("shadow of the base policy itself: %d diffs, summary %+v", len(same), sum)
	}

	if after := busState(t, ctx, js); !reflect.DeepEqual(after, before) {
		t.Errorf("the bus changed while shadow read it:\n before %v\n after  %v", before, after)
	}
	if calls := sinkCalls.Load(); calls != callsBefore {
		t.Errorf("the sink was called %d times during shadow", calls-callsBefore)
	}
}
