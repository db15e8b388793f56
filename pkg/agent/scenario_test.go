package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// The shared scenario file: what one Call does with each answer and each
// decision. The TypeScript client runs the same file (test/call.test.ts).
type scenarioFile struct {
	Policy    string     `json:"policy"`
	Scenarios []scenario `json:"scenarios"`
}

type scenario struct {
	Name  string         `json:"name"`
	Calls []scenarioCall `json:"calls"`
}

type scenarioCall struct {
	Request struct {
		Provider       string   `json:"provider"`
		Model          string   `json:"model"`
		Providers      []string `json:"providers"`
		Session        string   `json:"session"`
		Segment        int      `json:"segment"`
		Turn           int      `json:"turn"`
		Step           int      `json:"step"`
		StallAfterMS   int      `json:"stall_after_ms"`
		ResumeWindowMS int      `json:"resume_window_ms"`
	} `json:"request"`
	Attempts      []scriptAttempt `json:"attempts"`
	Down          *scriptAttempt  `json:"down"`
	UpAfterProbes int             `json:"up_after_probes"`
	Up            *scriptAttempt  `json:"up"`
	Expect        struct {
		Actions                []string `json:"actions"`
		ContainsAction         string   `json:"contains_action"`
		Result                 *string  `json:"result"`
		ErrorAction            string   `json:"error_action"`
		ErrorClass             string   `json:"error_class"`
		Classes                []string `json:"classes"`
		TransportErrorContains string   `json:"transport_error_contains"`
		Chunks                 [][2]any `json:"chunks"`
		Restarts               []struct {
			Attempt, Previous int
			Partial           string
		} `json:"restarts"`
		Started        int      `json:"started"`
		AfterDue       bool     `json:"after_due"`
		MinProbes      int      `json:"min_probes"`
		CallsWhileHeld *int     `json:"calls_while_held"`
		Targets        []string `json:"targets"`
	} `json:"expect"`
}

type scriptAttempt struct {
	OK             bool              `json:"ok"`
	Result         string            `json:"result"`
	Chunks         []string          `json:"chunks"`
	Status         int               `json:"status"`
	Body           string            `json:"body"`
	Headers        map[string]string `json:"headers"`
	TransportError string            `json:"transport_error"`
	Stall          bool              `json:"stall"`
	StopReason     string            `json:"stop_reason"`
	RefusalScope   string            `json:"refusal_scope"`
}

// play runs one scripted attempt as a call function would.
func (s scriptAttempt) play(ctx context.Context, at *agent.Attempt) (string, error) {
	for _, c := range s.Chunks {
		at.Emit(c)
	}
	switch {
	case s.Stall:
		<-ctx.Done()
		return "", ctx.Err()
	case s.OK:
		return s.Result, nil
	case s.TransportError != "":
		return "", errors.New(s.TransportError)
	case s.StopReason != "":
		at.Observe(agent.Evidence{Status: s.Status, StopReason: s.StopReason, RefusalScope: s.RefusalScope})
		return "", nil
	}
	return "", &agent.HTTPError{Status: s.Status, Body: s.Body, Headers: s.Headers}
}

func TestCallScenarios(t *testing.T) {
	data, err := os.ReadFile("../../testdata/call/scenarios.json")
	if err != nil {
		t.Fatal(err)
	}
	var file scenarioFile
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse([]byte(file.Policy))
	if err != nil {
		t.Fatal(err)
	}
	b, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}, Policy: pol, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	for i, sc := range file.Scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			a := callAgent(t, b, fmt.Sprintf("go-scenario-%d", i))
			for _, c := range sc.Calls {
				runScenarioCall(t, b, a, c)
			}
		})
	}
}

