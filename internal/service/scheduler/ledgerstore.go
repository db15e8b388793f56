package scheduler

import (
	"context"
	"errors"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/scopestore"
)

// ledgerStore is engine.Ledger on the scheduler's ledger subjects in
// FAILBUS_RETRIES: a budget's revision is its last message's stream
// sequence, and Append is the publish with the expected last subject
// sequence.
type ledgerStore struct{ s *Service }

// Latest implements engine.Ledger.
func (l ledgerStore) Latest(ctx context.Context, budget string) (*retry.Record, uint64, error) {
	if g := guessing(ctx); g != nil {
		if r, seq, ok := l.s.index.guessLast(budget); ok {
			g.used = true
			if r == nil {
				return nil, seq, nil
			}
			return &r.entry.Record, seq, nil
		}
	}
	r, err := l.s.ledgerLast(ctx, budget)
	if err != nil || r == nil {
		return nil, 0, err
	}
	return &r.entry.Record, r.seq, nil
}

// Find implements engine.Ledger.
func (l ledgerStore) Find(ctx context.Context, budget, outcomeID string, from uint64) (*retry.Record, error) {
	if g := guessing(ctx); g != nil {
		if r, ok := l.s.index.guessFind(budget, outcomeID, from); ok {
			g.used = true
			if r == nil {
				return nil, nil
			}
			return &r.entry.Record, nil
		}
	}
	r, err := l.s.ledgerFind(ctx, budget, outcomeID, from)
	if err != nil || r == nil {
		return nil, err
	}
	return &r.entry.Record, nil
}

// Append implements engine.Ledger.
func (l ledgerStore) Append(ctx context.Context, rec *retry.Record, rev uint64) error {
	kind := "ledger"
	e := &LedgerEntry{Record: *rec}
	if rec.EndedBy != "" {
		// The mark a success ends a retry episode with: a copy of the
		// latest entry, which keeps the agent's started or cancel mark
		// (not part of retry.Record), or a redelivery finding it would
		// restore a cancelled schedule.
		kind = "ended"
		last, err := l.s.ledgerLast(ctx, rec.Budget().Token())
		if err != nil {
			return err
		}
		if last != nil && last.seq == rev && last.entry.RetryID == rec.RetryID {
			e.CancelledAt, e.StartedAt = last.entry.CancelledAt, last.entry.StartedAt
		}
	}
	g := guessing(ctx)
	_, dup, err := l.s.ledgerAppend(ctx, e, rev, kind)
	if g != nil && g.used && (dup || errors.Is(err, errLedgerConflict)) {
		// Decided on a guess that was wrong (see guess.go); a duplicate
		// means this outcome was decided before, which only a real read
		// tells apart from a fresh decision.
		g.wrong()
		l.s.m.guesses.WithLabelValues("wrong").Inc()
		return engine.ErrConflict
	}
	if errors.Is(err, errLedgerConflict) {
		l.s.m.conflicts.Inc()
		return engine.ErrConflict
	}
	if err == nil && g != nil && g.used {
		l.s.m.guesses.WithLabelValues("confirmed").Inc()
	}
	return err
}

// lateProviders is the engine's provider store, bound to FAILBUS_SCOPE by
// Run (New does no I/O); the engine holds a pointer to it.
type lateProviders struct{ *scopestore.Store }
