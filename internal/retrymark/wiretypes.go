package retrymark

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/pkg/events"
)

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

// Decode reads an agent's started or cancel record as every agent record
// is read (the subject's type, the identifier rules, the subject as the
// identity): the subject family names which of the two it is.
func Decode(subject string, h nats.Header, data []byte) (Mark, error) {
	switch {
	case strings.HasPrefix(subject, events.RetryPrefix+".started."):
		m, err := events.DecodeAs[*Started](subject, h, data)
		if err != nil {
			return Mark{}, err
		}
		return Mark(*m), nil
	case strings.HasPrefix(subject, events.RetryPrefix+".cancel."):
		m, err := events.DecodeAs[*Cancel](subject, h, data)
		if err != nil {
			return Mark{}, err
		}
		return Mark(*m), nil
	}
	return Mark{}, fmt.Errorf("%w: %s is not a retry started or cancel subject", events.ErrSchemaMismatch, subject)
}
