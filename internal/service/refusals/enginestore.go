package refusals

import (
	"context"
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/policy/refusal"
)

// engineStore is engine.Refusals on the refusal bucket: the engine's
// Refuse, Route and Boundary stages read and write through it.
type engineStore struct{ s *Service }

// Update implements engine.Refusals: read, fn, compare-and-set write,
// again from a fresh read on a conflict. When fn writes nothing, a state
// older than half its TTL is rewritten unchanged (touch), so a segment
// still in use keeps its state.
func (es engineStore) Update(ctx context.Context, segment, provider string, _ time.Time, fn func(*refusal.Record, bool) (bool, error)) error {
	s := es.s
	store := s.Store()
	if store == nil {
		return errNotStarted
	}
	key := Key(segment, provider)
	for range MaxAttempts {
		cur, found, err := store.Get(ctx, key)
		if err != nil {
			return err
		}
		if cur.DecodeErr != nil {
			s.m.unreadable.Inc()
			s.log.Warn().Err(cur.DecodeErr).Str("key", key).Msg("unreadable refusal state: read conservatively")
		}
		rec := cur.Record
		write, err := fn(&rec, found)
		if err != nil {
			return err
		}
		if !write {
			if found {
				s.touch(ctx, store, cur)
			}
			return nil
		}
		rev := uint64(0)
		if found {
			rev = cur.Revision
		}
		if _, ok, err := store.Put(ctx, key, rec, rev); err != nil {
			return err
		} else if ok {
			return nil
		}
		s.m.conflicts.WithLabelValues("state").Inc()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("refusals: update %s: %w", key, err)
		}
	}
	return fmt.Errorf("%w: key %s, %d attempts", ErrTooManyConflicts, key, MaxAttempts)
}

// SegmentStates implements engine.Refusals.
func (es engineStore) SegmentStates(ctx context.Context, segment string, _ time.Time) ([]refusal.State, error) {
	store := es.s.Store()
	if store == nil {
		return nil, errNotStarted
	}
	return store.SegmentStates(ctx, segment)
}

// RetireBefore implements engine.Refusals; the bucket's TTL retires expired
// state on its own.
func (es engineStore) RetireBefore(ctx context.Context, session string, segment int, _ time.Time) ([]string, error) {
	store := es.s.Store()
	if store == nil {
		return nil, errNotStarted
	}
	return store.RetireBefore(ctx, session, segment)
}
