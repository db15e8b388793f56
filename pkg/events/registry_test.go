package events_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// headerless is what a foreign client publishes: a bare msgpack map with
// the contract's keys, no Failbus-Schema, no Content-Type.
func headerless(t *testing.T, v map[string]any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHeaderlessMessageIsItsSubjectsType: CONTRACT.md "On the bus" — a
// message without a schema header is read as its subject's type, on every
// subject that carries one.
func TestHeaderlessMessageIsItsSubjectsType(t *testing.T) {
	cases := []struct {
		subject string
		fields  map[string]any
		check   func(t *testing.T, m events.Message)
	}{
		{"failbus.outcome.openai.bot", map[string]any{"id": "o1", "agent": "bot", "provider": "openai", "status": 429, "at": int64(1795955445123)},
			func(t *testing.T, m events.Message) {
				if o := m.(*events.Outcome); o.Status != 429 || o.At.UnixMilli() != 1795955445123 {
					t.Errorf("outcome = %+v", o)
				}
			}},
		{"failbus.segment.bot", map[string]any{"agent": "bot", "session": "s", "segment": 3, "reason": "compaction"},
			func(t *testing.T, m events.Message) {
				if b := m.(*events.Boundary); b.Segment != 3 || b.Session != "s" {
					t.Errorf("boundary = %+v", b)
				}
			}},
		{"failbus.notify.normal", map[string]any{"dedupe_key": "k1", "severity": "normal", "title": "t", "labels": map[string]string{"a": "b"}},
			func(t *testing.T, m events.Message) {
				if n := m.(*events.Notification); n.DedupeKey != "k1" || n.Labels["a"] != "b" {
					t.Errorf("notification = %+v", n)
				}
			}},
		{"failbus.decision.bot", map[string]any{"outcome_id": "o1", "agent": "bot", "action": "retry", "delay_ms": 1500},
			func(t *testing.T, m events.Message) {
				if d := m.(*events.Decision); d.DelayMS != 1500 {
					t.Errorf("decision = %+v", d)
				}
			}},
		{"failbus.retry.due.bot", map[string]any{"retry_id": "r1", "outcome_id": "o1", "agent": "bot", "retry": 2, "due_at": "2026-11-29T12:30:45.123Z"},
			func(t *testing.T, m events.Message) {
				if r := m.(*events.RetryDue); r.Retry != 2 || r.DueAt.IsZero() {
					t.Errorf("retry due = %+v", r)
				}
			}},
		{"failbus.classified.openai.rate_limit", map[string]any{"outcome_id": "o1", "class": "rate_limit", "rule": "r"},
			func(t *testing.T, m events.Message) {
				if c := m.(*events.Classification); c.Class != events.ClassRateLimit {
					t.Errorf("classification = %+v", c)
				}
			}},
		{"failbus.health.openai", map[string]any{"provider": "openai", "state": "outage"},
			func(t *testing.T, m events.Message) {
				if h := m.(*events.Health); h.State != events.HealthOutage {
					t.Errorf("health = %+v", h)
				}
			}},
		{"failbus.dlq.classifier", map[string]any{"service": "classifier", "reason": "bad", "data": []byte{1}},
			func(t *testing.T, m events.Message) {
				if d := m.(*events.DeadLetter); d.Reason != "bad" {
					t.Errorf("dead letter = %+v", d)
				}
			}},
		// The recovery records agents write (CONTRACT.md § Recovery), and
		// what the bus sends back.
		{"failbus.heartbeat.bot", map[string]any{"agent": "bot", "subagent": "sa-1", "provider": "openai", "task_id": "t1", "status": "running", "interval_ms": 5000, "at": int64(1795955445123)},
			func(t *testing.T, m events.Message) {
				if h := m.(*events.Heartbeat); h.Subagent != "sa-1" || h.Interval().Milliseconds() != 5000 || h.State() != events.HeartbeatRunning || h.At.UnixMilli() != 1795955445123 {
					t.Errorf("heartbeat = %+v", h)
				}
			}},
		{"failbus.cron.spec.bot", map[string]any{"agent": "bot", "cron": "nightly", "schedule": "0 3 * * *", "timezone": "Europe/Berlin", "catchup": "all", "catchup_window": "2h"},
			func(t *testing.T, m events.Message) {
				if c := m.(*events.CronSpec); c.Cron != "nightly" || c.CatchupMode() != events.CatchupAll || c.CatchupWindow.Std().Hours() != 2 {
					t.Errorf("cron spec = %+v", c)
				}
			}},
		{"failbus.cron.run.bot", map[string]any{"agent": "bot", "cron": "nightly", "scheduled_at": "2026-11-29T03:00:00Z", "status": "ok"},
			func(t *testing.T, m events.Message) {
				if c := m.(*events.CronRun); c.Status != events.CronOK || c.ScheduledAt.Hour() != 3 {
					t.Errorf("cron run = %+v", c)
				}
			}},
		{"failbus.write.bot", map[string]any{"agent": "bot", "key": "memory/today.md", "ok": false, "error": "fetch failed"},
			func(t *testing.T, m events.Message) {
				if w := m.(*events.Write); w.Key != "memory/today.md" || w.OK || w.Error != "fetch failed" {
					t.Errorf("write = %+v", w)
				}
			}},
		{"failbus.task.openai.bot", map[string]any{"id": "t1", "agent": "bot", "provider": "openai", "kind": "summarize", "payload": map[string]any{"doc": 7}},
			func(t *testing.T, m events.Message) {
				if k := m.(*events.Task); k.ID != "t1" || k.Kind != "summarize" || len(k.Payload) == 0 {
					t.Errorf("task = %+v", k)
				}
			}},
		{"failbus.dispatch.bot", map[string]any{"task_id": "t1", "attempt": 1, "agent": "bot", "reason": "submitted"},
			func(t *testing.T, m events.Message) {
				if d := m.(*events.Dispatch); d.TaskID != "t1" || d.Attempt != 1 {
					t.Errorf("dispatch = %+v", d)
				}
			}},
		{"failbus.control.bot", map[string]any{"agent": "bot", "action": "probe", "provider": "openai"},
			func(t *testing.T, m events.Message) {
				if c := m.(*events.Control); c.Action != events.ControlProbe || c.Provider != "openai" {
					t.Errorf("control = %+v", c)
				}
			}},
		{"failbus.recovery.openai", map[string]any{"recovery_id": "openai:1795955445123", "provider": "openai", "step": "confirm"},
			func(t *testing.T, m events.Message) {
				if r := m.(*events.Recovery); r.Step != events.StepConfirm {
					t.Errorf("recovery = %+v", r)
				}
			}},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		t.Run(c.subject, func(t *testing.T) {
			want := events.SubjectSchema(c.subject)
			if want == "" {
				t.Fatalf("subject %s carries no type", c.subject)
			}
			seen[want] = true
			data := headerless(t, c.fields)
			for _, h := range []nats.Header{nil, {}, {"Nats-Msg-Id": {"x"}}} {
				m, err := events.Decode(c.subject, h, data)
				if err != nil {
					t.Fatalf("header %v: %v", h, err)
				}
				if m.SchemaName() != want {
					t.Fatalf("decoded a %s, want %s", m.SchemaName(), want)
				}
				c.check(t, m)
			}
			// The same payload with its own schema header decodes the same.
			m, err := events.Decode(c.subject, nats.Header{events.HeaderSchema: {want + "/1"}}, data)
			if err != nil || m.SchemaName() != want {
				t.Fatalf("with its own header: %v, %v", m, err)
			}
		})
	}
	for _, s := range events.ContractTypes().Schemas() {
		if strings.HasPrefix(s, "test_") {
			continue // registered by TestRegisterARecordTypeFromOutside, in whatever order the tests run
		}
		if events.ContractTypes().SubjectFamily(s) != "" && !seen[s] {
			t.Errorf("schema %s has a subject but no case here", s)
		}
	}
}

// TestHeaderNamingAnotherTypeIsRefused: a schema header that does not
// belong on the subject is an error naming both types (a service
// dead-letters it with that reason), never read as the subject's type.
func TestHeaderNamingAnotherTypeIsRefused(t *testing.T) {
	cases := []struct {
		subject, header string
		data            map[string]any
	}{
		{"failbus.outcome.openai.bot", "decision/1", map[string]any{"outcome_id": "o1", "agent": "bot", "action": "retry"}},
		{"failbus.notify.normal", "outcome/1", map[string]any{"id": "o1", "agent": "bot", "provider": "openai"}},
		{"failbus.segment.bot", "notification", map[string]any{"dedupe_key": "k", "severity": "normal"}},
		{"failbus.retry.due.bot", "outcome/1", map[string]any{"id": "o1", "agent": "bot", "provider": "openai"}},
	}
	for _, c := range cases {
		t.Run(c.subject+" "+c.header, func(t *testing.T) {
			m, err := events.Decode(c.subject, nats.Header{events.HeaderSchema: {c.header}}, headerless(t, c.data))
			if !errors.Is(err, events.ErrSchemaMismatch) {
				t.Fatalf("Decode = %v, %v; want ErrSchemaMismatch", m, err)
			}
			name, _, _ := events.ParseSchemaHeader(c.header)
			for _, want := range []string{name, c.subject, events.SubjectSchema(c.subject)} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
		})
	}
	// DecodeAs refuses a message of another type on an untyped subject too.
	data, h, err := events.Encode(&events.Health{Provider: "p", State: events.HealthOutage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.DecodeAs[*events.Outcome]("custom.subject", h, data); !errors.Is(err, events.ErrSchemaMismatch) {
		t.Fatalf("DecodeAs[Outcome] of a health record: %v", err)
	}
}

// TestSubjectWithoutTypeNeedsHeader: outside the typed families the header
// decides, and without one there is nothing to decode as.
func TestSubjectWithoutTypeNeedsHeader(t *testing.T) {
	data := headerless(t, map[string]any{"id": "o1", "agent": "bot", "provider": "openai"})
	for _, subject := range []string{"", "failbus.retry.ledger.k", "failbus.audit.notifier.sent", "failbus.outcome", "other.outcome.x"} {
		if _, err := events.Decode(subject, nil, data); !errors.Is(err, events.ErrNotFailbus) {
			t.Errorf("%q without header: %v, want ErrNotFailbus", subject, err)
		}
		m, err := events.Decode(subject, nats.Header{events.HeaderSchema: {"outcome/1"}}, data)
		if err != nil {
			t.Errorf("%q with header: %v", subject, err)
		} else if _, ok := m.(*events.Outcome); !ok {
			t.Errorf("%q with header: %T", subject, m)
		}
	}
}

// TestSubjectTypeTable: every subject builder lands in the family of its
// type, and the families do not overlap.
func TestSubjectTypeTable(t *testing.T) {
	built := map[string]string{
		events.OutcomeSubject("a.b", "c d"):         events.SchemaOutcome,
		events.SegmentSubject("bot"):                events.SchemaBoundary,
		events.ClassifiedSubject("p", "rate_limit"): events.SchemaClassification,
		events.DecisionSubject("bot"):               events.SchemaDecision,
		events.RetryDueSubject("bot"):               events.SchemaRetryDue,
		events.HealthSubject("p"):                   events.SchemaHealth,
		events.NotifySubject("critical"):            events.SchemaNotification,
		events.DLQSubject("scheduler"):              events.SchemaDeadLetter,
		events.RetryScheduleSubject("bot", "r"):     "",
		events.RetryLedgerSubject("k"):              "",
		events.RetryStartedSubject("bot"):           "",
		events.RetryCancelSubject("bot"):            "",
		events.AuditSubject("notifier", "sent"):     "",
	}
	for subject, want := range built {
		if got := events.SubjectSchema(subject); got != want {
			t.Errorf("SubjectSchema(%s) = %q, want %q", subject, got, want)
		}
	}
	schemas := events.ContractTypes().Schemas()
	for i, a := range schemas {
		if events.ContractTypes().New(a) == nil || events.ContractTypes().New(a).SchemaName() != a {
			t.Errorf("New(%q) does not make a %s", a, a)
		}
		for _, b := range schemas[i+1:] {
			fa, fb := events.ContractTypes().SubjectFamily(a), events.ContractTypes().SubjectFamily(b)
			if fa != "" && fb != "" && events.SubjectsCollide(fa, fb) {
				t.Errorf("families of %s (%s) and %s (%s) overlap", a, fa, b, fb)
			}
		}
	}
}

// testRecord is a record type registered from outside the table, as a
// service registers its own records.
type testRecord struct {
	Name string `msgpack:"name" json:"name"`
}

func (*testRecord) SchemaName() string { return "test_record" }
func (r *testRecord) Validate() error {
	if r.Name == "" {
		return &events.FieldError{Field: "name", Problem: "required"}
	}
	return nil
}

type testAudit struct{ testRecord }

func (*testAudit) SchemaName() string { return "test_audit" }

// TestATableWithRecordTypesFromOutside: a type in a table built with
// NewTypes decodes by its header anywhere and, without one, on its family
// or its one subject; the contract's own functions do not know it; a
// schema listed twice or overlapping subjects are refused at once.
func TestATableWithRecordTypesFromOutside(t *testing.T) {
	types := events.NewTypes(
		events.WireType{Schema: "test_record", Subjects: "failbus.test.records.>", New: func() events.Message { return &testRecord{} }},
		events.WireType{Schema: "test_audit", Subjects: "failbus.test.audit.one", New: func() events.Message { return &testAudit{} }},
	)
	data := headerless(t, map[string]any{"name": "n1"})
	for _, subject := range []string{"failbus.test.records.a.b", "failbus.test.audit.one"} {
		m, err := types.Decode(subject, nil, data)
		if err != nil {
			t.Fatalf("header-less on %s: %v", subject, err)
		}
		if m.SchemaName() != types.SubjectSchema(subject) {
			t.Errorf("%s decoded as %s, want %s", subject, m.SchemaName(), types.SubjectSchema(subject))
		}
		if _, err := events.Decode(subject, nil, data); !errors.Is(err, events.ErrNotFailbus) {
			t.Errorf("the contract's Decode on %s: %v, want ErrNotFailbus", subject, err)
		}
	}
	if got := types.SubjectSchema("failbus.test.audit.two"); got != "" {
		t.Errorf("a neighbour of a one-subject type reads as %q", got)
	}
	if got := types.SubjectSchema("failbus.outcome.openai.bot"); got != events.SchemaOutcome {
		t.Errorf("the table lost the contract's types: an outcome subject reads as %q", got)
	}
	b, err := types.ToJSON("failbus.other", nats.Header{events.HeaderSchema: {"test_record/1"}}, data)
	if err != nil || string(b) != `{"name":"n1"}` {
		t.Errorf("by header on another subject: %s %v", b, err)
	}
	for name, w := range map[string]events.WireType{
		"the same schema twice":     {Schema: "test_record", New: func() events.Message { return &testRecord{} }},
		"a family inside another's": {Schema: "test_other", Subjects: "failbus.test.records.x.>", New: func() events.Message { return &testOther{} }},
		"a contract family":         {Schema: "test_other", Subjects: "failbus.outcome.x", New: func() events.Message { return &testOther{} }},
		"a contract schema":         {Schema: events.SchemaOutcome, New: func() events.Message { return &events.Outcome{} }},
		"no constructor":            {Schema: "test_other"},
		"a constructor of another":  {Schema: "test_other", New: func() events.Message { return &testRecord{} }},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewTypes with %s did not panic", name)
				}
			}()
			events.NewTypes(events.WireType{Schema: "test_record", Subjects: "failbus.test.records.>", New: func() events.Message { return &testRecord{} }}, w)
		}()
	}
}

