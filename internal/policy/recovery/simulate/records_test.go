package simulate_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/simulate"
	"github.com/failbus/failbus/pkg/events"
)

// The simulate records of recovery read as their wire types, and the
// outputs write "type" first and the message's own keys.
func TestRecordsReadAndWrite(t *testing.T) {
	lines := []struct{ typ, line string }{
		{"heartbeat", `{"type":"heartbeat","at":"2026-03-02T00:00:00Z","agent":"a","subagent":"s","provider":"openai","task_id":"t","interval_ms":1000}`},
		{"cron_spec", `{"type":"cron_spec","at":1772409600000,"agent":"a","cron":"c","schedule":"0 * * * *","catchup":"all","catchup_window":"2h"}`},
		{"cron_run", `{"type":"cron_run","at":"2026-03-02T01:00:05Z","agent":"a","cron":"c","scheduled_at":"2026-03-02T01:00:00Z","status":"ok"}`},
		{"write", `{"type":"write","at":"2026-03-02T01:00:00Z","agent":"a","key":"m.md","ok":false,"error":"fetch failed"}`},
		{"task", `{"type":"task","id":"t","at":"2026-03-02T00:00:00Z","agent":"a","provider":"openai","payload":{"x":[1,2]}}`},
	}
	sim, err := simulate.New(recovery.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var out []simulate.Output
	for _, l := range lines {
		if !simulate.IsInputType(l.typ) {
			t.Fatalf("%s is not an input type", l.typ)
		}
		in, at, err := simulate.ParseRecord(l.typ, []byte(l.line))
		if err != nil {
			t.Fatalf("%s: %v", l.typ, err)
		}
		if at.IsZero() {
			t.Fatalf("%s: no at", l.typ)
		}
		o, err := sim.Step(context.Background(), in, at.Time)
		if err != nil {
			t.Fatalf("%s: %v", l.typ, err)
		}
		out = append(out, o...)
	}
	if len(out) != 1 || out[0].Type != simulate.OutputDispatch {
		t.Fatalf("outputs %+v, want the task's dispatch", out)
	}
	b, err := json.Marshal(out[0])
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"dispatch","task_id":"t","attempt":1,"at":"2026-03-02T01:00:05.000Z","agent":"a","provider":"openai","payload":{"x":[1,2]},"reason":"submitted; provider openai is up"}`
	if string(b) != want {
		t.Fatalf("dispatch record\n%s\nwant\n%s", b, want)
	}
	// A bad record is an error naming the field, from Step.
	in, at, err := simulate.ParseRecord("cron_spec", []byte(`{"agent":"a","cron":"c","schedule":"sometimes"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sim.Step(context.Background(), in, at.Add(time.Hour)); !errors.Is(err, recovery.ErrInvalid) || !strings.Contains(err.Error(), `"schedule"`) {
		t.Fatalf("bad schedule: %v", err)
	}
	if _, _, err := simulate.ParseRecord("cron_spec", []byte(`{"catchup_window":"soon"}`)); err == nil || !strings.Contains(err.Error(), "catchup_window") {
		t.Fatalf("bad duration: %v", err)
	}
	if _, _, err := simulate.ParseRecord("nap", []byte(`{}`)); err == nil {
		t.Fatal("unknown type accepted")
	}
}

// Any record line, however broken, is either refused by ParseRecord or
// folded in by the core — accepted, or refused as invalid input naming the
// problem — and never panics or breaks the run: a good task after it is
// still dispatched.
func FuzzRecordThenStep(f *testing.F) {
	f.Add("heartbeat", `{"at":"2026-03-02T00:00:00Z","agent":"a","subagent":"s","provider":"openai","interval_ms":1000}`)
	f.Add("heartbeat", `{"agent":"a"}`)
	f.Add("heartbeat", `{"agent":"a","subagent":"s","status":"sleeping","interval_ms":-5}`)
	f.Add("cron_spec", `{"agent":"a","cron":"c","schedule":"@every 1ns","timezone":"Mars/Olympus"}`)
	f.Add("cron_spec", `{"agent":"a","cron":"c","schedule":"*/0 * * * *","catchup":"most"}`)
	f.Add("cron_spec", `{"agent":"a","cron":"c","schedule":"@every 1s","catchup_window":-1}`)
	f.Add("cron_run", `{"agent":"a","cron":"c","scheduled_at":"9999-12-31T23:59:59Z","status":"ok"}`)
	f.Add("write", `{"agent":"a","key":"","ok":false}`)
	f.Add("task", `{"agent":"a","provider":"openai","payload":[[[[[]]]]]}`)
	f.Add("task", `{"id":"","at":-1}`)
	f.Fuzz(func(t *testing.T, typ, line string) {
		sim, err := simulate.New(recovery.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		at := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
		in, _, err := simulate.ParseRecord(typ, []byte(line))
		if err == nil {
			if _, err := sim.Step(ctx, in, at); err != nil && !errors.Is(err, recovery.ErrInvalid) {
				t.Fatalf("%s %s: an error that is not about the input: %v", typ, line, err)
			}
		}
		good, _, err := simulate.ParseRecord("task", []byte(`{"id":"after-fuzz","agent":"a","provider":"p"}`))
		if err != nil {
			t.Fatal(err)
		}
		out, err := sim.Step(ctx, good, at.Add(time.Second))
		if err != nil {
			t.Fatalf("after %s %s: %v", typ, line, err)
		}
		found := false
		for _, o := range out {
			if d, ok := o.Msg.(*events.Dispatch); ok && d.TaskID == "after-fuzz" {
				found = true
			}
		}
		if !found {
			t.Fatalf("after %s %s: the good task was not dispatched (%d outputs)", typ, line, len(out))
		}
	})
}
