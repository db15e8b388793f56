package events_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

func recoverySamples() []events.Message {
	payload, _ := msgpack.Marshal(map[string]any{"prompt": "summarise", "n": int64(3), "tags": []any{"a", "b"}})
	return []events.Message{
		&events.Heartbeat{At: events.At(when), Agent: "coord", Subagent: "sub-1", Session: "s", Provider: "openai", Model: "m", TaskID: "t-1", Status: events.HeartbeatRunning, IntervalMS: 200},
		&events.CronSpec{At: events.At(when), Agent: "coord", Cron: "digest", Schedule: "0 9 * * 1-5", Timezone: "Europe/Berlin", Provider: "openai", Catchup: events.CatchupAll, CatchupWindow: events.Duration(6 * time.Hour)},
		&events.CronRun{At: events.At(when), Agent: "coord", Cron: "digest", ScheduledAt: events.At(when.Truncate(time.Hour)), Status: events.CronOK, Provider: "openai"},
		&events.Write{At: events.At(when), Agent: "coord", Key: "memory/2026-11-29.md", OK: false, Error: "fetch failed", Provider: "openai"},
		&events.Task{ID: "t-1", At: events.At(when), Agent: "coord", Provider: "openai", Kind: "research", Payload: payload},
		&events.Dispatch{TaskID: "t-1", Attempt: 2, At: events.At(when), Agent: "coord", Provider: "openai", Kind: "research", Payload: payload, Reason: "redispatched"},
		&events.Control{At: events.At(when), Agent: "coord", Action: events.ControlRunCron, Reason: "missed", RecoveryID: "openai:1", Cron: "digest", ScheduledAt: events.At(when)},
		&events.Recovery{RecoveryID: "openai:1795955445123", At: events.At(when), Provider: "openai", OutageStartedAt: events.At(when.Add(-8 * time.Hour)), RecoveredAt: events.At(when), Step: events.StepKill,
			Killed:       []events.SubagentRef{{Agent: "coord", Subagent: "sub-1", TaskID: "t-1", LastHeartbeatAt: events.At(when.Add(-7 * time.Hour))}},
			CronsMissed:  []events.CronRef{{Agent: "coord", Cron: "digest", ScheduledAt: events.At(when), Why: "outside the catch-up window"}},
			Writes:       []events.WriteRef{{Agent: "coord", Key: "k", FailedAt: events.At(when)}},
			Redispatched: []events.TaskRef{{TaskID: "t-1", Attempt: 2}}, Released: 200},
	}
}

func TestRecoveryTypesRoundTrip(t *testing.T) {
	for _, m := range recoverySamples() {
		t.Run(m.SchemaName(), func(t *testing.T) {
			data, h, err := events.Encode(m)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Get(events.HeaderSchema); got != m.SchemaName()+"/1" {
				t.Fatalf("schema header = %q", got)
			}
			back, err := events.Decode("", h, data)
			if err != nil {
				t.Fatal(err)
			}
			a, _ := json.Marshal(m)
			b, _ := json.Marshal(back)
			if string(a) != string(b) {
				t.Fatalf("bus round trip changed the message:\n%s\n%s", a, b)
			}
			again := events.ContractTypes().New(m.SchemaName())
			if err := events.UnmarshalJSON(a, again); err != nil {
				t.Fatal(err)
			}
			c, _ := json.Marshal(again)
			if string(a) != string(c) {
				t.Fatalf("JSON round trip changed the message:\n%s\n%s", a, c)
			}
		})
	}
}

// The payload is passed through untouched: the bytes a task arrived with are
// the bytes its dispatch carries, whatever msgpack types they hold.
func TestTaskPayloadPassesThroughByteForByte(t *testing.T) {
	// A map with an integer key and a binary value: nothing JSON could carry.
	raw, _ := msgpack.Marshal(map[any]any{int64(7): []byte{0, 1, 2}, "x": 1.5})
	data, h, err := events.Encode(&events.Task{ID: "t", Agent: "a", Payload: raw})
	if err != nil {
		t.Fatal(err)
	}
	task, err := events.DecodeAs[*events.Task]("", h, data)
	if err != nil {
		t.Fatal(err)
	}
	d := &events.Dispatch{TaskID: task.ID, Attempt: 1, Agent: task.Agent, Payload: task.Payload}
	data, h, err = events.Encode(d)
	if err != nil {
		t.Fatal(err)
	}
	back, err := events.DecodeAs[*events.Dispatch]("", h, data)
	if err != nil {
		t.Fatal(err)
	}
	if string(back.Payload) != string(raw) {
		t.Fatalf("payload changed: % x → % x", raw, back.Payload)
	}
	var js events.Task
	if err := events.UnmarshalJSON([]byte(`{"id":"t","agent":"a","payload":{"big":9007199254740993,"f":0.5,"l":[1,"x",null]}}`), &js); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(js.Payload)
	if string(out) != `{"big":9007199254740993,"f":0.5,"l":[1,"x",null]}` {
		t.Fatalf("JSON payload = %s", out)
	}
}

