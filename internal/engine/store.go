package engine

import (
	"context"
	"errors"
	"time"

	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/pkg/events"
)

// ErrConflict is what a store returns when a compare-and-set write lost to
// another writer; the stage that wrote reads again and redoes its change.
// Stores that do their own compare-and-set loop (the Update methods) never
// return it.
var ErrConflict = errors.New("engine: state changed concurrently")

// Stores is the state the stages read and write, one small interface per
// concern. Memory implements every one in memory (simulate, shadow, tests);
// the services implement the ones they use on JetStream: the scheduler the
// Providers (KV, FAILBUS_SCOPE) and the Ledger (the FAILBUS_RETRIES
// stream), the refusal tiers the Refusals (KV, FAILBUS_REFUSALS); the
// notifier runs the same admission rules (notification.Admit) inside its
// own delivery protocol; the recovery service implements Recovery on KV
// and streams (internal/service/recoverer). A nil store disables the stages
// that need it.
//
// Adding state for a new stage: add its interface here, a field to Stores,
// its in-memory implementation to Memory, and the stage method that uses
// it (as Recovery did).
type Stores struct {
	Providers  Providers
	Ledger     Ledger
	Refusals   Refusals
	Admissions Admissions
	Timers     Timers
	// Recovery is the recovery stage's state (internal/policy/recovery.Store):
	// provider episodes and held-task ranges, heartbeats, crons, writes,
	// tasks, the command ledger. Nil disables the stage.
	Recovery recovery.Store
}

// ProviderRecord is what Providers keeps per provider: the fault-scope state
// and the outbox of records its last change produced, kept in the same
// compare-and-set unit so that a process dying between the write and the
// publish loses nothing: the next writer of the provider finds them and
// publishes them again (Observe returns them), under the same message ids.
type ProviderRecord struct {
	State scope.ProviderState `msgpack:"state" json:"state"`
	// Seq numbers the changes that produced records; their message ids
	// derive from it (EffectID).
	Seq uint64 `msgpack:"seq,omitempty" json:"seq,omitempty"`
	// Outbox holds the records change Seq produced until they are known to
	// be published (Settle).
	Outbox []Effect `msgpack:"outbox,omitempty" json:"outbox,omitempty"`
}

// Effect is one record a stage asks to publish, with the Nats-Msg-Id that
// makes publishing it again harmless within the stream's duplicate window.
// Exactly one of the records is set.
type Effect struct {
	MsgID        string               `msgpack:"msg_id" json:"msg_id"`
	Health       *events.Health       `msgpack:"health,omitempty" json:"health,omitempty"`
	Notification *events.Notification `msgpack:"notification,omitempty" json:"notification,omitempty"`
}

// Providers keeps one ProviderRecord per provider. Scheduler replicas share
// it, so two of them cannot disagree about an outage.
type Providers interface {
	// Get returns provider's record; nil when it has none.
	Get(ctx context.Context, provider string) (*ProviderRecord, error)
	// Update calls fn with provider's record (a zero record with the
	// provider set when it has none) and stores what fn left in it when fn
	// returns true, with compare-and-set: when another writer changed the
	// record first, fn runs again on a fresh copy. fn may run several times
	// and must not keep anything from a run that was not stored. When fn
	// stores nothing, nothing checks its copy: a store may have started
	// it from its own last write (scopestore), so such a run must not act
	// on the record being the latest (Settle only clears an outbox up to a
	// sequence, which only grows).
	//
	// One Update can fold many classifications of the provider (one lane
	// per provider, one write per batch): ObserveBatch does.
	Update(ctx context.Context, provider string, fn func(*ProviderRecord) (bool, error)) error
}

// Ledger is the retry ledger (persist before waiting): the
// records of each retry budget, the latest of which is the budget's count.
type Ledger interface {
	// Latest returns the budget's latest record and its revision; nil and
	// 0 when the budget is untouched.
	Latest(ctx context.Context, budget string) (*retry.Record, uint64, error)
	// Find returns the latest record written for outcomeID in the budget
	// after revision from (0: from the start); nil when there is none.
	Find(ctx context.Context, budget, outcomeID string, from uint64) (*retry.Record, error)
	// Append stores rec as the budget's latest record if the budget's
	// revision is still rev; ErrConflict otherwise.
	Append(ctx context.Context, rec *retry.Record, rev uint64) error
}

// Refusals keeps one refusal.Record per (segment, provider), with the
// refusal bucket's time-to-live backstop (refusal.Config.StateTTL).
type Refusals interface {
	// Update calls fn with the record of provider in segment at now
	// (found false when there is none or it expired) and stores what fn
	// left in it when fn returns true, with compare-and-set, running fn
	// again on a fresh copy after a conflict. When fn returns false the
	// store may still rewrite the record unchanged to refresh its
	// time-to-live (refusal.TouchDue): a segment still in use keeps its
	// state.
	Update(ctx context.Context, segment, provider string, now time.Time, fn func(rec *refusal.Record, found bool) (bool, error)) error
	// SegmentStates returns the live state of every provider in segment.
	SegmentStates(ctx context.Context, segment string, now time.Time) ([]refusal.State, error)
	// RetireBefore deletes the state of every segment of session numbered
	// below segment, and returns their keys.
	RetireBefore(ctx context.Context, session string, segment int, now time.Time) ([]string, error)
}

// Admissions keeps what notification admission needs: each dedupe key's
// state and each UTC day's budget record.
type Admissions interface {
	// Key returns the dedupe key's state.
	Key(ctx context.Context, key string) (notification.KeyState, error)
	// Day returns the UTC day's budget record.
	Day(ctx context.Context, day string) (notification.Day, error)
	// Put stores a key's state and a day's record together.
	Put(ctx context.Context, key string, ks notification.KeyState, day notification.Day) error
}

// Timers holds scheduled retries until they come due: JetStream message
// schedules on the bus, a queue in memory for simulate.
type Timers interface {
	// Schedule adds rec's due time; once per retry id.
	Schedule(ctx context.Context, rec *retry.Record) error
	// Due removes and returns every retry due at or before now, in due
	// order.
	Due(ctx context.Context, now time.Time) ([]retry.Record, error)
}
