package devbus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// lockedBuffer collects log lines from every service's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// withUnit is a numeric field whose name says its unit.
var withUnit = regexp.MustCompile(`_(ns|us|ms|s|bytes|per_s)$`)

// counts are numeric fields that count or identify things: no unit to say.
var counts = []string{
	"seq", "delivered", "concurrency", "max_in_flight", "replayed", "attempt", "revision", "segment",
	"port", "conflicts", "seed", "max_deliver", "handler_deliveries", "retry", "retries",
	"turn", "step", "status", "n", "count", "refusals", "reprobes",
}

// Every number in the services' logs says its unit in its field name
// (took_ms, not took=0.97), and max_deliver is what the consumer has
// (10), not the handler's share of it.
func TestLogFieldsSayTheirUnits(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	b, err := devbus.Start(devbus.Options{
		Server: embedded.Options{ServerName: "failbus-devbus-test"},
		Log:    zerolog.New(logs).Level(zerolog.DebugLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	nc, err := b.Srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ag, err := agent.New(nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, o := range []*events.Outcome{
		{ID: "ok", Provider: "openai", OK: true, Status: 200},
		{ID: "429", Provider: "openai", Status: 429, Headers: map[string]string{"retry-after": "30"}},
		{ID: "503", Provider: "openai", Status: 503, Turn: 1, Step: 1},
		{ID: "refusal", Provider: "strict", Session: "s", Segment: 1, OK: true, Status: 200, StopReason: "refusal", RefusalScope: "history"},
	} {
		if err := ag.Report(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.JS.Publish(ctx, events.OutcomeSubject("openai", "bot"), []byte("junk")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ stream, name string }{
		{topology.StreamOutcomes, topology.ConsumerClassifier},
		{topology.StreamClassified, topology.ConsumerScheduler},
		{topology.StreamClassified, topology.ConsumerRefusals},
		{topology.StreamNotify, topology.ConsumerNotifier},
	} {
		for {
			done, err := embedded.CaughtUp(ctx, b.JS, c.stream, c.name)
			if err != nil {
				t.Fatal(err)
			}
			if done {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s did not catch up", c.name)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}

	lines, numbers, maxDeliver := 0, 0, 0
	dec := json.NewDecoder(bytes.NewReader([]byte(logs.String())))
	dec.UseNumber()
	for dec.More() {
		var rec map[string]any
		if err := dec.Decode(&rec); err != nil {
			t.Fatalf("log line is not JSON: %v", err)
		}
		lines++
		for k, v := range rec {
			if _, ok := v.(json.Number); !ok {
				continue
			}
			numbers++
			if !withUnit.MatchString(k) && !slices.Contains(counts, k) {
				t.Errorf("%s=%v in %q: a number without a unit in its name", k, v, rec["message"])
			}
			if k == "max_deliver" {
				maxDeliver++
				if v.(json.Number).String() != "10" {
					t.Errorf("max_deliver=%v in %q; the consumers have 10", v, rec["message"])
				}
			}
		}
	}
	if lines < 10 || numbers < 5 || maxDeliver < 4 {
		t.Fatalf("%d log lines, %d numbers, %d max_deliver: the services did not log what the test reads\n%s", lines, numbers, maxDeliver, logs.String())
	}

}

// The server's goroutines and each service's carry the profiler label
// failbus=<name> (so `go tool pprof -tags` splits a CPU profile of failbus
// bench or dev by component), and starting the bus leaves the caller's
// own labels as they were. Not parallel: no other test's bus is running,
// so the labels found are this bus's.
func TestGoroutinesCarryTheirComponentsLabel(t *testing.T) {
	var (
		b        *devbus.Bus
		err      error
		profiled bytes.Buffer
	)
	pprof.Do(context.Background(), pprof.Labels("failbus", "test-caller"), func(context.Context) {
		b, err = devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-devbus-labels"}})
		if err != nil {
			return
		}
		err = pprof.Lookup("goroutine").WriteTo(&profiled, 1)
	})
	if b != nil {
		t.Cleanup(func() { _ = b.Stop() })
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range append([]string{"nats-server", "admin", "test-caller"}, b.Names...) {
		if want := `"failbus":"` + name + `"`; !strings.Contains(profiled.String(), want) {
			t.Errorf("no goroutine labelled %s", want)
		}
	}
}
