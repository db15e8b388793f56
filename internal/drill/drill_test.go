package drill

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/chaos"
)

// The drill, small: a few agents through the default timeline compressed
// twelve times, both strategies side by side. It asserts the failbus
// row's own promises; the baseline's figures are printed, not asserted.
func TestDrillKeepsTheBusPromises(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var progress strings.Builder
	rep, err := Run(ctx, Config{Agents: 8, Tasks: 3, Steps: 3, Crashes: 2, Scale: 0.08, Parallel: true, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := WriteTable(&out, rep.Rows); err != nil {
		t.Fatal(err)
	}
	WriteDetails(&out, rep)
	_, verdict := GoalVerdict(rep.Rows, StrategyFailbus)
	t.Logf("\n%s%s", out.String(), verdict)

	var bus *Row
	for i := range rep.Rows {
		if rep.Rows[i].UnmatchedRequests != 0 {
			t.Errorf("%s: %d requests in the provider's log match no prompt the fleet sent: the drill miscounts", rep.Rows[i].Strategy, rep.Rows[i].UnmatchedRequests)
		}
		if rep.Rows[i].Strategy == StrategyFailbus {
			bus = &rep.Rows[i]
		}
	}
	if bus == nil || len(rep.Rows) != 2 {
		t.Fatalf("rows %+v; want go-sdk and go-failbus", rep.Rows)
	}
	// The drill must have hit what it claims to test.
	if bus.OutageDeclared <= 0 || bus.RecoveryDeclared <= bus.OutageDeclared || bus.Refused == 0 {
		t.Fatalf("the bus declared the outage at %vs and the recovery at %vs, %d calls were refused: the drill missed its faults",
			bus.OutageDeclared, bus.RecoveryDeclared, bus.Refused)
	}
	if bus.Crashed == 0 {
		// A machine slow enough to dispatch the crashing tasks only after
		// the outage was declared holds them instead: nothing to crash.
		t.Log("no subagent was running when its crash came: the kill and re-dispatch were not exercised")
	}
	if bus.Lost != 0 || bus.Completed != bus.Tasks {
		t.Errorf("failbus completed %d of %d tasks, lost %d: %v", bus.Completed, bus.Tasks, bus.Lost, bus.LostBy)
	}
	if bus.CompletedTwice != 0 {
		t.Errorf("failbus completed %d tasks more than once", bus.CompletedTwice)
	}
	if bus.CallsWhileDown != 0 {
		t.Errorf("failbus began %d attempts other than probes on the provider while the bus knew it was down", bus.CallsWhileDown)
	}
	if n := bus.Wasted.RefusedResent; n != 0 {
		t.Errorf("failbus re-sent %d refused segments to the provider that refused them", n)
	}
	if bus.Redispatched < bus.Crashed {
		t.Errorf("%d subagents crashed, %d tasks re-dispatched", bus.Crashed, bus.Redispatched)
	}
}

// The ledger reads a request's prompt as the chaos provider does, so
// every request in the provider's log maps back to what it was for.
func TestFingerprintMatchesTheChaosProvider(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	srv, err := chaos.New(nil, chaos.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	l := newLedger(time.Now(), 1)
	s := newSDKs(l, 0, srv.OpenAIBaseURL(ProviderOpenAI), srv.AnthropicBaseURL(ProviderAnthropic), nil)
	task := TaskPlan{ID: "a-t0", Agent: "a", Steps: 3, Marker: RefusalMarker(ProviderOpenAI)}
	convs := [][]message{probeConversation, cronConversation("a", time.Unix(1, 0)), stepConversation(task, 3, []string{"one", "two"})}
	for _, p := range []string{ProviderOpenAI, ProviderAnthropic} {
		for i, c := range convs {
			if _, err := s.stream(withIntent(ctx, intent{Kind: kindStep, Task: task.ID, Step: i}), p, "", "sk-x", c, nil); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
		}
	}
	log := srv.Requests()
	if len(log) != 6 {
		t.Fatalf("the provider got %d requests; want 6", len(log))
	}
	for _, q := range log {
		in, ok := l.intent(q.Fingerprint)
		if !ok {
			t.Errorf("%s request %d: fingerprint %s is not in the ledger", q.Provider, q.Seq, q.Fingerprint)
			continue
		}
		if want := convs[in.Step]; tokens(want) != q.Tokens {
			t.Errorf("%s request %d: %d tokens; the drill estimates %d", q.Provider, q.Seq, q.Tokens, tokens(want))
		}
	}
}
