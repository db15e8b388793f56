package events

import (
	"errors"
	"fmt"
	"strings"
)

// AgentRecord is a record an agent sends about itself: an outcome, a
// boundary, a heartbeat, a cron spec or run, a write, a task, a retry's
// started or cancel mark. Its subject ends with its agent's token
// (failbus.outcome.<provider>.<agent>, failbus.heartbeat.<agent>, …), and
// with per-agent users (`auth init --agents`) the subject is all the server
// checks: a user may publish only on its own agent's subjects. So the
// subject is the identity, and Decode refuses such a record whose payload
// names another agent (ErrWrongAgent): agent a cannot spend agent b's retry
// budget, have a task dispatched to b or a subagent of b killed by writing
// "agent": "b" into a payload on its own subject.
type AgentRecord interface {
	Message
	// RecordAgent is the agent the payload names.
	RecordAgent() string
}

// ErrWrongAgent reports an agent's record whose payload names another
// agent than its subject: a dead letter, never read as either agent's.
var ErrWrongAgent = errors.New("payload names another agent than its subject")

// checkSender checks that an AgentRecord, read from one of its own
// subjects (the caller knows it is), names the agent whose token ends the
// subject. Other messages, and subject "" (a caller that does not know
// the subject), pass.
func checkSender(subject string, m Message) error {
	a, ok := m.(AgentRecord)
	if !ok || subject == "" {
		return nil
	}
	agent := a.RecordAgent()
	got := subject[strings.LastIndexByte(subject, '.')+1:]
	if want := Token(agent); got != want {
		return &FieldError{Field: "agent", Err: ErrWrongAgent,
			Problem: fmt.Sprintf("%s: the payload names %q, the subject %s is agent %q's (the subject is the identity)",
				ErrWrongAgent, truncate(agent, 64), truncate(subject, 128), got)}
	}
	return nil
}

// RecordAgent implements AgentRecord.
func (o *Outcome) RecordAgent() string { return o.Agent }

// RecordAgent implements AgentRecord.
func (b *Boundary) RecordAgent() string { return b.Agent }

// RecordAgent implements AgentRecord.
func (h *Heartbeat) RecordAgent() string { return h.Agent }

// RecordAgent implements AgentRecord.
func (c *CronSpec) RecordAgent() string { return c.Agent }

// RecordAgent implements AgentRecord.
func (r *CronRun) RecordAgent() string { return r.Agent }

// RecordAgent implements AgentRecord.
func (w *Write) RecordAgent() string { return w.Agent }

// RecordAgent implements AgentRecord.
func (t *Task) RecordAgent() string { return t.Agent }