// TestDecodeAsARecordTypeOfTheCaller: DecodeAs reads a type no table
// knows when the caller names it — by header or without one — and refuses
// a header naming another type, a subject that carries a contract type,
// and, for an agent's record, a payload naming another agent than the
// subject's.
func TestDecodeAsARecordTypeOfTheCaller(t *testing.T) {
	data := headerless(t, map[string]any{"name": "n1"})
	for _, h := range []nats.Header{nil, {events.HeaderSchema: {"test_record/1"}}} {
		r, err := events.DecodeAs[*testRecord]("failbus.test.records.a", h, data)
		if err != nil || r.Name != "n1" {
			t.Errorf("header %v: %+v %v", h, r, err)
		}
	}
	if _, err := events.DecodeAs[*testRecord]("failbus.test.records.a", nats.Header{events.HeaderSchema: {"test_audit/1"}}, data); !errors.Is(err, events.ErrSchemaMismatch) {
		t.Errorf("a header naming another type: %v, want ErrSchemaMismatch", err)
	}
	if _, err := events.DecodeAs[*testRecord]("failbus.outcome.openai.bot", nil, data); !errors.Is(err, events.ErrSchemaMismatch) {
		t.Errorf("on an outcome subject: %v, want ErrSchemaMismatch", err)
	}
	if _, err := events.DecodeAs[*testRecord]("failbus.test.records.a", nil, headerless(t, map[string]any{})); err == nil {
		t.Error("an invalid record decoded")
	}
	var fe *events.FieldError
	if _, err := events.DecodeAs[*testRecord]("failbus.test.records.a", nil, headerless(t, map[string]any{"name": 5})); !errors.As(err, &fe) || fe.Field != "name" {
		t.Errorf("a number for a string: %v, want a field error naming name", err)
	}
	mine := headerless(t, map[string]any{"name": "n1", "agent": "a"})
	if _, err := events.DecodeAs[*testAgentRecord]("failbus.test.marks.a", nil, mine); err != nil {
		t.Errorf("agent a's record on a's subject: %v", err)
	}
	if _, err := events.DecodeAs[*testAgentRecord]("failbus.test.marks.b", nil, mine); !errors.Is(err, events.ErrWrongAgent) {
		t.Errorf("agent a's record on b's subject: %v, want ErrWrongAgent", err)
	}
}

type testAgentRecord struct {
	testRecord
	Agent string `msgpack:"agent" json:"agent"`
}

func (*testAgentRecord) SchemaName() string    { return "test_agent_record" }
func (r *testAgentRecord) RecordAgent() string { return r.Agent }

type testOther struct{ testRecord }

func (*testOther) SchemaName() string { return "test_other" }
