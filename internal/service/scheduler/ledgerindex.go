package scheduler

import (
	"container/list"
	"sync"
)

// maxIndexedBudgets bounds the budgets the ledger index remembers; past it
// the least recently used is forgotten (its ledger is read from the start
// again when next needed). A budget's entries are a few hundred bytes
// each, so this keeps the index within a few MB.
const maxIndexedBudgets = 4096

// ledgerIndex remembers, per budget, the ledger entries this replica has
// read or written, by outcome, and the stream sequence through which it has
// seen every entry of the budget's subject (the watermark). Ledger messages
// never change once stored, so what it remembers stays true; what it has
// not seen is read from the watermark on. With it, engine.Decide's
// Latest-then-Find costs one read of the last entry instead of a walk of
// the whole budget, and the first Decide of a failure may take the
// index's word without reading at all (guess.go). Safe for concurrent use;
// compare-and-set on the subject still decides every write: an index that
// lags (another replica appended) makes Find read more, or makes a guessed
// decision's append fail and the failure be decided again from reads.
type ledgerIndex struct {
	mu  sync.Mutex
	m   map[string]*list.Element // budget token → *budgetIndex
	lru list.List                // front: most recently used
}

type budgetIndex struct {
	token string
	// through: every entry of the subject up to this sequence is in
	// byOutcome (0: none seen, or the budget was empty).
	through uint64
	// last is the budget's last sequence as far as this replica knows
	// (ledgerLast's read, or its own appends and scans; 0: untouched);
	// known is false until it has read or written it once.
	last  uint64
	known bool
	// lastEntry is the entry at sequence last when the index has it.
	lastEntry *ledgerRead
	// byOutcome holds the latest entry seen per outcome id.
	byOutcome map[string]*ledgerRead
}

// budget returns token's index, created if needed; call with mu held.
func (x *ledgerIndex) budget(token string) *budgetIndex {
	if x.m == nil {
		x.m = map[string]*list.Element{}
	}
	if el, ok := x.m[token]; ok {
		x.lru.MoveToFront(el)
		return el.Value.(*budgetIndex)
	}
	b := &budgetIndex{token: token, byOutcome: map[string]*ledgerRead{}}
	x.m[token] = x.lru.PushFront(b)
	for x.lru.Len() > maxIndexedBudgets {
		old := x.lru.Back()
		x.lru.Remove(old)
		delete(x.m, old.Value.(*budgetIndex).token)
	}
	return b
}

// keep records r as outcome's latest entry unless a later one is known.
func (b *budgetIndex) keep(r *ledgerRead) {
	if cur, ok := b.byOutcome[r.entry.OutcomeID]; !ok || cur.seq < r.seq {
		b.byOutcome[r.entry.OutcomeID] = r
	}
}

// sawLast records what ledgerLast read: the budget's last entry, or nil
// for an untouched budget.
func (x *ledgerIndex) sawLast(token string, r *ledgerRead) {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.budget(token)
	b.known = true
	if r == nil {
		// Untouched now: whatever was remembered was removed meanwhile
		// (a purge, MaxAge); start over.
		b.through, b.last, b.lastEntry, b.byOutcome = 0, 0, nil, map[string]*ledgerRead{}
		return
	}
	b.last = r.seq
	b.lastEntry = r
	b.keep(r)
}

// find answers from the index when it has seen the budget through its last
// sequence as read by the latest ledgerLast: outcome's latest entry after
// sequence after (the current retry episode's start; 0 for all);
// otherwise ok is false and next is the sequence to read the subject from.
func (x *ledgerIndex) find(token, outcomeID string, after uint64) (found *ledgerRead, next uint64, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.budget(token)
	if b.known && b.through >= b.last {
		return b.after(outcomeID, after), 0, true
	}
	return nil, max(b.through, after) + 1, false
}

// after is outcome's latest entry if it lies after sequence seq.
func (b *budgetIndex) after(outcomeID string, seq uint64) *ledgerRead {
	if r := b.byOutcome[outcomeID]; r != nil && r.seq > seq {
		return r
	}
	return nil
}

// scanned merges the entries read from sequence from to the subject's end
// and answers the lookup (entries after sequence after only).
func (x *ledgerIndex) scanned(token string, from uint64, read []*ledgerRead, outcomeID string, after uint64) *ledgerRead {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.budget(token)
	end := from - 1
	for _, r := range read {
		b.keep(r)
		end = r.seq
		if r.seq >= b.last {
			b.lastEntry = r
		}
	}
	if b.through >= from-1 { // nothing between the watermark and from went unread
		b.through = max(b.through, end)
	}
	b.last = max(b.last, end)
	b.known = true
	return b.after(outcomeID, after)
}

// appended records an entry this replica stored at r.seq with
// compare-and-set on expect, the budget's last sequence before it: when
// the index had seen everything through expect, it has now seen everything
// through r.seq.
func (x *ledgerIndex) appended(token string, expect uint64, r *ledgerRead) {
	x.mu.Lock()
	defer x.mu.Unlock()
	b := x.budget(token)
	if expect == 0 {
		// Compare-and-set on 0 succeeded: the budget was empty, so r is
		// all of it; whatever was remembered was removed meanwhile (a
		// purge, MaxAge), as sawLast(nil) says.
		b.known, b.through, b.last, b.lastEntry, b.byOutcome = true, 0, 0, nil, map[string]*ledgerRead{}
	}
	b.keep(r)
	if b.known && b.through >= expect {
		b.through = r.seq
	}
	if r.seq >= b.last {
		b.last, b.lastEntry = r.seq, r
	}
}

// guessLast is the index's word on the budget's last entry and sequence,
// without reading (guess.go): an untouched budget when it holds nothing of
// it, the last entry when it has seen every entry of the budget through
// the last sequence it knows; ok is false otherwise (read for real).
// Possibly stale either way: only a compare-and-set on the answer makes
// it true.
func (x *ledgerIndex) guessLast(token string) (r *ledgerRead, seq uint64, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	b, ok := x.whole(token)
	if !ok || b == nil || b.last == 0 {
		return nil, 0, ok
	}
	return b.lastEntry, b.last, true
}

// guessFind is find without reading (guess.go): nothing when the index
// holds nothing of the budget, outcome's latest entry after sequence
// after when it has seen the whole budget; ok is false otherwise.
func (x *ledgerIndex) guessFind(token, outcomeID string, after uint64) (r *ledgerRead, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	b, ok := x.whole(token)
	if !ok || b == nil {
		return nil, ok
	}
	return b.after(outcomeID, after), true
}

// whole is what a guess may answer from: nil and true when the index
// holds nothing of the budget, its index and true when it has seen the
// budget whole, false otherwise (read for real). It does not create an
// entry; call with mu held.
func (x *ledgerIndex) whole(token string) (*budgetIndex, bool) {
	el, held := x.m[token]
	if !held {
		return nil, true
	}
	b := el.Value.(*budgetIndex)
	return b, b.complete()
}

// complete: the index has seen every entry of the budget through its
// last known sequence, and holds the entry there.
func (b *budgetIndex) complete() bool {
	if !b.known || b.through < b.last {
		return false
	}
	return b.last == 0 || (b.lastEntry != nil && b.lastEntry.seq == b.last)
}
