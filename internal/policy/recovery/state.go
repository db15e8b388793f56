package recovery

import (
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// ProviderRecord is everything recovery keeps about one provider, in one
// value so every change is one compare-and-set: whether it is down, the
// outage episodes whose checklist has not finished, the held-task queue,
// the probe schedule and the agents that use it. A service keeps one per
// provider in KV (FAILBUS_RECOVERY); the in-memory store keeps them for
// `failbus simulate`. The record of provider "" is the queue of tasks
// without a provider, held while any provider is down.
type ProviderRecord struct {
	Provider string `msgpack:"provider" json:"provider"`
	// Down is true from an outage until its recovery: health outage, or
	// degraded while recovering from it.
	Down bool `msgpack:"down,omitempty" json:"down,omitempty"`
	// Health and HealthAt are the latest health record seen.
	Health   string      `msgpack:"health,omitempty" json:"health,omitempty"`
	HealthAt events.Time `msgpack:"health_at,omitempty" json:"health_at,omitzero"`
	// Episodes are outages whose checklist has not finished, oldest first;
	// the last one is still open while Down (RecoveredAt zero).
	Episodes []Episode `msgpack:"episodes,omitempty" json:"episodes,omitempty"`
	// Queue is the held-task queue: the tasks themselves stay in
	// FAILBUS_TASKS; this is the range to release and the cursor.
	Queue Queue `msgpack:"queue" json:"queue"`
	// Probe schedules the outage probes.
	Probe ProbeState `msgpack:"probe" json:"probe"`
	// Users are the agents that reported using the provider themselves
	// (heartbeats, cron and write reports), most recent first, at most
	// MaxUsers. With the agents of its latest outcomes (Usage.RecentUsers)
	// they are the probe targets.
	Users []User `msgpack:"users,omitempty" json:"users,omitempty"`
	// Lease keeps one replica driving the record at a time (an
	// optimisation: compare-and-set and the ledger keep concurrent drivers
	// correct).
	Lease Lease `msgpack:"lease,omitempty" json:"lease,omitzero"`
}

// Queue is a provider's held tasks: every task of the provider stored in
// FAILBUS_TASKS with a sequence in (Cursor, LastSeq] waits to be released.
type Queue struct {
	// Holding is true from the outage (or the first task held) until the
	// release drained the queue: while it holds, new tasks queue behind the
	// held ones, so each agent's tasks leave in submission order.
	Holding bool `msgpack:"holding,omitempty" json:"holding,omitempty"`
	// Cursor is the stream sequence of the last task released or skipped;
	// LastSeq the last task held.
	Cursor  uint64 `msgpack:"cursor,omitempty" json:"cursor,omitempty"`
	LastSeq uint64 `msgpack:"last_seq,omitempty" json:"last_seq,omitempty"`
	// Held counts tasks held and not yet released (for metrics).
	Held int `msgpack:"held,omitempty" json:"held,omitempty"`
	// NextAt is the earliest time of the next release (drain rate): the
	// release time of the last task claimed plus 1/drain_rate, moved in
	// the compare-and-set that claims it (Sending).
	NextAt events.Time `msgpack:"next_at,omitempty" json:"next_at,omitzero"`
	// Released counts tasks released since the queue last started holding.
	Released int `msgpack:"released,omitempty" json:"released,omitempty"`
	// Sending is the task being released, claimed before it is sent.
	Sending *Sending `msgpack:"sending,omitempty" json:"sending,omitempty"`
}

// Sending is the held task being released: claimed in the record, with
// its release time, before its dispatch is sent; cleared when the cursor
// moves past it.
type Sending struct {
	Seq uint64 `msgpack:"seq" json:"seq"`
	// Since is when it was claimed: its dispatch may be in the stream from
	// then on (Publisher's verifySince after a crash).
	Since events.Time `msgpack:"since" json:"since"`
	// At is its release time, the dispatch's `at`, claimed with it (and
	// Queue.NextAt moved past it) in one compare-and-set: whichever replica
	// sends the dispatch or moves the cursor, the releases are
	// 1/drain_rate apart. Zero in a claim saved by a version that did not
	// claim the time; the task is claimed again, with a time.
	At events.Time `msgpack:"at,omitempty" json:"at,omitzero"`
}

// nextRelease is when the queue's next release is due: the release time
// of a task claimed and not yet released, else NextAt (now when unset).
func (q *Queue) nextRelease(now time.Time) time.Time {
	if s := q.claimed(); s != nil {
		return s.At.Time
	}
	if q.NextAt.IsZero() {
		return now
	}
	return q.NextAt.Time
}

// claimed is the task claimed for release with its release time, or nil.
func (q *Queue) claimed() *Sending {
	if s := q.Sending; s != nil && s.Seq > q.Cursor && !s.At.IsZero() {
		return s
	}
	return nil
}

// ProbeState schedules outage probes: one every probe interval, the
// compare-and-set on the record being the claim that makes it one across
// replicas.
type ProbeState struct {
	// Seq numbers the probes of the current outage (1-based).
	Seq int `msgpack:"seq,omitempty" json:"seq,omitempty"`
	// NextAt is when the next probe is due; zero when not down.
	NextAt events.Time `msgpack:"next_at,omitempty" json:"next_at,omitzero"`
	// LastAgent is the agent asked last.
	LastAgent string `msgpack:"last_agent,omitempty" json:"last_agent,omitempty"`
	// Pending is the probe claimed and not yet known to be sent: saved with
	// the claim, sent, then cleared, so a crash in between resends it (the
	// ledger keeps it to one) instead of skipping it.
	Pending *Command `msgpack:"pending,omitempty" json:"pending,omitempty"`
}

// User is an agent seen using a provider, and when it last was.
type User struct {
	Agent string      `msgpack:"agent" json:"agent"`
	At    events.Time `msgpack:"at" json:"at"`
}

// MaxUsers bounds ProviderRecord.Users.
const MaxUsers = 16

// Lease names the replica driving a record and until when.
type Lease struct {
	Owner string      `msgpack:"owner,omitempty" json:"owner,omitempty"`
	Until events.Time `msgpack:"until,omitempty" json:"until,omitzero"`
}

// IsZero reports an empty lease.
func (l Lease) IsZero() bool { return l.Owner == "" && l.Until.IsZero() }

// Episode is one outage and its checklist.
type Episode struct {
	// RecoveryID is "<provider>:<outage start, epoch ms>".
	RecoveryID      string      `msgpack:"recovery_id" json:"recovery_id"`
	OutageStartedAt events.Time `msgpack:"outage_started_at" json:"outage_started_at"`
	// RecoveredAt is zero while the outage lasts.
	RecoveredAt events.Time `msgpack:"recovered_at,omitempty" json:"recovered_at,omitzero"`
	// Step is the index in events.Steps of the step in progress.
	Step int `msgpack:"step" json:"step"`
	// Plan is the step in progress, planned (what to send) before anything
	// is sent, so a crash resumes with the same commands.
	Plan *Plan `msgpack:"plan,omitempty" json:"plan,omitempty"`
	// Subagents is the result of step subagents, read by step kill.
	Subagents []events.SubagentRef `msgpack:"subagents,omitempty" json:"subagents,omitempty"`
	// Killed is the result of step kill, read by step redispatch.
	Killed []events.SubagentRef `msgpack:"killed,omitempty" json:"killed,omitempty"`
	// Counts are the totals for the final notification.
	Counts Counts `msgpack:"counts" json:"counts"`
}

// Counts sums up a recovery run.
type Counts struct {
	Subagents    int `msgpack:"subagents,omitempty" json:"subagents,omitempty"`
	Killed       int `msgpack:"killed,omitempty" json:"killed,omitempty"`
	CronsRerun   int `msgpack:"crons_rerun,omitempty" json:"crons_rerun,omitempty"`
	CronsMissed  int `msgpack:"crons_missed,omitempty" json:"crons_missed,omitempty"`
	Writes       int `msgpack:"writes,omitempty" json:"writes,omitempty"`
	Redispatched int `msgpack:"redispatched,omitempty" json:"redispatched,omitempty"`
	Released     int `msgpack:"released,omitempty" json:"released,omitempty"`
}

// Plan is one checklist step, decided before anything of it is sent: its
// commands in order, the last of which is the step's record (and, for the
// last step, the notification).
type Plan struct {
	Step string      `msgpack:"step" json:"step"`
	At   events.Time `msgpack:"at" json:"at"`
	// Commands are sent in order; each is sent once (ledger).
	Commands []Command `msgpack:"commands,omitempty" json:"commands,omitempty"`
	// Draining is set on the release step while held tasks remain; its
	// commands are then planned once the queue is empty.
	Draining bool `msgpack:"draining,omitempty" json:"draining,omitempty"`
}

// Command is one message recovery sends, with its identity: ID is its
// Nats-Msg-Id and its ledger key, derived from what it is about, never
// from when it was sent.
type Command struct {
	ID      string `msgpack:"id" json:"id"`
	Subject string `msgpack:"subject" json:"subject"`
	// Exactly one of these is set.
	Control      *events.Control      `msgpack:"control,omitempty" json:"control,omitempty"`
	Recovery     *events.Recovery     `msgpack:"recovery,omitempty" json:"recovery,omitempty"`
	Notification *events.Notification `msgpack:"notification,omitempty" json:"notification,omitempty"`
	// Dispatch refers to a task in the task store; the Dispatch message is
	// built from it when sent, so payloads are not copied into the plan.
	Dispatch *DispatchRef `msgpack:"dispatch,omitempty" json:"dispatch,omitempty"`
}

// DispatchRef is a dispatch to send: the task (by its stream sequence; 0
// when the bus never saw the task), the attempt and why.
type DispatchRef struct {
	TaskID   string      `msgpack:"task_id" json:"task_id"`
	Seq      uint64      `msgpack:"seq,omitempty" json:"seq,omitempty"`
	Attempt  int         `msgpack:"attempt" json:"attempt"`
	Agent    string      `msgpack:"agent,omitempty" json:"agent,omitempty"`
	Provider string      `msgpack:"provider,omitempty" json:"provider,omitempty"`
	Reason   string      `msgpack:"reason,omitempty" json:"reason,omitempty"`
	At       events.Time `msgpack:"at" json:"at"`
	// Subagent is the killed subagent whose task this re-dispatches: its
	// last heartbeat's checkpoint goes with it.
	Subagent string `msgpack:"subagent,omitempty" json:"subagent,omitempty"`
}

// StoredTask is a task with its position in the task stream.
type StoredTask struct {
	Seq  uint64
	Task events.Task
	// StoredAt is when the stream stored it.
	StoredAt time.Time
}

// TaskIndex finds a task by id: its stream sequence and the latest attempt
// dispatched (0: held, never dispatched).
type TaskIndex struct {
	ID       string `msgpack:"id" json:"id"`
	Seq      uint64 `msgpack:"seq" json:"seq"`
	Agent    string `msgpack:"agent" json:"agent"`
	Provider string `msgpack:"provider,omitempty" json:"provider,omitempty"`
	Attempt  int    `msgpack:"attempt" json:"attempt"`
}

// open is the episode of the outage still going on, or nil.
func (r *ProviderRecord) open() *Episode {
	if n := len(r.Episodes); n > 0 && r.Episodes[n-1].RecoveredAt.IsZero() {
		return &r.Episodes[n-1]
	}
	return nil
}

// ready is the first episode whose outage ended and whose checklist has not
// finished, or nil.
func (r *ProviderRecord) ready() *Episode {
	if len(r.Episodes) > 0 && !r.Episodes[0].RecoveredAt.IsZero() {
		return &r.Episodes[0]
	}
	return nil
}
