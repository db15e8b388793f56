// Package wiretypes is the one table of every record type the failbus
// services write: the contract's types and the services' own records (the
// scheduler's retry ledger entries and policy audits, the notifier's audit
// records, an agent's retry started and cancel marks, the consumers' store
// checks). A reader of the whole bus (tail, report, decode) reads with Bus,
// so it decodes every message typed instead of as generic msgpack. A
// service reads its own records by naming their type (events.DecodeAs) and
// needs no table.
package wiretypes

import (
	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/retrymark"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/storecheck"
	"github.com/failbus/failbus/pkg/events"
)

// Bus is every record type the bus writes, with the subjects that carry
// it. A service that writes a new record type adds one line here;
// TestEveryRecordTheBusWritesDecodes fails on a record a service writes
// that this table does not know.
var Bus = events.NewTypes(
	events.WireType{Schema: scheduler.SchemaLedgerEntry, Subjects: events.RetryPrefix + ".ledger.>", New: func() events.Message { return &scheduler.LedgerEntry{} }},
	events.WireType{Schema: scheduler.SchemaPolicyAudit, Subjects: scheduler.PolicyAuditSubject(), New: func() events.Message { return &scheduler.PolicyAudit{} }},
	events.WireType{Schema: retrymark.SchemaStarted, Subjects: events.RetryPrefix + ".started.>", New: func() events.Message { return &retrymark.Started{} }},
	events.WireType{Schema: retrymark.SchemaCancel, Subjects: events.RetryPrefix + ".cancel.>", New: func() events.Message { return &retrymark.Cancel{} }},
	events.WireType{Schema: delivery.SchemaAudit, Subjects: events.AuditPrefix + ".notifier.>", New: func() events.Message { return &delivery.Audit{} }},
	events.WireType{Schema: storecheck.Schema, Subjects: storecheck.Prefix + ".>", New: func() events.Message { return &storecheck.Record{} }},
)
