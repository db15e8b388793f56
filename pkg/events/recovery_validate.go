package events

import (
	"fmt"

	"github.com/failbus/failbus/internal/cronexpr"
)

// SchemaName implements Message.
func (*Heartbeat) SchemaName() string { return SchemaHeartbeat }

// SchemaName implements Message.
func (*CronSpec) SchemaName() string { return SchemaCronSpec }

// SchemaName implements Message.
func (*CronRun) SchemaName() string { return SchemaCronRun }

// SchemaName implements Message.
func (*Write) SchemaName() string { return SchemaWrite }

// SchemaName implements Message.
func (*Task) SchemaName() string { return SchemaTask }

// SchemaName implements Message.
func (*Dispatch) SchemaName() string { return SchemaDispatch }

// SchemaName implements Message.
func (*Control) SchemaName() string { return SchemaControl }

// SchemaName implements Message.
func (*Recovery) SchemaName() string { return SchemaRecovery }

// Validate checks a heartbeat: agent and subagent, names within
// MaxNameBytes, a known status, a non-negative interval.
func (h *Heartbeat) Validate() error {
	if err := firstErr(required("agent", h.Agent), required("subagent", h.Subagent)); err != nil {
		return err
	}
	if err := names("agent", h.Agent, "subagent", h.Subagent, "session", h.Session, "provider", h.Provider, "model", h.Model, "task_id", h.TaskID); err != nil {
		return err
	}
	switch h.Status {
	case "", HeartbeatRunning, HeartbeatDone, HeartbeatFailed:
	default:
		return &FieldError{Field: "status", Problem: fmt.Sprintf("%q is not running, done or failed", truncate(h.Status, 64))}
	}
	if h.IntervalMS < 0 {
		return &FieldError{Field: "interval_ms", Problem: "negative"}
	}
	if n := len(h.Checkpoint); n > MaxCheckpointBytes {
		return &FieldError{Field: "checkpoint", Problem: fmt.Sprintf("%d bytes exceed the limit of %d (a reference to where the work is kept, not the work)", n, MaxCheckpointBytes)}
	}
	return nil
}

// Validate checks a cron spec: agent, name and a schedule that parses,
// names within MaxNameBytes, an IANA time zone, a known catch-up mode.
func (c *CronSpec) Validate() error {
	if err := firstErr(required("agent", c.Agent), required("cron", c.Cron), required("schedule", c.Schedule)); err != nil {
		return err
	}
	if err := names("agent", c.Agent, "cron", c.Cron, "provider", c.Provider, "timezone", c.Timezone); err != nil {
		return err
	}
	if _, err := cronexpr.Parse(c.Schedule); err != nil {
		return &FieldError{Field: "schedule", Problem: err.Error()}
	}
	if _, err := cronexpr.LoadLocation(c.Timezone); err != nil {
		return &FieldError{Field: "timezone", Problem: err.Error()}
	}
	switch c.Catchup {
	case "", CatchupLatest, CatchupAll, CatchupNone:
	default:
		return &FieldError{Field: "catchup", Problem: fmt.Sprintf("%q is not latest, all or none", truncate(c.Catchup, 64))}
	}
	if c.CatchupWindow < 0 {
		return &FieldError{Field: "catchup_window", Problem: "negative"}
	}
	return nil
}

// Validate checks a cron run: agent, cron, the scheduled time it is for, a
// known status.
func (r *CronRun) Validate() error {
	if err := firstErr(required("agent", r.Agent), required("cron", r.Cron), required("status", r.Status)); err != nil {
		return err
	}
	if err := names("agent", r.Agent, "cron", r.Cron, "provider", r.Provider); err != nil {
		return err
	}
	if r.ScheduledAt.IsZero() {
		return &FieldError{Field: "scheduled_at", Problem: "required: the scheduled time this run is for"}
	}
	switch r.Status {
	case CronStarted, CronOK, CronFailed:
		return nil
	}
	return &FieldError{Field: "status", Problem: fmt.Sprintf("%q is not started, ok or failed", truncate(r.Status, 64))}
}

// Validate checks a write report: agent and key; names within MaxNameBytes.
func (w *Write) Validate() error {
	if err := firstErr(required("agent", w.Agent), required("key", w.Key)); err != nil {
		return err
	}
	return names("agent", w.Agent, "key", w.Key, "provider", w.Provider)
}

// Validate checks a task: id and agent; the id must be able to be a
// Nats-Msg-Id (checkID); names within MaxNameBytes.
func (t *Task) Validate() error {
	if err := firstErr(required("id", t.ID), required("agent", t.Agent)); err != nil {
		return err
	}
	return names("id", t.ID, "agent", t.Agent, "provider", t.Provider, "kind", t.Kind)
}

// names checks (field, value) pairs with CheckName: recovery keeps
// records under these names in KV keys (a subject each), which a name of
// kilobytes would push past the server's control line, and shows them in
// metric labels, which refuse invalid UTF-8.
func names(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := CheckName(pairs[i], pairs[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks a dispatch: task, agent, a 1-based attempt.
func (d *Dispatch) Validate() error {
	if err := firstErr(required("task_id", d.TaskID), required("agent", d.Agent)); err != nil {
		return err
	}
	if d.Attempt < 1 {
		return &FieldError{Field: "attempt", Problem: fmt.Sprintf("%d: attempts count from 1", d.Attempt)}
	}
	return nil
}

// Validate checks a control command: agent, a known action and the fields
// that action needs.
func (c *Control) Validate() error {
	if err := firstErr(required("agent", c.Agent), required("action", c.Action)); err != nil {
		return err
	}
	switch c.Action {
	case ControlKill:
		return required("subagent", c.Subagent)
	case ControlRunCron:
		if err := required("cron", c.Cron); err != nil {
			return err
		}
		if c.ScheduledAt.IsZero() {
			return &FieldError{Field: "scheduled_at", Problem: "required for run_cron"}
		}
		return nil
	case ControlCheckWrite:
		return required("key", c.Key)
	case ControlProbe:
		return required("provider", c.Provider)
	}
	return &FieldError{Field: "action", Problem: fmt.Sprintf("%q is not kill, run_cron, check_write or probe", truncate(c.Action, 64))}
}

var steps = map[string]bool{
	StepConfirm: true, StepSubagents: true, StepKill: true, StepCrons: true,
	StepWrites: true, StepRedispatch: true, StepRelease: true,
}

// Validate checks a recovery record: its run, provider and a checklist step.
func (r *Recovery) Validate() error {
	if err := firstErr(required("recovery_id", r.RecoveryID), required("provider", r.Provider), required("step", r.Step)); err != nil {
		return err
	}
	if !steps[r.Step] {
		return &FieldError{Field: "step", Problem: fmt.Sprintf("%q is not a checklist step", truncate(r.Step, 64))}
	}
	if r.Released < 0 {
		return &FieldError{Field: "released", Problem: "negative"}
	}
	return nil
}
