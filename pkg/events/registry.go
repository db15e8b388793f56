package events

import (
	"fmt"
	"strconv"
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

// Lookups built from wireTypes (and Register).
var (
	typeBySchema = map[string]wireType{}
	// headerBySchema is each type's Failbus-Schema value at
	// CurrentVersion, built once: every message published carries it.
	headerBySchema = map[string]string{}
	// familyPrefixes are the subject families with their trailing '.'
	// ("failbus.outcome."), and the single subjects of types registered
	// for one subject, in table order.
	familyPrefixes []familyPrefix
)

type familyPrefix struct {
	prefix string
	schema string
	// exact is set for a single subject (no trailing '>'): only that
	// subject carries the type.
	exact bool
}

func init() {
	for _, t := range wireTypes {
		add(t)
	}
}

// add puts t into the lookups; it panics on a schema already there or a
// subject family that overlaps another type's.
func add(t wireType) {
	if t.schema == "" || t.zero == nil {
		panic("events: a wire type needs a schema name and a zero value")
	}
	if _, dup := typeBySchema[t.schema]; dup {
		panic(fmt.Sprintf("events: schema %q is in the type table twice", t.schema))
	}
	if z := t.zero(); z == nil || z.SchemaName() != t.schema {
		panic(fmt.Sprintf("events: the zero value of %q does not name that schema", t.schema))
	}
	if t.subjects != "" {
		for _, o := range typeBySchema {
			if o.subjects != "" && SubjectsCollide(o.subjects, t.subjects) {
				panic(fmt.Sprintf("events: subjects %q of %s overlap %q of %s", t.subjects, t.schema, o.subjects, o.schema))
			}
		}
	}
	typeBySchema[t.schema] = t
	headerBySchema[t.schema] = t.schema + "/" + strconv.Itoa(CurrentVersion)
	if t.subjects == "" {
		return
	}
	if strings.ContainsAny(t.subjects, "* ") {
		panic(fmt.Sprintf("events: subjects %q of %s must be a family \"<prefix>.>\" or one subject", t.subjects, t.schema))
	}
	if p, ok := strings.CutSuffix(t.subjects, ">"); ok {
		if !strings.HasSuffix(p, ".") {
			panic(fmt.Sprintf("events: subjects %q of %s must be a family \"<prefix>.>\" or one subject", t.subjects, t.schema))
		}
		familyPrefixes = append(familyPrefixes, familyPrefix{prefix: p, schema: t.schema})
		return
	}
	familyPrefixes = append(familyPrefixes, familyPrefix{prefix: t.subjects, schema: t.schema, exact: true})
}

// Register adds a record type that a package outside this one defines — a
// service's own records, such as the scheduler's retry ledger entries or
// the notifier's audit records — to the table, so Decode, ToJSON and every
// reader of the bus (tail, report) decode it like the contract's types:
// by its Failbus-Schema header, or, without one, by its subject. subjects
// is the family "<prefix>.>" that carries only this type, one subject, or
// "" for a type no subject carries alone. zero returns a new zero value.
//
// Call it from an init function only (the table is read without locks).
// It panics on a schema that is already registered and on subjects that
// overlap another type's: both are programming errors.
func Register(schema, subjects string, zero func() Message) {
	add(wireType{schema: schema, zero: zero, subjects: subjects})
	wireTypes = append(wireTypes, wireType{schema: schema, zero: zero, subjects: subjects})
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
		if f.exact {
			if subject == f.prefix {
				return f.schema
			}
			continue
		}
		if len(f.prefix) > n && len(subject) > len(f.prefix) && strings.HasPrefix(subject, f.prefix) {
			best, n = f.schema, len(f.prefix)
		}
	}
	return best
}

// SubjectFamily is the subject family ("failbus.outcome.>"), or the one
// subject, that carries the named schema, or "" when no subject carries it
// alone.
func SubjectFamily(schema string) string { return typeBySchema[schema].subjects }

// Schemas lists every schema name failbus knows, in table order.
func Schemas() []string {
	out := make([]string, len(wireTypes))
	for i, t := range wireTypes {
		out[i] = t.schema
	}
	return out
}
