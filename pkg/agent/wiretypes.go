package agent

import "github.com/failbus/failbus/pkg/events"

// RetryStarted is the record Started writes (a RetryMark), as a failbus
// wire type.
type RetryStarted RetryMark

// SchemaName implements events.Message.
func (*RetryStarted) SchemaName() string { return SchemaRetryStarted }

// Validate implements events.Message.
func (m *RetryStarted) Validate() error { return (*RetryMark)(m).validate() }

// RetryCancel is the record Cancel writes (a RetryMark), as a failbus wire
// type.
type RetryCancel RetryMark

// SchemaName implements events.Message.
func (*RetryCancel) SchemaName() string { return SchemaRetryCancel }

// Validate implements events.Message.
func (m *RetryCancel) Validate() error { return (*RetryMark)(m).validate() }

// RecordAgent implements events.AgentRecord: the subject is the identity.
func (m *RetryStarted) RecordAgent() string { return m.Agent }

// RecordAgent implements events.AgentRecord: the subject is the identity.
func (m *RetryCancel) RecordAgent() string { return m.Agent }

func (m *RetryMark) validate() error {
	if m.RetryID == "" {
		return &events.FieldError{Field: "retry_id", Problem: "required"}
	}
	if m.Agent == "" {
		return &events.FieldError{Field: "agent", Problem: "required"}
	}
	if err := events.CheckName("retry_id", m.RetryID); err != nil {
		return err
	}
	return events.CheckName("agent", m.Agent)
}

// The agent's started and cancel records join pkg/events' type table, so
// tail, report and every decoder read them typed, by header or subject.
func init() {
	events.Register(SchemaRetryStarted, events.RetryPrefix+".started.>", func() events.Message { return &RetryStarted{} })
	events.Register(SchemaRetryCancel, events.RetryPrefix+".cancel.>", func() events.Message { return &RetryCancel{} })
}
