package events

import (
	"fmt"
	"strings"
)

// A subject carries one type (CONTRACT.md "On the bus"). A message without a
// Failbus-Schema header is read as the current version of its subject's
// type, so a client in any language only publishes a msgpack map with the
// contract's keys; a header naming a type that does not belong on the
// subject is refused with that reason (a service dead-letters it).

// wireType is one failbus wire type: its schema name, its zero value, and
// the subjects that carry it.
type wireType struct {
	// schema is the type half of the Failbus-Schema header.
	schema string
	// zero returns a new zero value to decode into.
	zero func() Message
	// subjects is the subject family that carries the type, "<prefix>.>";
	// "" for a type no subject carries alone.
	subjects string
}

// wireTypes is the one table of failbus wire types and their subjects.
// Adding a type is one line here (and its struct, SchemaName and Validate).
// Families must not overlap: TestSubjectTypeTable checks it.
var wireTypes = []wireType{
	{SchemaOutcome, func() Message { return &Outcome{} }, OutcomePrefix + ".>"},
	{SchemaBoundary, func() Message { return &Boundary{} }, SegmentPrefix + ".>"},
	{SchemaClassification, func() Message { return &Classification{} }, ClassifiedPrefix + ".>"},
	{SchemaDecision, func() Message { return &Decision{} }, DecisionPrefix + ".>"},
	{SchemaRetryDue, func() Message { return &RetryDue{} }, RetryPrefix + ".due.>"},
	{SchemaHealth, func() Message { return &Health{} }, HealthPrefix + ".>"},
	{SchemaNotification, func() Message { return &Notification{} }, NotifyPrefix + ".>"},
	{SchemaDeadLetter, func() Message { return &DeadLetter{} }, DLQPrefix + ".>"},
	{SchemaHeartbeat, func() Message { return &Heartbeat{} }, HeartbeatPrefix + ".>"},
	{SchemaCronSpec, func() Message { return &CronSpec{} }, CronSpecPrefix + ".>"},
	{SchemaCronRun, func() Message { return &CronRun{} }, CronRunPrefix + ".>"},
	{SchemaWrite, func() Message { return &Write{} }, WritePrefix + ".>"},
	{SchemaTask, func() Message { return &Task{} }, TaskPrefix + ".>"},
	{SchemaDispatch, func() Message { return &Dispatch{} }, DispatchPrefix + ".>"},
	{SchemaControl, func() Message { return &Control{} }, ControlPrefix + ".>"},
	{SchemaRecovery, func() Message { return &Recovery{} }, RecoveryPrefix + ".>"},
}

// Lookups built once from wireTypes.
var (
	typeBySchema = map[string]wireType{}
	// familyPrefixes are the subject families with their trailing '.'
	// ("failbus.outcome."), in table order.
	familyPrefixes []familyPrefix
)

type familyPrefix struct {
	prefix string
	schema string
}

func init() {
	for _, t := range wireTypes {
		if _, dup := typeBySchema[t.schema]; dup {
			panic(fmt.Sprintf("events: schema %q is in the type table twice", t.schema))
		}
		typeBySchema[t.schema] = t
		if t.subjects == "" {
			continue
		}
		p, ok := strings.CutSuffix(t.subjects, ">")
		if !ok || !strings.HasSuffix(p, ".") {
			panic(fmt.Sprintf("events: subjects %q of %s must be a family \"<prefix>.>\"", t.subjects, t.schema))
		}
		familyPrefixes = append(familyPrefixes, familyPrefix{prefix: p, schema: t.schema})
	}
}

// New returns a zero value of the named schema, or nil when the name is
// unknown.
func New(schema string) Message {
	t, ok := typeBySchema[schema]
	if !ok {
		return nil
	}
	return t.zero()
}

// SubjectSchema is the schema of the type subject carries ("outcome" for
// failbus.outcome.openai.bot), or "" for a subject without a type of its
// own (retry ledger and schedules, audit records, anything outside
// failbus). The longest matching family wins.
func SubjectSchema(subject string) string {
	best, n := "", 0
	for _, f := range familyPrefixes {
		if len(f.prefix) > n && len(subject) > len(f.prefix) && strings.HasPrefix(subject, f.prefix) {
			best, n = f.schema, len(f.prefix)
		}
	}
	return best
}

// SubjectFamily is the subject family ("failbus.outcome.>") that carries the
// named schema, or "" when no subject carries it alone.
func SubjectFamily(schema string) string { return typeBySchema[schema].subjects }

// Schemas lists every schema name failbus knows, in table order.
func Schemas() []string {
	out := make([]string, len(wireTypes))
	for i, t := range wireTypes {
		out[i] = t.schema
	}
	return out
}
