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

var when = time.Date(2026, 11, 29, 12, 30, 45, 123_000_000, time.UTC)

func sample() *events.Outcome {
	return &events.Outcome{
		ID: "o-1", At: events.At(when), Agent: "agent/1", Session: "s", Segment: 2, Turn: 3, Step: 4,
		Provider: "my-gateway", Model: "m", Profile: "p", Status: 400, Body: "",
		Headers: map[string]string{"retry-after": "3"}, UpstreamCode: "CONTEXT_WINDOW_EXCEEDED",
		RequestTokens: 41000, ContextWindow: 256000, MaxOutputTokens: 8192, Origin: &events.Origin{Kind: "cron", Name: "nightly"},
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	msgs := []events.Message{
		sample(),
		&events.Classification{OutcomeID: "o-1", Class: events.ClassServerError, Retryable: true, Rule: "r", Evidence: []string{"e"}, Overruled: events.ClassContextOverflow, Hints: &events.RetryHints{AfterMS: 634, Source: "body"}},
		&events.Decision{OutcomeID: "o-1", Agent: "a", Action: events.ActionRetry, DelayMS: 1500, DueAt: events.At(when), Retry: 2, RetryID: "r-1"},
		&events.RetryDue{RetryID: "r-1", OutcomeID: "o-1", Agent: "a", Retry: 1, DueAt: events.At(when)},
		&events.Health{At: events.At(when), Provider: "p", State: events.HealthOutage, Reason: "all profiles"},
		&events.Notification{DedupeKey: "k", Severity: events.SeverityCritical, Title: "t", Text: "x", Labels: map[string]string{"a": "b"}},
		&events.Boundary{At: events.At(when), Agent: "a", Session: "s", Segment: 3, Reason: "compaction"},
		&events.DeadLetter{At: events.At(when), Service: "classifier", Reason: "bad", Subject: "failbus.outcome.x.y", Data: []byte{0xc1}},
	}
	for _, m := range msgs {
		t.Run(m.SchemaName(), func(t *testing.T) {
			data, h, err := events.Encode(m)
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Get(events.HeaderSchema); got != m.SchemaName()+"/1" {
				t.Fatalf("schema header = %q", got)
			}
			if got := h.Get(events.HeaderContentType); got != events.ContentTypeMsgpack {
				t.Fatalf("content type = %q", got)
			}
			back, err := events.Decode(subjectOf(t, m), h, data)
			if err != nil {
				t.Fatal(err)
			}
			a, _ := json.Marshal(m)
			b, _ := json.Marshal(back)
			if string(a) != string(b) {
				t.Fatalf("round trip changed the message:\n%s\n%s", a, b)
			}
		})
	}
}

// subjectOf is a concrete subject of the family that carries schema.
// subjectOf is a subject that carries m: for an agent's own record, one
// that ends with its agent (the subject is the identity).
func subjectOf(t *testing.T, m events.Message) string {
	t.Helper()
	fam := events.ContractTypes().SubjectFamily(m.SchemaName())
	if fam == "" {
		t.Fatalf("no subject carries %s", m.SchemaName())
	}
	if a, ok := m.(events.AgentRecord); ok {
		return strings.TrimSuffix(fam, ">") + "x." + events.Token(a.RecordAgent())
	}
	return strings.TrimSuffix(fam, ">") + "x.y"
}

func TestTimeShapes(t *testing.T) {
	want := when
	cases := []struct {
		name string
		at   any
	}{
		{"rfc3339 string", want.Format(time.RFC3339Nano)},
		{"rfc3339 with offset", want.In(time.FixedZone("x", 8*3600)).Format(time.RFC3339Nano)},
		{"epoch ms int64", want.UnixMilli()},
		{"epoch ms uint64", uint64(want.UnixMilli())},
		{"epoch ms as float", float64(want.UnixMilli())},
		{"epoch ms as digit string", "1795955445123"},
		{"msgpack timestamp", want},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data, err := msgpack.Marshal(map[string]any{"id": "x", "agent": "a", "provider": "p", "at": c.at})
			if err != nil {
				t.Fatal(err)
			}
			o, err := events.DecodeAs[*events.Outcome]("failbus.outcome.p.a", nil, data)
			if err != nil {
				t.Fatal(err)
			}
			if !o.At.Equal(want) {
				t.Fatalf("at = %v, want %v", o.At.Time, want)
			}
		})
	}
	// JSON: string and number.
	for _, js := range []string{`"2026-11-29T12:30:45.123Z"`, `1795955445123`, `"1795955445123"`} {
		var tm events.Time
		if err := json.Unmarshal([]byte(js), &tm); err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		if !tm.Equal(want) {
			t.Fatalf("%s decoded to %v", js, tm.Time)
		}
	}
}

