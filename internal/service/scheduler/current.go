package scheduler

import "context"

// Reads that must be current.
//
// A direct get of FAILBUS_RETRIES is answered by any of its replicas, one
// that has not applied the latest writes included. A decision that
// appends to the ledger is safe on such a read: the append is a
// compare-and-set on the budget's last sequence, which a stale read fails,
// and the engine reads again. A decision that appends nothing has no such
// check: a spent budget's give_up that misses the success which ended the
// episode, a success that misses the open episode it should end, a
// started or cancel mark taken for another retry's because the retry's
// own record is not there yet, a replay's schedule taken as neither
// pending nor fired. So on a replicated stream those are made from the
// stream leader's reads ($JS.API.STREAM.MSG.GET, which only the leader
// answers, and which holds every acknowledged write): the retry stage
// decides on direct (batched) reads first, and when its decision appends
// nothing it decides again from the leader's before carrying it out
// (decide in retry.go); successes and marks read the leader's at once. On
// one server the one copy is current, and every read stays a direct get.

type currentKey struct{}

// withCurrent makes the ledger reads of ctx current: the leader's, on a
// replicated stream.
func withCurrent(ctx context.Context) context.Context {
	return context.WithValue(ctx, currentKey{}, true)
}

// isCurrent reports whether ctx's reads must be current.
func isCurrent(ctx context.Context) bool {
	v, _ := ctx.Value(currentKey{}).(bool)
	return v
}

// current is ctx with current reads when FAILBUS_RETRIES is replicated.
func (s *Service) current(ctx context.Context) context.Context {
	if !s.replicated {
		return ctx
	}
	return withCurrent(ctx)
}
