package events

// Recovery wire types (docs/CONTRACT.md § "Recovery", the post-outage
// checklist): what
// agents report so the bus can find the work an outage interrupted —
// subagent heartbeats, cron schedules and runs, memory writes, queued tasks —
// and what the recovery service sends back: dispatched tasks, control
// commands and the checklist's step records.

import "time"

// Heartbeat statuses. A heartbeat without a status means running.
const (
	HeartbeatRunning = "running"
	HeartbeatDone    = "done"
	HeartbeatFailed  = "failed"
)

// DefaultHeartbeatIntervalMS is the interval a heartbeat without
// interval_ms is taken to promise (CONTRACT.md: 10000).
const DefaultHeartbeatIntervalMS = 10000

// Heartbeat says one subagent is alive (running) or has ended (done,
// failed). After an outage a subagent's status may still say
// running long after it died; only a heartbeat that keeps coming proves it
// lives.
type Heartbeat struct {
	At       Time   `msgpack:"at" json:"at"`
	Agent    string `msgpack:"agent" json:"agent"`
	Subagent string `msgpack:"subagent" json:"subagent"`
	Session  string `msgpack:"session,omitempty" json:"session,omitempty"`
	Provider string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	Model    string `msgpack:"model,omitempty" json:"model,omitempty"`
	// TaskID is the task the subagent works on: recovery re-dispatches it
	// (attempt + 1) when it kills the subagent.
	TaskID string `msgpack:"task_id,omitempty" json:"task_id,omitempty"`
	// Status is running, done or failed; empty means running.
	Status string `msgpack:"status,omitempty" json:"status,omitempty"`
	// IntervalMS is how often the subagent promises a heartbeat; 0 means
	// DefaultHeartbeatIntervalMS.
	IntervalMS int64 `msgpack:"interval_ms,omitempty" json:"interval_ms,omitempty"`
	// Checkpoint is where the task can resume from (opaque to the bus, at
	// most MaxCheckpointBytes): a re-dispatch of the task carries the last
	// one, so a killed subagent's work is not thrown away.
	Checkpoint string `msgpack:"checkpoint,omitempty" json:"checkpoint,omitempty"`
}

// MaxCheckpointBytes bounds a heartbeat's checkpoint: a reference to where
// the work is kept, not the work.
const MaxCheckpointBytes = 4 << 10

// State is Status with the default applied.
func (h *Heartbeat) State() string {
	if h.Status == "" {
		return HeartbeatRunning
	}
	return h.Status
}

// Interval is IntervalMS with the default applied.
func (h *Heartbeat) Interval() time.Duration {
	if h.IntervalMS <= 0 {
		return DefaultHeartbeatIntervalMS * time.Millisecond
	}
	return time.Duration(h.IntervalMS) * time.Millisecond
}

// Catch-up modes of a cron: which of the scheduled times an outage made it
// miss are re-run after recovery.
const (
	CatchupLatest = "latest" // the newest missed time only (default)
	CatchupAll    = "all"    // each missed time, oldest first
	CatchupNone   = "none"   // none; each is listed as missed
)

// CronSpec declares a cron and its schedule, so recovery can tell which
// scheduled times fell inside an outage (in one, every cron failed
// silently).
type CronSpec struct {
	At    Time   `msgpack:"at" json:"at"`
	Agent string `msgpack:"agent" json:"agent"`
	// Cron is the cron's name, unique per agent.
	Cron string `msgpack:"cron" json:"cron"`
	// Schedule is a 5-field cron expression (or @hourly, @daily, …), or
	// "@every <duration>" counted from the cron's first recorded run, else
	// from the spec's At.
	Schedule string `msgpack:"schedule" json:"schedule"`
	// Timezone is the IANA zone the expression is read in; empty is UTC.
	Timezone string `msgpack:"timezone,omitempty" json:"timezone,omitempty"`
	Provider string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	// Catchup is latest (default), all or none.
	Catchup string `msgpack:"catchup,omitempty" json:"catchup,omitempty"`
	// CatchupWindow bounds how far before recovery a missed time is still
	// re-run; 0 means the policy's recovery.catchup_window.
	CatchupWindow Duration `msgpack:"catchup_window,omitempty" json:"catchup_window,omitzero"`
}

