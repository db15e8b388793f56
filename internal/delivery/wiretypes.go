package delivery

import "github.com/failbus/failbus/pkg/events"

// The notifier's audit records join pkg/events' type table, so tail,
// report and every decoder read them typed (by their schema header; without
// one, on the default notifier's audit subjects).
func init() {
	events.Register(SchemaAudit, events.AuditPrefix+".notifier.>", func() events.Message { return &Audit{} })
}