func TestRecoveryValidationNamesTheField(t *testing.T) {
	long := strings.Repeat("x", events.MaxNameBytes+1)
	cases := []struct {
		name  string
		m     events.Message
		field string
	}{
		{"heartbeat without subagent", &events.Heartbeat{Agent: "a"}, "subagent"},
		{"heartbeat without agent", &events.Heartbeat{Subagent: "s"}, "agent"},
		{"heartbeat with unknown status", &events.Heartbeat{Agent: "a", Subagent: "s", Status: "sleeping"}, "status"},
		{"heartbeat with negative interval", &events.Heartbeat{Agent: "a", Subagent: "s", IntervalMS: -1}, "interval_ms"},
		{"cron spec without name", &events.CronSpec{Agent: "a", Schedule: "* * * * *"}, "cron"},
		{"cron spec without schedule", &events.CronSpec{Agent: "a", Cron: "c"}, "schedule"},
		{"unparseable cron schedule", &events.CronSpec{Agent: "a", Cron: "c", Schedule: "every morning"}, "schedule"},
		{"six fields", &events.CronSpec{Agent: "a", Cron: "c", Schedule: "0 0 9 * * *"}, "schedule"},
		{"minute out of range", &events.CronSpec{Agent: "a", Cron: "c", Schedule: "61 * * * *"}, "schedule"},
		{"zone inside the expression", &events.CronSpec{Agent: "a", Cron: "c", Schedule: "TZ=UTC"}, "schedule"},
		{"@every without a duration", &events.CronSpec{Agent: "a", Cron: "c", Schedule: "@every often"}, "schedule"},
		{"@every below a second", &events.CronSpec{Agent: "a", Cron: "c", Schedule: "@every 10ms"}, "schedule"},
		{"unknown time zone", &events.CronSpec{Agent: "a", Cron: "c", Schedule: "@daily", Timezone: "Mars/Olympus"}, "timezone"},
		{"unknown catch-up mode", &events.CronSpec{Agent: "a", Cron: "c", Schedule: "@daily", Catchup: "some"}, "catchup"},
		{"negative catch-up window", &events.CronSpec{Agent: "a", Cron: "c", Schedule: "@daily", CatchupWindow: -1}, "catchup_window"},
		{"cron run without scheduled time", &events.CronRun{Agent: "a", Cron: "c", Status: "ok"}, "scheduled_at"},
		{"cron run with unknown status", &events.CronRun{Agent: "a", Cron: "c", Status: "maybe", ScheduledAt: events.At(when)}, "status"},
		{"write without key", &events.Write{Agent: "a"}, "key"},
		{"task without id", &events.Task{Agent: "a"}, "id"},
		{"task without agent", &events.Task{ID: "t"}, "agent"},
		{"dispatch with attempt 0", &events.Dispatch{TaskID: "t", Agent: "a"}, "attempt"},
		{"kill without subagent", &events.Control{Agent: "a", Action: events.ControlKill}, "subagent"},
		{"run_cron without time", &events.Control{Agent: "a", Action: events.ControlRunCron, Cron: "c"}, "scheduled_at"},
		{"check_write without key", &events.Control{Agent: "a", Action: events.ControlCheckWrite}, "key"},
		{"probe without provider", &events.Control{Agent: "a", Action: events.ControlProbe}, "provider"},
		{"unknown control action", &events.Control{Agent: "a", Action: "reboot"}, "action"},
		{"recovery with unknown step", &events.Recovery{RecoveryID: "p:1", Provider: "p", Step: "pray"}, "step"},
		{"overlong subagent", &events.Heartbeat{Agent: "a", Subagent: long}, "subagent"},
		{"overlong heartbeat provider", &events.Heartbeat{Agent: "a", Subagent: "s", Provider: long}, "provider"},
		{"overlong cron name", &events.CronSpec{Agent: "a", Cron: long, Schedule: "@daily"}, "cron"},
		{"overlong cron run name", &events.CronRun{Agent: "a", Cron: long, Status: "ok", ScheduledAt: events.At(when)}, "cron"},
		{"overlong write key", &events.Write{Agent: "a", Key: long}, "key"},
		{"overlong task provider", &events.Task{ID: "t", Agent: "a", Provider: long}, "provider"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.m.Validate()
			var fe *events.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Validate() = %v, want a FieldError", err)
			}
			if fe.Field != c.field {
				t.Fatalf("field = %q (%v), want %q", fe.Field, err, c.field)
			}
			// The bus decoder says the same.
			data, err := msgpack.Marshal(c.m)
			if err != nil {
				t.Fatal(err)
			}
			h := nats.Header{}
			h.Set(events.HeaderSchema, c.m.SchemaName()+"/1")
			if _, err := events.Decode("", h, data); err == nil || !strings.Contains(err.Error(), `"`+c.field+`"`) {
				t.Fatalf("Decode error %v does not name %q", err, c.field)
			}
		})
	}
}

