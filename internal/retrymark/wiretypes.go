package retrymark

import "github.com/failbus/failbus/pkg/events"

// Started is the record an agent's Started writes (a Mark), as a failbus
// wire type.
type Started Mark

// SchemaName implements events.Message.
func (*Started) SchemaName() string { return SchemaStarted }

// Validate implements events.Message.
func (m *Started) Validate() error { return (*Mark)(m).validate() }

// Cancel is the record an agent's Cancel writes (a Mark), as a failbus wire
// type.
type Cancel Mark

// SchemaName implements events.Message.
func (*Cancel) SchemaName() string { return SchemaCancel }

// Validate implements events.Message.
func (m *Cancel) Validate() error { return (*Mark)(m).validate() }

// RecordAgent implements events.AgentRecord: the subject is the identity.
func (m *Started) RecordAgent() string { return m.Agent }

// RecordAgent implements events.AgentRecord: the subject is the identity.
func (m *Cancel) RecordAgent() string { return m.Agent }

func (m *Mark) validate() error {
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
	events.Register(SchemaStarted, events.RetryPrefix+".started.>", func() events.Message { return &Started{} })
	events.Register(SchemaCancel, events.RetryPrefix+".cancel.>", func() events.Message { return &Cancel{} })
}
