package decode

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/pkg/events"
)

func encode(t *testing.T, m events.Message) []byte {
	t.Helper()
	b, err := events.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecode(t *testing.T) {
	at := events.At(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	outcome := encode(t, &events.Outcome{ID: "o1", Agent: "bot", Provider: "openai", Status: 429, At: at})
	tests := []struct {
		name   string
		args   []string
		stdin  []byte
		code   int
		stdout string // must appear
		stderr string
	}{
		{"an outcome by its subject", []string{"--subject", "failbus.outcome.openai.bot"}, outcome, 0,
			`{"id":"o1","at":"2026-03-01T12:00:00.000Z","agent":"bot","provider":"openai","ok":false,"status":429}`, ""},
		{"a retry ledger entry by its subject", []string{"--subject", events.RetryLedgerSubject("b1")},
			encode(t, &scheduler.LedgerEntry{Record: retry.Record{RetryID: "r1", OutcomeID: "o1", Agent: "bot", Provider: "openai", PolicyKey: "k", Retry: 2}}),
			0, `"retry_id":"r1"`, ""},
		{"a notifier audit record by its subject", []string{"--subject", events.AuditSubject("notifier", delivery.AuditSent)},
			encode(t, &delivery.Audit{At: at, Kind: delivery.AuditSent, DedupeKey: "k", Request: "req-1", Sink: "ops"}),
			0, `"sink":"ops"`, ""},
		{"a retry schedule by --schema", []string{"--subject", events.RetryScheduleSubject("bot", "r1"), "--schema", events.SchemaRetryDue},
			encode(t, &events.RetryDue{RetryID: "r1", OutcomeID: "o1", Agent: "bot", Retry: 1, DueAt: at}), 0, `"due_at":"2026-03-01T12:00:00.000Z"`, ""},
		{"a dead letter with its payload decoded", []string{"--subject", events.DLQSubject("classifier")},
			encode(t, &events.DeadLetter{Service: "classifier", Reason: "r", Subject: "failbus.outcome.openai.bot", Data: outcome}),
			0, `"data":{"agent":"bot"`, ""},
		{"no subject: msgpack as JSON", nil, []byte{0x81, 0xa1, 'a', 0x01}, 0, `{"a":1}`, ""},
		{"not msgpack: shown, and an error", nil, []byte("hello"), 1, `"hello"`, "not msgpack"},
		{"the wrong type for the subject", []string{"--subject", "failbus.decision.bot"}, outcome, 1, `"id":"o1"`, "invalid decision"},
		{"an unknown schema", []string{"--schema", "nope"}, outcome, 2, "", `--schema "nope": unknown`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, bytes.NewReader(tc.stdin), &stdout, &stderr)
			if code != tc.code || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderr)
			}
		})
	}
}
