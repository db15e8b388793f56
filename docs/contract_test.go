package docs_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/internal/retrymark"
	"github.com/failbus/failbus/internal/service/refusals"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/storecheck"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

var update = flag.Bool("update", false, "rewrite the generated tables of CONTRACT.md from the code")

// A subject family of the contract table. Everything but pattern and
// writer is computed from the code: the subject from the events
// constructor, the stream and the readers from jetstream/, the keys from
// the Go type's tags.
type family struct {
	// pattern is the subject with <placeholders> for its tokens.
	pattern string
	// subject is pattern built by the pkg/events constructor with the
	// placeholders as names (each becomes _name_ as a token).
	subject string
	// schema is the Failbus-Schema name; "" for JSON request/reply.
	schema string
	// payload is a value of the Go type carried.
	payload any
	// msgID says how its Nats-Msg-Id is made ("" for a service's output,
	// whose id the service derives from its input, e.g.
	// msgid.Output).
	msgID string
	// writer says who publishes it.
	writer string
}

// families is every subject failbus uses. Adding a subject to pkg/events
// or a stream to jetstream/ without a line here fails
// TestContractTables.
func families() []family {
	return []family{
		{"failbus.outcome.<provider>.<agent>", events.OutcomeSubject("<provider>", "<agent>"), events.SchemaOutcome, events.Outcome{}, "`<id>`", "agents"},
		{"failbus.segment.<agent>", events.SegmentSubject("<agent>"), events.SchemaBoundary, events.Boundary{}, "`boundary:<agent>:<session>#<segment>`", "agents"},
		{"failbus.classified.<provider>.<class>", events.ClassifiedSubject("<provider>", "<class>"), events.SchemaClassification, events.Classification{}, "", "classifier"},
		{"failbus.decision.<agent>", events.DecisionSubject("<agent>"), events.SchemaDecision, events.Decision{}, "", "scheduler; refusal tiers (skip_provider, rerender)"},
		{"failbus.health.<provider>", events.HealthSubject("<provider>"), events.SchemaHealth, events.Health{}, "", "scheduler (fault scope)"},
		{"failbus.retry.ledger.<budget>", events.RetryLedgerSubject("<budget>"), scheduler.SchemaLedgerEntry, scheduler.LedgerEntry{}, "", "scheduler (one subject per retry budget)"},
		{"failbus.retry.sched.<agent>.<retry_id>", events.RetryScheduleSubject("<agent>", "<retry_id>"), events.SchemaRetryDue, events.RetryDue{}, "", "scheduler: a JetStream schedule (`Nats-Schedule: @at …`, `Nats-Schedule-Target: failbus.retry.due.<agent>`)"},
		{"failbus.retry.due.<agent>", events.RetryDueSubject("<agent>"), events.SchemaRetryDue, events.RetryDue{}, "none", "JetStream's scheduler, at the due time"},
		{"failbus.retry.started.<agent>", events.RetryStartedSubject("<agent>"), retrymark.SchemaStarted, retrymark.Mark{}, "`retry_started:<retry_id>`", "agents"},
		{"failbus.retry.cancel.<agent>", events.RetryCancelSubject("<agent>"), retrymark.SchemaCancel, retrymark.Mark{}, "`retry_cancel:<retry_id>`", "agents"},
		{"failbus.notify.<severity>", events.NotifySubject("<severity>"), events.SchemaNotification, events.Notification{}, "", "scheduler, refusal tiers, recovery, notifier (budget digest)"},
		{"failbus.audit.notifier.<kind>", events.AuditSubject("notifier", "<kind>"), delivery.SchemaAudit, delivery.Audit{}, "", "notifier (kind: " + strings.Join([]string{delivery.AuditSent, delivery.AuditDeduped, delivery.AuditHeld, delivery.AuditFailed, delivery.AuditUnrouted}, ", ") + ")"},
		{"failbus.audit.scheduler.policy", scheduler.PolicyAuditSubject(), scheduler.SchemaPolicyAudit, scheduler.PolicyAudit{}, "", "scheduler (policy reloads)"},
		{"failbus.heartbeat.<agent>", events.HeartbeatSubject("<agent>"), events.SchemaHeartbeat, events.Heartbeat{}, "optional; `pkg/agent`: `hb:<agent>:<subagent>:<at, ns>:<status>`", "agents"},
		{"failbus.cron.spec.<agent>", events.CronSpecSubject("<agent>"), events.SchemaCronSpec, events.CronSpec{}, "optional; `pkg/agent`: `cron-spec:<agent>:<cron>:<at, ns>`", "agents"},
		{"failbus.cron.run.<agent>", events.CronRunSubject("<agent>"), events.SchemaCronRun, events.CronRun{}, "optional; `pkg/agent`: `cron-run:<agent>:<cron>:<scheduled_at, ms>:<status>`", "agents"},
		{"failbus.write.<agent>", events.WriteSubject("<agent>"), events.SchemaWrite, events.Write{}, "optional; `pkg/agent`: `write:<agent>:<key>:<at, ns>`", "agents"},
		{"failbus.task.<provider>.<agent>", events.TaskSubject("<provider>", "<agent>"), events.SchemaTask, events.Task{}, "`<id>`", "agents"},
		{"failbus.dispatch.<agent>", events.DispatchSubject("<agent>"), events.SchemaDispatch, events.Dispatch{}, "`recovery:dispatch:<task_id>:<attempt>`", "recovery"},
		{"failbus.control.<agent>", events.ControlSubject("<agent>"), events.SchemaControl, events.Control{}, "`recovery:kill:<agent>:<subagent>:<last heartbeat, ms>`, `recovery:cron:<agent>:<cron>:<scheduled_at, ms>`, `recovery:write:<agent>:<key>:<failed_at, ms>`, `recovery:<recovery_id>:probe:<n>`", "recovery"},
		{"failbus.recovery.<provider>", events.RecoverySubject("<provider>"), events.SchemaRecovery, events.Recovery{}, "`recovery:<recovery_id>:<step>`", "recovery"},
		{"failbus.dlq.<service>", events.DLQSubject("<service>"), events.SchemaDeadLetter, events.DeadLetter{}, "`" + strings.Replace(msgid.DeadLetter("<service>", "<stream>", 0), ":0", ":<seq>", 1) + "`", "every service"},
		{"failbus.storecheck.<service>", storecheck.Subject("<service>"), storecheck.Schema, storecheck.Record{}, "`storecheck:<service>:<at, ns>`", "every service, while idle: a write of a page and a bit that shows it can store (/healthz); the latest per service is kept"},
		{events.RefusalRouteSubject, events.RefusalRouteSubject, "", refusals.RouteRequest{}, "—", "agents ask, the refusal tiers answer (micro service `" + refusals.ServiceName + "`)"},
	}
}