// CatchupMode is Catchup with the default applied.
func (c *CronSpec) CatchupMode() string {
	if c.Catchup == "" {
		return CatchupLatest
	}
	return c.Catchup
}

// Cron run statuses.
const (
	CronStarted = "started"
	CronOK      = "ok"
	CronFailed  = "failed"
)

// CronRun reports one run of a cron for one scheduled time. Only an `ok`
// run means the scheduled time needs no catch-up.
type CronRun struct {
	At    Time   `msgpack:"at" json:"at"`
	Agent string `msgpack:"agent" json:"agent"`
	Cron  string `msgpack:"cron" json:"cron"`
	// ScheduledAt is the scheduled time this run is for: the run's identity.
	ScheduledAt Time   `msgpack:"scheduled_at" json:"scheduled_at"`
	Status      string `msgpack:"status" json:"status"`
	Provider    string `msgpack:"provider,omitempty" json:"provider,omitempty"`
}

// Write reports one memory write (a file, a KV entry, …) and whether it
// reached its store. A coordinator's memory writes depend on the
// same provider and are lost silently in an outage.
type Write struct {
	At    Time   `msgpack:"at" json:"at"`
	Agent string `msgpack:"agent" json:"agent"`
	// Key names what was written, e.g. a memory file's path.
	Key      string `msgpack:"key" json:"key"`
	OK       bool   `msgpack:"ok" json:"ok"`
	Error    string `msgpack:"error,omitempty" json:"error,omitempty"`
	Provider string `msgpack:"provider,omitempty" json:"provider,omitempty"`
}

// Task is work an agent submits through the bus: dispatched at once while
// its provider is healthy, held in FAILBUS_TASKS during an outage and
// released after recovery, never dropped.
type Task struct {
	// ID identifies the task; it is also the Nats-Msg-Id it is submitted
	// with.
	ID       string `msgpack:"id" json:"id"`
	At       Time   `msgpack:"at" json:"at"`
	Agent    string `msgpack:"agent" json:"agent"`
	Provider string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	Kind     string `msgpack:"kind,omitempty" json:"kind,omitempty"`
	// Payload is any value, passed through to the Dispatch untouched.
	Payload Raw `msgpack:"payload,omitempty" json:"payload,omitzero"`
}

// Dispatch hands a task to its agent: attempt 1 when submitted (at once, or
// released after an outage), attempt n+1 when recovery killed the subagent
// that ran attempt n.
type Dispatch struct {
	TaskID   string `msgpack:"task_id" json:"task_id"`
	Attempt  int    `msgpack:"attempt" json:"attempt"`
	At       Time   `msgpack:"at" json:"at"`
	Agent    string `msgpack:"agent" json:"agent"`
	Provider string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	Kind     string `msgpack:"kind,omitempty" json:"kind,omitempty"`
	Payload  Raw    `msgpack:"payload,omitempty" json:"payload,omitzero"`
	// Reason says why now: "submitted", "released after outage …",
	// "redispatched: subagent … killed".
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// Checkpoint, on a re-dispatch, is the last checkpoint the killed
	// subagent recorded for the task: where to resume.
	Checkpoint string `msgpack:"checkpoint,omitempty" json:"checkpoint,omitempty"`
}

// Control actions: what recovery asks an agent to do.
const (
	ControlKill       = "kill"        // stop a subagent that stopped heartbeating
	ControlRunCron    = "run_cron"    // re-run a cron for a scheduled time it missed
	ControlCheckWrite = "check_write" // check (and redo) a write that failed
	ControlProbe      = "probe"       // make one real call to a provider in an outage
)

