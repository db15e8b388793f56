package scope

import (
	"reflect"
	"testing"

	"github.com/failbus/failbus/internal/wirecheck"
	"github.com/failbus/failbus/pkg/events"
)

// Mirrors: the same fields, none of the methods (msgpack's reflection).
// A state's mirror still holds Entry and Mark values, which use their own
// tables in both encodings; those tables are held to their mirrors first.
type (
	entryMirror Entry
	markMirror  Mark
	callMirror  Call
	stateMirror ProviderState
)

func entryMir(e *Entry) any         { return (*entryMirror)(e) }
func markMir(m *Mark) any           { return (*markMirror)(m) }
func callMir(k *Call) any           { return (*callMirror)(k) }
func stateMir(s *ProviderState) any { return (*stateMirror)(s) }

// TestCodecMatchesReflection: each table writes the bytes reflection
// writes for random values (every field filled or empty) under each
// encoder set-up, reads what reflection reads, and has the struct's keys
// in order.
func TestCodecMatchesReflection(t *testing.T) {
	t.Run("entry", func(t *testing.T) { wirecheck.Match(t, 21, 2000, entryMir) })
	t.Run("mark", func(t *testing.T) { wirecheck.Match(t, 22, 500, markMir) })
	t.Run("call", func(t *testing.T) { wirecheck.Match(t, 26, 500, callMir) })
	t.Run("state", func(t *testing.T) { wirecheck.Match(t, 23, 2000, stateMir) })
	wirecheck.CoversTags(t, reflect.TypeFor[Entry](), entryWire.Keys)
	wirecheck.CoversTags(t, reflect.TypeFor[Mark](), markWire.Keys)
	wirecheck.CoversTags(t, reflect.TypeFor[Call](), callWire.Keys)
	wirecheck.CoversTags(t, reflect.TypeFor[ProviderState](), stateWire.Keys)
}

// FuzzCodecDecode: for any bytes within the default Limits, the tables and
// reflection agree on whether they decode and on what.
func FuzzCodecDecode(f *testing.F) {
	for _, seeds := range [][][]byte{wirecheck.Seeds(24, 20, entryMir), wirecheck.Seeds(25, 20, stateMir)} {
		for _, b := range seeds {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if events.CheckMsgpack(data, events.Limits{}) != nil {
			return
		}
		for _, err := range []error{
			wirecheck.SameDecode(data, entryMir),
			wirecheck.SameDecode(data, markMir),
			wirecheck.SameDecode(data, callMir),
			wirecheck.SameDecode(data, stateMir),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}
