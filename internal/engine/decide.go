package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/pkg/events"
)

// MaxConflicts bounds the compare-and-set rounds of one stage: losing this
// many races in a row on one key means heavy contention, and the stage
// fails so its input is redelivered later.
const MaxConflicts = 32

// Decided is what the retry stage decided for one failure.
type Decided struct {
	retry.Verdict
}

// Decide is the retry stage (retry.Decide): the decision for
// failure c, given the fault scope's verdict, against its budget's ledger.
// A retry's record is appended to the Ledger BEFORE Decide returns (persist
// before waiting), with compare-and-set on the budget, so racing deliveries
// or replicas never both spend one retry; the caller then schedules it and
// publishes the decision. A classification whose outcome already has a
// record in its budget is a redelivery: the verdict is that record again
// (Replayed), whatever the scope says now, and nothing is spent.
//
// Successes and content refusals are not this stage's: for them it returns
// a zero Decided (the refusal tiers decide refusals, Refuse).
func (e *Engine) Decide(ctx context.Context, c events.Classification, verdict scope.Verdict, now time.Time) (Decided, error) {
	if c.Class == events.ClassOK || c.Class == events.ClassContentRefusal {
		return Decided{}, nil
	}
	rp := e.cur.Load().retryFor(c.Provider)
	u := retry.JitterU(c.OutcomeID, e.seed)
	for range MaxConflicts {
		var (
			prior *retry.Record
			rev   uint64
			sv    = verdict
		)
		if rp != nil {
			if e.stores.Ledger == nil {
				return Decided{}, fmt.Errorf("engine: decide %s: no retry ledger", c.OutcomeID)
			}
			budget := retry.BudgetFor(c, rp).Token()
			latest, r, err := e.stores.Ledger.Latest(ctx, budget)
			if err != nil {
				return Decided{}, fmt.Errorf("engine: decide %s: %w", c.OutcomeID, err)
			}
			prior, rev = latest, r
			if latest == nil || latest.OutcomeID != c.OutcomeID {
				// A later outcome of the budget may have been decided
				// while this one waited for redelivery: look it up.
				var from uint64
				if latest != nil {
					from = latest.EpisodeFrom
				}
				own, err := e.stores.Ledger.Find(ctx, budget, c.OutcomeID, from)
				if err != nil {
					return Decided{}, fmt.Errorf("engine: decide %s: %w", c.OutcomeID, err)
				}
				if own != nil {
					prior = own
				}
			}
			if prior != nil && prior.OutcomeID == c.OutcomeID {
				// Persisted before: the retry stands whatever the scope
				// says now; retry.Decide rebuilds it from the record.
				sv = scope.Verdict{}
			}
		}
		v := retry.Decide(retry.Input{Classification: c, Policy: rp, Scope: sv, Prior: prior, Now: now, U: u})
		if v.Record == nil || v.Replayed {
			return Decided{Verdict: v}, nil
		}
		if prior != nil && !retry.Positioned(c) {
			// Where this record's episode began in the ledger: after the
			// latest record when it begins one, else where prior's did.
			v.Record.EpisodeFrom = prior.EpisodeFrom
			if v.Record.Retry == 1 {
				v.Record.EpisodeFrom = rev
			}
		}
		err := e.stores.Ledger.Append(ctx, v.Record, rev)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return Decided{}, fmt.Errorf("engine: decide %s: %w", c.OutcomeID, err)
		}
		return Decided{Verdict: v}, nil
	}
	return Decided{}, fmt.Errorf("engine: decide %s: %w %d times in a row", c.OutcomeID, ErrConflict, MaxConflicts)
}

// MayEndEpisode reports whether Succeeded may have work for c: a success
// without turn and step, of a provider with a retry policy, on an engine
// with a ledger. A caller may fold any other success into the fault
// scope without waiting for it (the scheduler's lanes do).
func (e *Engine) MayEndEpisode(c events.Classification) bool {
	return e.episodePolicy(c) != nil
}

// episodePolicy is the retry policy whose episode success c may end; nil
// when it ends none.
func (e *Engine) episodePolicy(c events.Classification) *retry.Policy {
	if c.Class != events.ClassOK || retry.Positioned(c) || e.stores.Ledger == nil {
		return nil
	}
	return e.cur.Load().retryFor(c.Provider)
}

// Succeeded is the retry stage's part in a success: for an outcome without
// turn and step, it ends the agent's open retry episode on the provider
// and model (retry.EndEpisode: a mark appended to the budget's ledger with
// compare-and-set), so the agent's next failure begins a new one. A
// success with a turn or step, of a provider without a retry policy, or
// with no open episode changes nothing and costs no write.
func (e *Engine) Succeeded(ctx context.Context, c events.Classification, now time.Time) error {
	rp := e.episodePolicy(c)
	if rp == nil {
		return nil
	}
	budget := retry.BudgetFor(c, rp).Token()
	for range MaxConflicts {
		latest, rev, err := e.stores.Ledger.Latest(ctx, budget)
		if err != nil {
			return fmt.Errorf("engine: success %s: %w", c.OutcomeID, err)
		}
		end := retry.EndEpisode(c, latest, now)
		if end == nil {
			return nil
		}
		err = e.stores.Ledger.Append(ctx, end, rev)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return fmt.Errorf("engine: success %s: %w", c.OutcomeID, err)
		}
		return nil
	}
	return fmt.Errorf("engine: success %s: %w %d times in a row", c.OutcomeID, ErrConflict, MaxConflicts)
}