func TestDecodeErrorsNameTheProblem(t *testing.T) {
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name  string
		h     nats.Header
		data  []byte
		field string // FieldError.Field, or "" when the error is not about one field
		text  string // substring of the error
	}{
		{"empty payload", nil, nil, "", "empty payload"},
		{"not msgpack", nil, []byte("hello world"), "", "not a msgpack map"},
		{"json instead of msgpack", nil, []byte(`{"id":"x"}`), "", "not a msgpack map"},
		{"no id", nil, enc(map[string]any{"agent": "a", "provider": "p"}), "id", "required"},
		{"no agent", nil, enc(map[string]any{"id": "x", "provider": "p"}), "agent", "required"},
		{"unreadable time", nil, enc(map[string]any{"id": "x", "agent": "a", "provider": "p", "at": "yesterday"}), "at", "neither RFC 3339"},
		{"time of wrong type", nil, enc(map[string]any{"id": "x", "agent": "a", "provider": "p", "at": []any{1}}), "at", ""},
		{"status of wrong type", nil, enc(map[string]any{"id": "x", "agent": "a", "provider": "p", "status": "boom"}), "status", "want an integer, got a string"},
		{"turn as a string", nil, enc(map[string]any{"id": "x", "agent": "a", "provider": "p", "turn": "3"}), "turn", `field "turn": want an integer, got a string`},
		{"ok as a number", nil, enc(map[string]any{"id": "x", "agent": "a", "provider": "p", "ok": 1}), "ok", "want true or false, got an integer"},
		{"model as a list", nil, enc(map[string]any{"id": "x", "agent": "a", "provider": "p", "model": []any{"gpt"}}), "model", "want a string, got a list"},
		{"bad refusal scope", nil, enc(map[string]any{"id": "x", "agent": "a", "provider": "p", "refusal_scope": "all"}), "refusal_scope", "increment or history"},
		{"negative output budget", nil, enc(map[string]any{"id": "x", "agent": "a", "provider": "p", "max_output_tokens": -1}), "max_output_tokens", "negative"},
		{"unknown schema", nats.Header{events.HeaderSchema: {"banana/1"}}, enc(map[string]any{"id": "x"}), "", "unknown schema"},
		{"future version", nats.Header{events.HeaderSchema: {"outcome/9"}}, enc(map[string]any{"id": "x"}), "", "newer than this reader"},
		{"wrong content type", nats.Header{events.HeaderContentType: {"application/json"}}, []byte(`{}`), "", "content type"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := events.Decode("failbus.outcome.p.a", c.h, c.data)
			if err == nil {
				t.Fatal("decoded without error")
			}
			var fe *events.FieldError
			if c.field != "" {
				if !errors.As(err, &fe) || fe.Field != c.field {
					t.Fatalf("error %q does not name field %q", err, c.field)
				}
			}
			if !strings.Contains(err.Error(), c.text) {
				t.Fatalf("error %q does not say %q", err, c.text)
			}
			if strings.Contains(err.Error(), "code=") || strings.Contains(err.Error(), "decoding") {
				t.Errorf("error %q speaks of msgpack's internals", err)
			}
		})
	}
}

func TestJSONOutcome(t *testing.T) {
	var o events.Outcome
	err := events.UnmarshalJSON([]byte(`{"id":"x","agent":"a","provider":"p","at":"nope"}`), &o)
	var fe *events.FieldError
	if !errors.As(err, &fe) || fe.Field != "at" {
		t.Fatalf("err = %v, want a FieldError on at", err)
	}
	err = events.UnmarshalJSON([]byte(`{"id":"x","agent":"a","provider":"p","status":"500"}`), &o)
	if !errors.As(err, &fe) || fe.Field != "status" {
		t.Fatalf("err = %v, want a FieldError on status", err)
	}
}

func TestSubjects(t *testing.T) {
	cases := []struct{ got, want string }{
		{events.OutcomeSubject("openai", "agent-1"), "failbus.outcome.openai.agent-1"},
		{events.OutcomeSubject("my.gateway", "team/agent 7"), "failbus.outcome.my_gateway.team_agent_7"},
		{events.ClassifiedSubject("x", events.ClassRateLimit), "failbus.classified.x.rate_limit"},
		{events.DecisionSubject("ä*>"), "failbus.decision.___"},
		{events.RetryDueSubject(""), "failbus.retry.due._"},
		{events.DLQSubject("classifier"), "failbus.dlq.classifier"},
		{events.SegmentKey("sess", 12), "sess#12"},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

func TestToJSONRendersTypedAndUntyped(t *testing.T) {
	data, h, err := events.Encode(sample())
	if err != nil {
		t.Fatal(err)
	}
	js, err := events.ToJSON("failbus.outcome.my-gateway.agent_1", h, data)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"at":"2026-11-29T12:30:45.123Z"`) {
		t.Fatalf("typed render: %s", js)
	}
	raw, _ := msgpack.Marshal(map[string]any{"free": "form", "n": 3})
	js, err = events.ToJSON("elsewhere.free", nats.Header{"X": {"y"}}, raw)
	if err != nil || !strings.Contains(string(js), `"free":"form"`) {
		t.Fatalf("untyped render: %s %v", js, err)
	}
	// Text is not the msgpack number its first byte encodes ('t' is 116).
	if js, err := events.ToJSON("elsewhere.free", nil, []byte("this is not msgpack")); err == nil {
		t.Errorf("text rendered as %s", js)
	}
	if js, err := events.ToJSON("elsewhere.free", nil, []byte(`{"id":"j"}`)); err != nil || string(js) != `{"id":"j"}` {
		t.Errorf("JSON rendered as %s, %v", js, err)
	}
}

func TestSubjectWithinAndCollide(t *testing.T) {
	tests := []struct {
		a, b            string
		within, collide bool
	}{
		{"failbus.outcome.x.y", "failbus.outcome.>", true, true},
		{"failbus.>", "failbus.outcome.>", false, true},
		{"failbus.outcome.*", "failbus.outcome.>", true, true},
		{"failbus.outcome.*.bot", "failbus.outcome.openai.*", false, true},
		{"failbus.outcome", "failbus.outcome.>", false, false},
		{"failbus.dlq.>", "failbus.outcome.>", false, false},
		{"a.b", "a.b", true, true},
	}
	for _, tt := range tests {
		if got := events.SubjectWithin(tt.a, tt.b); got != tt.within {
			t.Errorf("events.SubjectWithin(%s, %s) = %v", tt.a, tt.b, got)
		}
		if got := events.SubjectsCollide(tt.a, tt.b); got != tt.collide {
			t.Errorf("events.SubjectsCollide(%s, %s) = %v", tt.a, tt.b, got)
		}
	}
}
