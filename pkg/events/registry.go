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

// WireType is one record type of the bus: its schema name, a constructor
// of its zero value to decode into, and the subjects that carry it. The
// contract's types are built in; a service with records of its own (a
// retry ledger, audit records) describes them this way, and a reader of
// the whole bus puts them into one Types table with NewTypes.
type WireType struct {
	// Schema is the type half of the Failbus-Schema header.
	Schema string
	// Subjects is the subject family that carries the type, "<prefix>.>",
	// or one subject; "" for a type no subject carries alone.
	Subjects string
	// New returns a new zero value to decode into.
	New func() Message
}

// contractTypes is the table of the contract's wire types and their
// subjects. Adding a type is one line here (and its struct, SchemaName
// and Validate). Families must not overlap: NewTypes panics, and
// TestSubjectTypeTable checks it.
var contractTypes = []WireType{
	{SchemaOutcome, OutcomePrefix + ".>", func() Message { return &Outcome{} }},
	{SchemaBoundary, SegmentPrefix + ".>", func() Message { return &Boundary{} }},
	{SchemaClassification, ClassifiedPrefix + ".>", func() Message { return &Classification{} }},
	{SchemaDecision, DecisionPrefix + ".>", func() Message { return &Decision{} }},
	{SchemaRetryDue, RetryPrefix + ".due.>", func() Message { return &RetryDue{} }},
	{SchemaHealth, HealthPrefix + ".>", func() Message { return &Health{} }},
	{SchemaNotification, NotifyPrefix + ".>", func() Message { return &Notification{} }},
	{SchemaDeadLetter, DLQPrefix + ".>", func() Message { return &DeadLetter{} }},
	{SchemaHeartbeat, HeartbeatPrefix + ".>", func() Message { return &Heartbeat{} }},
	{SchemaCronSpec, CronSpecPrefix + ".>", func() Message { return &CronSpec{} }},
	{SchemaCronRun, CronRunPrefix + ".>", func() Message { return &CronRun{} }},
	{SchemaWrite, WritePrefix + ".>", func() Message { return &Write{} }},
	{SchemaTask, TaskPrefix + ".>", func() Message { return &Task{} }},
	{SchemaDispatch, DispatchPrefix + ".>", func() Message { return &Dispatch{} }},
	{SchemaControl, ControlPrefix + ".>", func() Message { return &Control{} }},
	{SchemaRecovery, RecoveryPrefix + ".>", func() Message { return &Recovery{} }},
}

// Types is a table of wire types: which schema a subject carries, and what
// to decode each schema into. It is built once and only read after, so it
// needs no lock. The package's own functions (Decode, ToJSON, New,
// SubjectSchema, …) read the contract's table; a reader of every record
// the services write (tail, report) reads one built with their types.
type Types struct {
	order    []WireType
	bySchema map[string]WireType
	// header is each type's Failbus-Schema value at CurrentVersion, built
	// once: every message published carries it.
	header map[string]string
	// families are the subject families with their trailing '.'
	// ("failbus.outcome."), and the single subjects of types carried by one
	// subject, in table order.
	families []familyPrefix
}

type familyPrefix struct {
	prefix string
	schema string
	// exact is set for a single subject (no trailing '>'): only that
	// subject carries the type.
	exact bool
}

// contract is the table of the contract's types: what Decode and the other
// package functions read.
var contract = NewTypes()

// ContractTypes is the table of the contract's types alone: what Decode,
// ToJSON and SubjectSchema read. A tool that lists or checks the
// contract's types reads it; a reader of every record the services write
// uses a table with theirs (NewTypes).
func ContractTypes() *Types { return contract }

// NewTypes is the contract's types and extra, in that order. It panics on
// a schema listed twice, a type without a schema or constructor, and
// subjects that overlap another type's: each is a programming error in a
// table written once, found by the first test that builds it.
func NewTypes(extra ...WireType) *Types {
	t := &Types{bySchema: map[string]WireType{}, header: map[string]string{}}
	for _, w := range contractTypes {
		t.add(w)
	}
	for _, w := range extra {
		t.add(w)
	}
	return t
}

// add puts w into the table.
func (t *Types) add(w WireType) {
	if w.Schema == "" || w.New == nil {
		panic("events: a wire type needs a schema name and a constructor")
	}
	if _, dup := t.bySchema[w.Schema]; dup {
		panic(fmt.Sprintf("events: schema %q is in the type table twice", w.Schema))
	}
	if z := w.New(); z == nil || z.SchemaName() != w.Schema {
		panic(fmt.Sprintf("events: the zero value of %q does not name that schema", w.Schema))
	}
	if w.Subjects != "" {
		for _, o := range t.order {
			if o.Subjects != "" && SubjectsCollide(o.Subjects, w.Subjects) {
				panic(fmt.Sprintf("events: subjects %q of %s overlap %q of %s", w.Subjects, w.Schema, o.Subjects, o.Schema))
			}
		}
	}
	t.order = append(t.order, w)
	t.bySchema[w.Schema] = w
	t.header[w.Schema] = w.Schema + "/" + strconv.Itoa(CurrentVersion)
	if w.Subjects == "" {
		return
	}
	if strings.ContainsAny(w.Subjects, "* ") {
		panic(fmt.Sprintf("events: subjects %q of %s must be a family \"<prefix>.>\" or one subject", w.Subjects, w.Schema))
	}
	if p, ok := strings.CutSuffix(w.Subjects, ">"); ok {
		if !strings.HasSuffix(p, ".") {
			panic(fmt.Sprintf("events: subjects %q of %s must be a family \"<prefix>.>\" or one subject", w.Subjects, w.Schema))
		}
		t.families = append(t.families, familyPrefix{prefix: p, schema: w.Schema})
		return
	}
	t.families = append(t.families, familyPrefix{prefix: w.Subjects, schema: w.Schema, exact: true})
}

// New returns a zero value of the named schema, or nil when the name is
// not in the table.
func (t *Types) New(schema string) Message {
	w, ok := t.bySchema[schema]
	if !ok {
		return nil
	}
	return w.New()
}

// SubjectSchema is the schema of the type subject carries ("outcome" for
// failbus.outcome.openai.bot), or "" for a subject without a type of its
// own in the table. The longest matching family wins.
func (t *Types) SubjectSchema(subject string) string {
	best, n := "", 0
	for _, f := range t.families {
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

// SubjectSchema is the contract schema subject carries, or "" (retry
// ledger and schedules, audit records, anything outside the contract).
func SubjectSchema(subject string) string { return contract.SubjectSchema(subject) }

// SubjectFamily is the subject family ("failbus.outcome.>"), or the one
// subject, that carries the named schema, or "" when no subject carries it
// alone.
func (t *Types) SubjectFamily(schema string) string { return t.bySchema[schema].Subjects }

// Schemas lists every schema name in the table, in table order.
func (t *Types) Schemas() []string {
	out := make([]string, len(t.order))
	for i, w := range t.order {
		out[i] = w.Schema
	}
	return out
}
