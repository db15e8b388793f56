package scheduler

import "github.com/failbus/failbus/pkg/events"

// The scheduler's own records join pkg/events' type table, so tail, report
// and every decoder read them typed: the retry ledger by its subject family,
// policy changes on their one audit subject.
func init() {
	events.Register(SchemaLedgerEntry, events.RetryPrefix+".ledger.>", func() events.Message { return &LedgerEntry{} })
	events.Register(SchemaPolicyAudit, PolicyAuditSubject(), func() events.Message { return &PolicyAudit{} })
}
