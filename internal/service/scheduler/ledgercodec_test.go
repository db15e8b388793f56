package scheduler

import (
	"reflect"
	"testing"

	"github.com/failbus/failbus/internal/wirecheck"
	"github.com/failbus/failbus/pkg/events"
)

// ledgerMirror has LedgerEntry's fields and none of its methods: msgpack
// reads and writes it by reflection, as it did LedgerEntry before
// ledgerWire.
type ledgerMirror LedgerEntry

func ledgerMir(e *LedgerEntry) any { return (*ledgerMirror)(e) }

// TestLedgerCodecMatchesReflection: ledgerWire writes the bytes reflection
// writes for random entries (every field filled or empty) under each
// encoder set-up and reads back what reflection reads; its keys are the
// struct's, in order, retry.Record's inlined.
func TestLedgerCodecMatchesReflection(t *testing.T) {
	wirecheck.Match(t, 11, 3000, ledgerMir)
	wirecheck.CoversTags(t, reflect.TypeFor[LedgerEntry](), ledgerWire.Keys)
}

// FuzzLedgerDecode: for any bytes within the default Limits, ledgerWire
// and reflection agree on whether they decode and on what.
func FuzzLedgerDecode(f *testing.F) {
	for _, b := range wirecheck.Seeds(12, 30, ledgerMir) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if events.CheckMsgpack(data, events.Limits{}) != nil {
			return
		}
		if err := wirecheck.SameDecode(data, ledgerMir); err != nil {
			t.Fatal(err)
		}
	})
}
