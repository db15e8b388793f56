package scheduler

import (
	"context"
)

// Deciding a failure on a guess of its budget's ledger.
//
// engine.Decide reads the budget's latest ledger entry before it decides,
// and for the first failure of a step (most of a retry storm: every agent
// fails at once, each on its own step) that read finds nothing, one round
// trip per failure for an answer the scheduler could have given itself.
// So the first Decide of a classification may take the ledger index's
// word (ledgerindex.go): the entries this replica read or wrote, or an
// empty budget when it knows nothing of it. A guess is never trusted on
// its own:
//   - a decision that appends to the ledger is checked by the append's
//     compare-and-set on the budget's last sequence: when the guess was
//     wrong (another replica, an index that forgot, an outcome published
//     again after the duplicate window), the append fails, guessing stops,
//     and the engine decides again from real reads; a duplicate
//     acknowledgement counts as wrong too;
//   - a decision that appends nothing (not retryable, the provider is
//     down, a replay) is made again from real reads before anything is
//     published (decide in retry.go), even on a first delivery: the same
//     outcome can come back as a new message (published again past the
//     duplicate window, a recreated durable replaying from its ack
//     floor), and only a read finds the retry it already has.
// Successes (engine.Succeeded) and the control consumer never guess.

// guess is one Decide's permission to answer ledger reads from the index.
type guess struct {
	// on: reads may still be answered from the index; off after a
	// conflict, so the engine's next round reads for real.
	on bool
	// used: a read was answered from the index while on.
	used bool
}

type guessKey struct{}

// withGuess lets the ledger reads of ctx's Decide answer from the index.
func withGuess(ctx context.Context) (context.Context, *guess) {
	g := &guess{on: true}
	return context.WithValue(ctx, guessKey{}, g), g
}

// guessing is ctx's guess while it may still answer, else nil.
func guessing(ctx context.Context) *guess {
	g, _ := ctx.Value(guessKey{}).(*guess)
	if g == nil || !g.on {
		return nil
	}
	return g
}

// wrong ends guessing for the rest of the Decide: the engine's next round
// reads the ledger.
func (g *guess) wrong() {
	g.on, g.used = false, false
}
