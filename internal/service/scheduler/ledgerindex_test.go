package scheduler

import (
	"testing"

	"github.com/failbus/failbus/internal/policy/retry"
)

func entryAt(outcome string, seq uint64) *ledgerRead {
	return &ledgerRead{entry: LedgerEntry{Record: retry.Record{OutcomeID: outcome}}, seq: seq}
}

// TestLedgerIndexReadsOnlyWhatItHasNotSeen: the index answers Find without
// a read exactly when it has seen the budget through the last sequence
// Latest read, and otherwise names the sequence to read from.
func TestLedgerIndexReadsOnlyWhatItHasNotSeen(t *testing.T) {
	var x ledgerIndex
	// Never read: a read from the start.
	if _, from, ok := x.find("b", "o1", 0); ok || from != 1 {
		t.Fatalf("unknown budget: ok %v from %d, want a read from 1", ok, from)
	}
	// Latest found it empty: nothing to read, nothing found.
	x.sawLast("b", nil)
	if got, _, ok := x.find("b", "o1", 0); !ok || got != nil {
		t.Fatalf("empty budget: %v %v, want nil without a read", got, ok)
	}
	// This replica appended o1 at 5 on top of the empty budget.
	x.appended("b", 0, entryAt("o1", 5))
	x.sawLast("b", entryAt("o1", 5))
	if got, _, ok := x.find("b", "o1", 0); !ok || got == nil || got.seq != 5 {
		t.Fatalf("after its own append: %v %v, want o1 at 5 without a read", got, ok)
	}
	// Another replica appended o2 at 9: Latest sees 9, Find reads from 6.
	x.sawLast("b", entryAt("o2", 9))
	if _, from, ok := x.find("b", "o1", 0); ok || from != 6 {
		t.Fatalf("after a foreign append: ok %v from %d, want a read from 6", ok, from)
	}
	if got := x.scanned("b", 6, []*ledgerRead{entryAt("o1", 7), entryAt("o2", 9)}, "o1", 0); got == nil || got.seq != 7 {
		t.Fatalf("scan: %v, want o1's latest entry (its mark at 7)", got)
	}
	if got, _, ok := x.find("b", "o1", 0); !ok || got.seq != 7 {
		t.Fatalf("after the scan: %v %v, want o1 at 7 without a read", got, ok)
	}
	// Only the current episode's entries count: o1's entry at 7 is before
	// an episode that began after 8.
	if got, _, ok := x.find("b", "o1", 8); !ok || got != nil {
		t.Fatalf("o1 from a later episode: %v %v, want nothing", got, ok)
	}
	// An append on a sequence the index has not seen through does not move
	// the watermark past the gap.
	x.appended("b", 12, entryAt("o3", 13))
	x.sawLast("b", entryAt("o3", 13))
	if _, from, ok := x.find("b", "o3", 0); ok || from != 10 {
		t.Fatalf("after an append past a gap: ok %v from %d, want a read from 10", ok, from)
	}
	// The budget removed (MaxAge): start over.
	x.sawLast("b", nil)
	if got, _, ok := x.find("b", "o1", 0); !ok || got != nil {
		t.Fatalf("after removal: %v %v, want nothing", got, ok)
	}
}

func TestLedgerIndexIsBounded(t *testing.T) {
	var x ledgerIndex
	for i := range maxIndexedBudgets + 10 {
		x.sawLast(string(rune('a'+i%26))+string(rune(i)), nil)
	}
	if n := x.lru.Len(); n != maxIndexedBudgets || len(x.m) != maxIndexedBudgets {
		t.Fatalf("%d budgets remembered (map %d), want %d", n, len(x.m), maxIndexedBudgets)
	}
}

// TestLedgerIndexGuesses: the index guesses an untouched budget for one it
// holds nothing of, the last entry for one it has seen whole, and declines
// (a real read) for one it has seen only in part.
func TestLedgerIndexGuesses(t *testing.T) {
	var x ledgerIndex
	if r, seq, ok := x.guessLast("new"); !ok || r != nil || seq != 0 {
		t.Fatalf("unknown budget: %v %d %v, want an untouched budget", r, seq, ok)
	}
	if r, ok := x.guessFind("new", "o1", 0); !ok || r != nil {
		t.Fatalf("unknown budget find: %v %v, want nothing", r, ok)
	}
	if _, held := x.m["new"]; held {
		t.Fatal("guessing created an index entry")
	}
	// Its own append on an empty budget (compare-and-set on 0): the index
	// has seen it whole.
	x.appended("b", 0, entryAt("o1", 5))
	if r, seq, ok := x.guessLast("b"); !ok || r == nil || r.entry.OutcomeID != "o1" || seq != 5 {
		t.Fatalf("after its own first append: %v %d %v, want o1 at 5", r, seq, ok)
	}
	if r, ok := x.guessFind("b", "o1", 0); !ok || r == nil || r.seq != 5 {
		t.Fatalf("find after its own append: %v %v, want o1 at 5", r, ok)
	}
	// A read shows another replica's entry at 9: seen in part, no guess.
	x.sawLast("b", entryAt("o2", 9))
	if _, _, ok := x.guessLast("b"); ok {
		t.Fatal("budget seen in part: guessed, want a real read")
	}
	if _, ok := x.guessFind("b", "o1", 0); ok {
		t.Fatal("budget seen in part: find guessed, want a real read")
	}
	// Scanned through 9: whole again.
	x.scanned("b", 6, []*ledgerRead{entryAt("o2", 9)}, "o1", 0)
	if r, seq, ok := x.guessLast("b"); !ok || r.entry.OutcomeID != "o2" || seq != 9 {
		t.Fatalf("after the scan: %v %d %v, want o2 at 9", r, seq, ok)
	}
}
