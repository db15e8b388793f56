package events_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// agentRecords is one valid record of every type an agent sends, each with
// a setter per identifier field, so every name of every type meets the
// same gate.
func agentRecords() []struct {
	rec    func() events.AgentRecord
	fields map[string]func(events.AgentRecord, string)
} {
	return []struct {
		rec    func() events.AgentRecord
		fields map[string]func(events.AgentRecord, string)
	}{
		{
			func() events.AgentRecord { return sample() },
			map[string]func(events.AgentRecord, string){
				"id":            func(r events.AgentRecord, v string) { r.(*events.Outcome).ID = v },
				"provider":      func(r events.AgentRecord, v string) { r.(*events.Outcome).Provider = v },
				"model":         func(r events.AgentRecord, v string) { r.(*events.Outcome).Model = v },
				"profile":       func(r events.AgentRecord, v string) { r.(*events.Outcome).Profile = v },
				"session":       func(r events.AgentRecord, v string) { r.(*events.Outcome).Session = v },
				"origin.name":   func(r events.AgentRecord, v string) { r.(*events.Outcome).Origin.Name = v },
				"origin.parent": func(r events.AgentRecord, v string) { r.(*events.Outcome).Origin.Parent = v },
			},
		},
		{
			func() events.AgentRecord {
				return &events.Boundary{At: events.At(when), Agent: "agent/1", Session: "s", Segment: 1}
			},
			map[string]func(events.AgentRecord, string){
				"session": func(r events.AgentRecord, v string) { r.(*events.Boundary).Session = v },
			},
		},
		{
			func() events.AgentRecord {
				return &events.Heartbeat{At: events.At(when), Agent: "agent/1", Subagent: "sub", Provider: "p", Model: "m", TaskID: "t", Session: "s"}
			},
			map[string]func(events.AgentRecord, string){
				"subagent": func(r events.AgentRecord, v string) { r.(*events.Heartbeat).Subagent = v },
				"provider": func(r events.AgentRecord, v string) { r.(*events.Heartbeat).Provider = v },
				"model":    func(r events.AgentRecord, v string) { r.(*events.Heartbeat).Model = v },
				"task_id":  func(r events.AgentRecord, v string) { r.(*events.Heartbeat).TaskID = v },
				"session":  func(r events.AgentRecord, v string) { r.(*events.Heartbeat).Session = v },
			},
		},
		{
			func() events.AgentRecord {
				return &events.CronSpec{At: events.At(when), Agent: "agent/1", Cron: "nightly", Schedule: "0 3 * * *", Provider: "p"}
			},
			map[string]func(events.AgentRecord, string){
				"cron":     func(r events.AgentRecord, v string) { r.(*events.CronSpec).Cron = v },
				"provider": func(r events.AgentRecord, v string) { r.(*events.CronSpec).Provider = v },
			},
		},
		{
			func() events.AgentRecord {
				return &events.CronRun{At: events.At(when), Agent: "agent/1", Cron: "nightly", ScheduledAt: events.At(when), Status: events.CronOK, Provider: "p"}
			},
			map[string]func(events.AgentRecord, string){
				"cron":     func(r events.AgentRecord, v string) { r.(*events.CronRun).Cron = v },
				"provider": func(r events.AgentRecord, v string) { r.(*events.CronRun).Provider = v },
			},
		},
		{
			func() events.AgentRecord {
				return &events.Write{At: events.At(when), Agent: "agent/1", Key: "memory/notes.md", Provider: "p"}
			},
			map[string]func(events.AgentRecord, string){
				"key":      func(r events.AgentRecord, v string) { r.(*events.Write).Key = v },
				"provider": func(r events.AgentRecord, v string) { r.(*events.Write).Provider = v },
			},
		},
		{
			func() events.AgentRecord {
				return &events.Task{ID: "t-1", At: events.At(when), Agent: "agent/1", Provider: "p", Kind: "summarise"}
			},
			map[string]func(events.AgentRecord, string){
				"id":       func(r events.AgentRecord, v string) { r.(*events.Task).ID = v },
				"provider": func(r events.AgentRecord, v string) { r.(*events.Task).Provider = v },
				"kind":     func(r events.AgentRecord, v string) { r.(*events.Task).Kind = v },
			},
		},
	}
}

// TestAgentRecordsPassOneGate: every identifier of every record an agent
// sends is refused, naming the field, when it is not valid UTF-8 (which
// once panicked the recovery service in a metric label, at every restart),
// holds a control character, is too long or holds a credential.
func TestAgentRecordsPassOneGate(t *testing.T) {
	bad := []struct{ name, value, problem string }{
		{"invalid UTF-8", "open\xffai", "not valid UTF-8"},
		{"a newline", "open\nai", "control character"},
		{"a C1 control", "open\u0085ai", "control character"},
		{"too long", strings.Repeat("p", events.MaxNameBytes+1), "exceed the limit"},
		{"an API key", "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "looks like a credential"},
	}
	for _, tt := range agentRecords() {
		name := tt.rec().SchemaName()
		if err := tt.rec().Validate(); err != nil {
			t.Fatalf("%s: the valid record is refused: %v", name, err)
		}
		for field, set := range tt.fields {
			for _, b := range bad {
				t.Run(name+" "+field+" "+b.name, func(t *testing.T) {
					r := tt.rec()
					set(r, b.value)
					data, h, err := events.Encode(r)
					if err == nil {
						_, err = events.Decode(events.ContractTypes().SubjectFamily(name)[:len(events.ContractTypes().SubjectFamily(name))-1]+"x."+events.Token(r.RecordAgent()), h, data)
					}
					var fe *events.FieldError
					if !errors.As(err, &fe) || fe.Field != field || !strings.Contains(fe.Problem, b.problem) {
						t.Fatalf("got %v, want a field error on %q saying %q", err, field, b.problem)
					}
					if strings.Contains(err.Error(), "AbCdEfGh") {
						t.Fatalf("the error repeats the credential: %v", err)
					}
				})
			}
		}
	}
}

// TestAgentRecordOnAnotherAgentsSubject: the subject is the identity. A
// record of every agent-sent type whose payload names agent b, published
// on agent a's subject, is refused with ErrWrongAgent; on b's own subject
// it is read.
func TestAgentRecordOnAnotherAgentsSubject(t *testing.T) {
	for _, tt := range agentRecords() {
		r := tt.rec()
		name := r.SchemaName()
		t.Run(name, func(t *testing.T) {
			data, h, err := events.Encode(r)
			if err != nil {
				t.Fatal(err)
			}
			prefix := strings.TrimSuffix(events.ContractTypes().SubjectFamily(name), ">")
			own := prefix + "p." + events.Token(r.RecordAgent())
			if name == events.SchemaBoundary || name == events.SchemaHeartbeat || name == events.SchemaCronSpec ||
				name == events.SchemaCronRun || name == events.SchemaWrite {
				own = prefix + events.Token(r.RecordAgent())
			}
			if _, err := events.Decode(own, h, data); err != nil {
				t.Fatalf("on its own subject %s: %v", own, err)
			}
			other := own[:strings.LastIndexByte(own, '.')+1] + "a"
			_, err = events.Decode(other, h, data)
			if !errors.Is(err, events.ErrWrongAgent) {
				t.Fatalf("on %s: got %v, want ErrWrongAgent", other, err)
			}
			// Without headers the subject picks the type; the check holds.
			if _, err := events.Decode(other, nil, data); !errors.Is(err, events.ErrWrongAgent) {
				t.Fatalf("on %s without headers: got %v, want ErrWrongAgent", other, err)
			}
		})
	}
}