// asToken is pattern with each <placeholder> as the events constructors
// write it: a token "_placeholder_".
func asToken(pattern string) string {
	return strings.NewReplacer("<", "_", ">", "_").Replace(pattern)
}

// streamOf is the topology stream holding subject, "" for none.
func streamOf(subject string) string {
	for _, s := range topology.Streams() {
		for _, p := range s.Subjects {
			if events.SubjectWithin(subject, p) {
				return s.Name
			}
		}
	}
	return ""
}

// readers are the topology's durable consumers that read subject.
func readers(subject string) []string {
	var out []string
	for _, name := range topology.Consumers() {
		stream, cfg, _ := topology.Consumer(name)
		filters := append([]string{cfg.FilterSubject}, cfg.FilterSubjects...)
		if slices.ContainsFunc(filters, func(f string) bool { return f != "" && events.SubjectsCollide(subject, f) }) ||
			cfg.FilterSubject == "" && len(cfg.FilterSubjects) == 0 && streamOf(subject) == stream {
			out = append(out, "`"+name+"`")
		}
	}
	return out
}

// keys lists the wire keys of a Go type (msgpack tags, else json tags),
// embedded structs flattened, in declaration order.
func keys(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("msgpack")
		if tag == "" {
			tag = f.Tag.Get("json")
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && (name == "" || tag == "") {
			out = append(out, keys(f.Type)...)
			continue
		}
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

func typeName(v any) string {
	t := reflect.TypeOf(v)
	return strings.TrimPrefix(t.String(), "*")
}

// subjectTable renders the table of every subject.
func subjectTable() string {
	var b strings.Builder
	b.WriteString("| subject | stream | type (Go) | `Failbus-Schema` | `Nats-Msg-Id` | written by | read by (durable consumers) |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, f := range families() {
		stream, schema := streamOf(f.subject), "`"+f.schema+"/1`"
		if stream == "" {
			stream = "— (request/reply, JSON)"
		}
		if f.schema == "" {
			schema = "—"
		}
		msgID := f.msgID
		if msgID == "" {
			msgID = "deterministic, from the writer's input"
		}
		rd := strings.Join(readers(f.subject), ", ")
		if rd == "" {
			rd = "—"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s | %s |\n", f.pattern, stream, typeName(f.payload), schema, msgID, f.writer, rd)
	}
	return b.String()
}

// keyTable renders the wire keys of every type the subject table names,
// plus the route reply.
func keyTable() string {
	var b strings.Builder
	b.WriteString("| type (Go) | keys |\n|---|---|\n")
	seen := map[string]bool{}
	for _, v := range append(sliceOf(families()), events.RouteRecord{}, events.RouteSkip{}) {
		name := typeName(v)
		if seen[name] {
			continue
		}
		seen[name] = true
		ks := keys(reflect.TypeOf(v))
		for i, k := range ks {
			ks[i] = "`" + k + "`"
		}
		fmt.Fprintf(&b, "| %s | %s |\n", name, strings.Join(ks, ", "))
	}
	return b.String()
}

func sliceOf(fs []family) []any {
	out := make([]any, len(fs))
	for i, f := range fs {
		out[i] = f.payload
	}
	return out
}

// Generated regions of CONTRACT.md.
var generated = []struct {
	name   string
	render func() string
}{
	{"subjects", subjectTable},
	{"keys", keyTable},
}

const contractFile = "CONTRACT.md"

func region(doc []byte, name string) (start, end int, err error) {
	begin := []byte("<!-- generated:" + name + " -->\n")
	stop := []byte("<!-- end generated:" + name + " -->")
	i := bytes.Index(doc, begin)
	j := bytes.Index(doc, stop)
	if i < 0 || j < i {
		return 0, 0, fmt.Errorf("%s has no generated region %q", contractFile, name)
	}
	return i + len(begin), j, nil
}

// TestContractTables: the tables in CONTRACT.md are what the code says, and
// the code's subjects are all in them.
func TestContractTables(t *testing.T) {
	fams := families()
	schemas := map[string]bool{}
	covered := map[string]bool{}
	for _, f := range fams {
		if f.subject != asToken(f.pattern) {
			t.Errorf("pattern %s is built as %s by pkg/events", f.pattern, f.subject)
		}
		if got := events.SubjectSchema(f.subject); got != "" && got != f.schema {
			t.Errorf("%s carries %s (pkg/events), the table says %s", f.pattern, got, f.schema)
		}
		if m, ok := reflect.New(reflect.TypeOf(f.payload)).Interface().(events.Message); ok && f.schema != "" && m.SchemaName() != f.schema {
			t.Errorf("%s: %s's schema is %s, the table says %s", f.pattern, typeName(f.payload), m.SchemaName(), f.schema)
		}
		schemas[f.schema] = true
		if s := streamOf(f.subject); s != "" {
			covered[s] = true
		}
	}
	for _, s := range events.ContractTypes().Schemas() {
		if !schemas[s] {
			t.Errorf("schema %s (pkg/events) has no subject in the contract table", s)
		}
	}
	for _, s := range topology.Streams() {
		if !covered[s.Name] {
			t.Errorf("stream %s (jetstream/) holds no subject of the contract table", s.Name)
		}
	}

	doc, err := os.ReadFile(contractFile)
	if err != nil {
		t.Fatal(err)
	}
	out := doc
	for _, g := range generated {
		i, j, err := region(out, g.name)
		if err != nil {
			t.Fatal(err)
		}
		want := g.render()
		if string(out[i:j]) != want {
			if !*update {
				t.Errorf("%s: the %s table is not what the code says; run go test ./docs -run TestContractTables -update\nwant:\n%s", contractFile, g.name, want)
				continue
			}
			out = slices.Concat(out[:i], []byte(want), out[j:])
		}
	}
	if *update && !bytes.Equal(out, doc) {
		if err := os.WriteFile(contractFile, out, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote %s", contractFile)
	}
}