func TestRecoverySubjects(t *testing.T) {
	for got, want := range map[string]string{
		events.HeartbeatSubject("bot 1"):     "failbus.heartbeat.bot_1",
		events.CronSpecSubject("bot"):        "failbus.cron.spec.bot",
		events.CronRunSubject("bot"):         "failbus.cron.run.bot",
		events.WriteSubject("bot"):           "failbus.write.bot",
		events.TaskSubject("open.ai", "bot"): "failbus.task.open_ai.bot",
		events.TaskSubject("", "bot"):        "failbus.task._.bot",
		events.DispatchSubject("bot"):        "failbus.dispatch.bot",
		events.ControlSubject("bot"):         "failbus.control.bot",
		events.RecoverySubject("my-gateway"): "failbus.recovery.my-gateway",
	} {
		if got != want {
			t.Errorf("%s, want %s", got, want)
		}
	}
}

func TestDurationDecodesEveryShape(t *testing.T) {
	for in, want := range map[string]time.Duration{
		`{"agent":"a","cron":"c","schedule":"@daily","catchup_window":"6h"}`:    6 * time.Hour,
		`{"agent":"a","cron":"c","schedule":"@daily","catchup_window":"1h30m"}`: 90 * time.Minute,
		`{"agent":"a","cron":"c","schedule":"@daily","catchup_window":1500}`:    1500 * time.Millisecond,
		`{"agent":"a","cron":"c","schedule":"@daily"}`:                          0,
	} {
		var c events.CronSpec
		if err := events.UnmarshalJSON([]byte(in), &c); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if c.CatchupWindow.Std() != want {
			t.Fatalf("%s: %v, want %v", in, c.CatchupWindow, want)
		}
		data, h, err := events.Encode(&c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := events.DecodeAs[*events.CronSpec]("", h, data)
		if err != nil {
			t.Fatal(err)
		}
		if back.CatchupWindow != c.CatchupWindow {
			t.Fatalf("bus round trip: %v", back.CatchupWindow)
		}
	}
	var c events.CronSpec
	err := events.UnmarshalJSON([]byte(`{"catchup_window":"soon"}`), &c)
	var fe *events.FieldError
	if !errors.As(err, &fe) || fe.Field != "catchup_window" {
		t.Fatalf("bad duration: %v", err)
	}
}

// FuzzRecoveryDecode: the recovery types' decoders never panic, and what they
// accept is valid and re-encodes.
func FuzzRecoveryDecode(f *testing.F) {
	for _, m := range recoverySamples() {
		data, _, _ := events.Encode(m)
		f.Add(data, m.SchemaName()+"/1")
	}
	f.Add([]byte{0x81, 0xa7, 'p', 'a', 'y', 'l', 'o', 'a', 'd', 0xc1}, "task/1")
	f.Add([]byte{0x81, 0xae, 'c', 'a', 't', 'c', 'h', 'u', 'p', '_', 'w', 'i', 'n', 'd', 'o', 'w', 0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0}, "cron_spec/1")
	f.Fuzz(func(t *testing.T, data []byte, schema string) {
		h := nats.Header{}
		h.Set(events.HeaderSchema, schema)
		m, err := events.Decode("", h, data)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("accepted an invalid message: %v", err)
		}
		if _, _, err := events.Encode(m); err != nil {
			t.Fatalf("accepted message does not re-encode: %v", err)
		}
		if _, err := json.Marshal(m); err != nil {
			t.Fatalf("accepted message does not render as JSON: %v", err)
		}
	})
}

// A checkpoint is a reference to where the work is kept: 4 KiB at most.
func TestHeartbeatCheckpointBound(t *testing.T) {
	h := events.Heartbeat{Agent: "a", Subagent: "s", Checkpoint: strings.Repeat("c", events.MaxCheckpointBytes)}
	if err := h.Validate(); err != nil {
		t.Fatalf("a 4 KiB checkpoint: %v", err)
	}
	h.Checkpoint += "c"
	var fe *events.FieldError
	if err := h.Validate(); !errors.As(err, &fe) || fe.Field != "checkpoint" {
		t.Fatalf("a checkpoint past 4 KiB: %v", err)
	}
}