func runScenarioCall(t *testing.T, b *devbus.Bus, a *agent.Agent, c scenarioCall) {
	t.Helper()
	r := c.Request
	var (
		mu       sync.Mutex
		chunks   [][2]any
		restarts []agent.Restart
		targets  []string
		times    []time.Time
		probes   atomic.Int32
		held     atomic.Int32
		up       atomic.Bool
	)
	req := agent.Request{
		Provider: r.Provider, Model: r.Model, Providers: r.Providers, Session: r.Session, Segment: r.Segment, Turn: r.Turn, Step: r.Step,
		StallAfter:   time.Duration(r.StallAfterMS) * time.Millisecond,
		ResumeWindow: time.Duration(r.ResumeWindowMS) * time.Millisecond,
		OnChunk:      func(ch agent.Chunk) { mu.Lock(); chunks = append(chunks, [2]any{ch.Attempt, ch.Text}); mu.Unlock() },
		OnRestart:    func(rs agent.Restart) { mu.Lock(); restarts = append(restarts, rs); mu.Unlock() },
	}
	var n atomic.Int32
	res, trail, err := agent.Call(callCtx(t), a, req, func(ctx context.Context, at *agent.Attempt) (string, error) {
		mu.Lock()
		targets, times = append(targets, at.Provider), append(times, time.Now())
		mu.Unlock()
		if c.Down != nil {
			switch {
			case at.Probe:
				if probes.Add(1) > int32(c.UpAfterProbes) {
					up.Store(true)
				}
			case probes.Load() > 0 && !up.Load():
				held.Add(1)
			}
			if up.Load() {
				return c.Up.play(ctx, at)
			}
			return c.Down.play(ctx, at)
		}
		k := int(n.Add(1)) - 1
		if k >= len(c.Attempts) {
			return "", fmt.Errorf("attempt %d: the script has %d", k+1, len(c.Attempts))
		}
		return c.Attempts[k].play(ctx, at)
	})
	e := c.Expect
	var actions, classes []string
	for _, s := range trail {
		if s.Decision != nil {
			actions, classes = append(actions, s.Decision.Action), append(classes, s.Decision.Class)
		}
	}
	if e.Actions != nil && !slices.Equal(actions, e.Actions) {
		t.Errorf("decisions %v, want %v", actions, e.Actions)
	}
	if e.ContainsAction != "" && !slices.Contains(actions, e.ContainsAction) {
		t.Errorf("decisions %v, want one %s", actions, e.ContainsAction)
	}
	if e.Classes != nil && !slices.Equal(classes, e.Classes) {
		t.Errorf("classes %v, want %v", classes, e.Classes)
	}
	if e.Result != nil && (err != nil || res != *e.Result) {
		t.Errorf("Call = %q, %v; want %q", res, err, *e.Result)
	}
	if e.ErrorAction != "" {
		var de *agent.DecisionError
		if !errors.As(err, &de) || de.Action() != e.ErrorAction || de.Decision.Class != e.ErrorClass || de.Decision.Rule == "" {
			t.Errorf("err %v, want a DecisionError %s of class %s with its rule", err, e.ErrorAction, e.ErrorClass)
		}
	}
	if e.TransportErrorContains != "" && (len(trail) == 0 || !strings.Contains(trail[0].Outcome.TransportError, e.TransportErrorContains)) {
		t.Errorf("first outcome's transport error %q, want it to say %q", trail[0].Outcome.TransportError, e.TransportErrorContains)
	}
	mu.Lock()
	defer mu.Unlock()
	if e.Chunks != nil {
		want := make([][2]any, len(e.Chunks))
		for i, ch := range e.Chunks {
			n, _ := ch[0].(float64)
			want[i] = [2]any{int(n), ch[1]}
		}
		if fmt.Sprint(chunks) != fmt.Sprint(want) {
			t.Errorf("chunks %v, want %v", chunks, want)
		}
	}
	if e.Restarts != nil {
		if len(restarts) != len(e.Restarts) {
			t.Errorf("restarts %+v, want %+v", restarts, e.Restarts)
		}
		for i := range min(len(restarts), len(e.Restarts)) {
			if w := e.Restarts[i]; restarts[i].Attempt != w.Attempt || restarts[i].Previous != w.Previous || restarts[i].Partial != w.Partial {
				t.Errorf("restart %d: %+v, want %+v", i, restarts[i], w)
			}
		}
	}
	if e.Started > 0 {
		if n := storedCount(t, b, topology.StreamRetries, events.RetryStartedSubject(a.Name())); n != e.Started {
			t.Errorf("%d started records, want %d", n, e.Started)
		}
	}
	if e.AfterDue {
		for i, s := range trail {
			if s.Decision != nil && s.Decision.Action == events.ActionRetry && i+1 < len(times) && times[i+1].Before(s.Decision.DueAt.Time) {
				t.Errorf("attempt %d at %v, before its retry was due (%v)", i+2, times[i+1], s.Decision.DueAt.Time)
			}
		}
	}
	if int(probes.Load()) < e.MinProbes {
		t.Errorf("%d probes answered, want at least %d", probes.Load(), e.MinProbes)
	}
	if e.CallsWhileHeld != nil && int(held.Load()) != *e.CallsWhileHeld {
		t.Errorf("%d calls reached the provider while held, want %d", held.Load(), *e.CallsWhileHeld)
	}
	if e.Targets != nil && !slices.Equal(targets, e.Targets) {
		t.Errorf("attempts went to %v, want %v", targets, e.Targets)
	}
}
