package recovery

import (
	"context"
	"errors"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery/checklist"
	"github.com/failbus/failbus/pkg/events"
)

// ErrConflict is what SaveProvider returns when the record changed since it
// was loaded (compare-and-set failed): load it again and redo the change.
var ErrConflict = errors.New("recovery: record changed concurrently")

// Store is everything the checklist reads and writes. Each role is a small
// interface; memstore.Store implements all of them in memory for
// `failbus simulate` and tests, internal/service/recoverer on KV buckets and
// streams.
// Implementations must be safe for concurrent use when the Core is.
type Store interface {
	Providers
	Heartbeats
	Crons
	Writes
	Tasks
	Ledger
	Usage
	// CaughtUp reports whether the heartbeats and cron specs kept here
	// include every report stored on the bus when it was called: the
	// checklist never decides on a lagging view (a subagent's "done" not
	// yet applied would get it killed). An in-memory store applies reports
	// as they come and always returns true.
	CaughtUp(ctx context.Context) (bool, error)
}

// ErrLagging is what Advance returns when a step waits for the store to
// catch up with the reports on the bus (CaughtUp): call it again shortly.
var ErrLagging = errors.New("recovery: waiting for the reports to be applied")

// Providers keeps one ProviderRecord per provider, updated by revision.
type Providers interface {
	// LoadProvider returns the record and its revision; (nil, 0, nil) when
	// the provider has none yet.
	LoadProvider(ctx context.Context, provider string) (*ProviderRecord, uint64, error)
	// SaveProvider writes rec if its revision is still rev (0: create);
	// ErrConflict otherwise. It returns the new revision.
	SaveProvider(ctx context.Context, rec *ProviderRecord, rev uint64) (uint64, error)
	// ListProviders names every provider with a record, sorted.
	ListProviders(ctx context.Context) ([]string, error)
	// LatestHealth is the newest health record stored for the provider on
	// the bus, nil when unknown. It closes the gap between a health record
	// being stored and the record here being updated by the consumer that
	// applies it; an in-memory store, which has no such gap, returns nil.
	LatestHealth(ctx context.Context, provider string) (*events.Health, error)
}

// Usage names the probe targets: the agents that called a provider lately
// and whether they now hold on it. It is read only when a probe is due, so
// a store that has the outcomes and decisions stored anyway (the bus's
// streams) reads them back then, instead of following every decision as it
// is made; the notes are for a store that keeps nothing else (memory).
type Usage interface {
	// NoteOutcome records that agent reported a call to provider at `at`
	// (a stream-backed store has it already).
	NoteOutcome(ctx context.Context, provider, agent string, at time.Time) error
	// NoteDecision records a decision made for an agent (a stream-backed
	// store has it already).
	NoteDecision(ctx context.Context, d events.Decision) error
	// RecentUsers returns up to max of the agents whose latest outcome on
	// provider is the most recent, most recent first, with the time of
	// that outcome.
	RecentUsers(ctx context.Context, provider string, max int) ([]User, error)
	// LatestDecisions returns the latest decision made for each of agents
	// that has one (whatever its provider); the core reads from it who
	// holds (Holding).
	LatestDecisions(ctx context.Context, agents []string) (map[string]events.Decision, error)
}

// Heartbeats keeps the latest heartbeat of every (agent, subagent).
type Heartbeats interface {
	// PutHeartbeat keeps h unless a heartbeat with a later `at` is kept
	// already for its (agent, subagent).
	PutHeartbeat(ctx context.Context, h events.Heartbeat) error
	// LatestHeartbeats returns the kept heartbeats, in any order.
	LatestHeartbeats(ctx context.Context) ([]events.Heartbeat, error)
	// Heartbeat returns the kept heartbeat of (agent, subagent), or nil.
	Heartbeat(ctx context.Context, agent, subagent string) (*events.Heartbeat, error)
}

// Crons keeps cron specs and reads cron runs back.
type Crons interface {
	// PutCronSpec keeps the latest spec of (agent, cron), keeping its first
	// recorded run.
	PutCronSpec(ctx context.Context, s events.CronSpec) error
	// NoteCronRun records a run: the cron's first recorded run is the
	// anchor of an @every schedule. A store that can read runs back from
	// where they are stored anyway (a stream) keeps nothing else.
	NoteCronRun(ctx context.Context, r events.CronRun) error
	// CronStates returns every cron, in any order.
	CronStates(ctx context.Context) ([]checklist.CronState, error)
	// CronRuns returns the runs reported at or after since.
	CronRuns(ctx context.Context, since time.Time) ([]events.CronRun, error)
}

// Writes reads memory-write reports back.
type Writes interface {
	// NoteWrite records a write report (a stream-backed store has it
	// already).
	NoteWrite(ctx context.Context, w events.Write) error
	// WritesSince returns the writes reported at or after since, in the
	// order reported.
	WritesSince(ctx context.Context, since time.Time) ([]events.Write, error)
}

// Tasks reads held tasks back from where they wait (FAILBUS_TASKS) and keeps
// an index by task id.
type Tasks interface {
	// TasksAfter returns up to max tasks of provider (by the payload's
	// provider) with a stream sequence in (after, upto], in order.
	TasksAfter(ctx context.Context, provider string, after, upto uint64, max int) ([]StoredTask, error)
	// TaskAt returns the task stored at seq.
	TaskAt(ctx context.Context, seq uint64) (*StoredTask, error)
	// LoadTaskIndex returns a task's index entry and revision; (nil, 0,
	// nil) when none.
	LoadTaskIndex(ctx context.Context, id string) (*TaskIndex, uint64, error)
	// SaveTaskIndex writes idx if its revision is still rev (0: create);
	// ErrConflict otherwise.
	SaveTaskIndex(ctx context.Context, idx *TaskIndex, rev uint64) error
}

// TaskAppender is implemented by stores that hold tasks themselves (the
// in-memory store). A bus store gets tasks from the stream, which assigned
// their sequence already.
type TaskAppender interface {
	AppendTask(ctx context.Context, t events.Task, at time.Time) (uint64, error)
}

// Ledger records every command sent, by its ID: a command whose entry
// exists is never sent again, whatever happens to the process, the stream's
// dedupe window or the replicas.
type Ledger interface {
	// Sent reports whether the command id was sent.
	Sent(ctx context.Context, id string) (bool, error)
	// MarkSent records that id was sent; an existing entry is not an error.
	MarkSent(ctx context.Context, id string, at time.Time) error
}

// Publisher sends commands. A bus publisher publishes with Nats-Msg-Id
// Command.ID and waits for the stream to store it; the simulate engine
// writes an output record.
type Publisher interface {
	// Publish sends msg to subject with Nats-Msg-Id id. verifySince, when
	// not zero, means the command may already have been published at or
	// after that time, longer ago than the stream's duplicate window
	// remembers: the publisher must look for id in the stream first and
	// not publish it again if it is there.
	Publish(ctx context.Context, id, subject string, msg events.Message, verifySince time.Time) error
}

// Prober is implemented by publishers that run built-in HTTP probes (the
// service; simulate has none).
type Prober interface {
	// HTTPProbe runs provider's configured probe once; seq numbers it
	// within the outage recoveryID. It must not block the caller for the
	// request's duration.
	HTTPProbe(ctx context.Context, provider, recoveryID string, seq int, at time.Time)
}