// Control is a recovery command to one agent. The fields beyond the common
// ones depend on Action.
type Control struct {
	At     Time   `msgpack:"at" json:"at"`
	Agent  string `msgpack:"agent" json:"agent"`
	Action string `msgpack:"action" json:"action"`
	Reason string `msgpack:"reason,omitempty" json:"reason,omitempty"`
	// RecoveryID names the recovery run (or outage, for a probe) that sent it.
	RecoveryID string `msgpack:"recovery_id,omitempty" json:"recovery_id,omitempty"`
	// kill
	Subagent string `msgpack:"subagent,omitempty" json:"subagent,omitempty"`
	TaskID   string `msgpack:"task_id,omitempty" json:"task_id,omitempty"`
	// run_cron
	Cron        string `msgpack:"cron,omitempty" json:"cron,omitempty"`
	ScheduledAt Time   `msgpack:"scheduled_at,omitempty" json:"scheduled_at,omitzero"`
	// check_write
	Key string `msgpack:"key,omitempty" json:"key,omitempty"`
	// probe
	Provider string `msgpack:"provider,omitempty" json:"provider,omitempty"`
}

// Checklist steps, in the order they run (CONTRACT.md § "Recovery").
const (
	StepConfirm    = "confirm"
	StepSubagents  = "subagents"
	StepKill       = "kill"
	StepCrons      = "crons"
	StepWrites     = "writes"
	StepRedispatch = "redispatch"
	StepRelease    = "release"
)

// Steps lists the checklist steps in order.
var Steps = []string{StepConfirm, StepSubagents, StepKill, StepCrons, StepWrites, StepRedispatch, StepRelease}

// Recovery is one step record of a recovery run on
// failbus.recovery.<provider>. A run's records, read in order, are the
// checklist as it happened; the last one has Done set.
type Recovery struct {
	// RecoveryID is "<provider>:<outage start, epoch ms>".
	RecoveryID      string `msgpack:"recovery_id" json:"recovery_id"`
	At              Time   `msgpack:"at" json:"at"`
	Provider        string `msgpack:"provider" json:"provider"`
	OutageStartedAt Time   `msgpack:"outage_started_at" json:"outage_started_at"`
	RecoveredAt     Time   `msgpack:"recovered_at" json:"recovered_at"`
	Step            string `msgpack:"step" json:"step"`
	Done            bool   `msgpack:"done" json:"done"`
	// Subagents (step subagents; an extension) are the subagents whose
	// latest heartbeat says running, stale or not.
	Subagents    []SubagentRef `msgpack:"subagents,omitempty" json:"subagents,omitempty"`
	Killed       []SubagentRef `msgpack:"killed,omitempty" json:"killed,omitempty"`
	CronsRerun   []CronRef     `msgpack:"crons_rerun,omitempty" json:"crons_rerun,omitempty"`
	CronsMissed  []CronRef     `msgpack:"crons_missed,omitempty" json:"crons_missed,omitempty"`
	Writes       []WriteRef    `msgpack:"writes,omitempty" json:"writes,omitempty"`
	Redispatched []TaskRef     `msgpack:"redispatched,omitempty" json:"redispatched,omitempty"`
	Released     int           `msgpack:"released,omitempty" json:"released,omitempty"`
}

// SubagentRef names a subagent in a recovery record.
type SubagentRef struct {
	Agent           string `msgpack:"agent" json:"agent"`
	Subagent        string `msgpack:"subagent" json:"subagent"`
	TaskID          string `msgpack:"task_id,omitempty" json:"task_id,omitempty"`
	LastHeartbeatAt Time   `msgpack:"last_heartbeat_at" json:"last_heartbeat_at"`
	// Stale (step subagents only) says the latest heartbeat is older than
	// the stale limit.
	Stale bool `msgpack:"stale,omitempty" json:"stale,omitempty"`
}

// CronRef names one scheduled time of a cron; Why says why a missed one is
// not re-run.
type CronRef struct {
	Agent       string `msgpack:"agent" json:"agent"`
	Cron        string `msgpack:"cron" json:"cron"`
	ScheduledAt Time   `msgpack:"scheduled_at" json:"scheduled_at"`
	Why         string `msgpack:"why,omitempty" json:"why,omitempty"`
}

// WriteRef names a write that failed during the outage.
type WriteRef struct {
	Agent    string `msgpack:"agent" json:"agent"`
	Key      string `msgpack:"key" json:"key"`
	FailedAt Time   `msgpack:"failed_at" json:"failed_at"`
}

// TaskRef names one dispatch attempt of a task.
type TaskRef struct {
	TaskID  string `msgpack:"task_id" json:"task_id"`
	Attempt int    `msgpack:"attempt" json:"attempt"`
}
