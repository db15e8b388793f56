package events

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/wirecheck"
)

// Mirror types: the same fields and tags, none of the methods, so msgpack
// encodes and decodes them by reflection, as it did the real types before
// wirecodec.go. Converting between a type and its mirror is a Go
// conversion (identical underlying types), so the two are compared field
// for field.
type (
	outcomeMirror        Outcome
	classificationMirror Classification
	decisionMirror       Decision
)

func outcomeMir(v *Outcome) any               { return (*outcomeMirror)(v) }
func classificationMir(v *Classification) any { return (*classificationMirror)(v) }
func decisionMir(v *Decision) any             { return (*decisionMirror)(v) }

// TestWireCodecMatchesReflection: for random values of each type (every
// field filled or empty), the tables write exactly the bytes msgpack's
// reflection writes for the mirror type, under each encoder set-up, and
// read back what reflection reads, field for field.
func TestWireCodecMatchesReflection(t *testing.T) {
	t.Run("outcome", func(t *testing.T) {
		wirecheck.Match(t, 1, 2000, outcomeMir)
	})
	t.Run("classification", func(t *testing.T) {
		wirecheck.Match(t, 2, 2000, classificationMir)
	})
	t.Run("decision", func(t *testing.T) {
		wirecheck.Match(t, 3, 2000, decisionMir)
	})
}

// TestMarshalUsesTheTables: Marshal writes what reflection writes for
// the mirror with compact integers, as every service stores it.
func TestMarshalUsesTheTables(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	for i := range 1000 {
		o, c, d := new(Outcome), new(Classification), new(Decision)
		for _, m := range []struct {
			msg    Message
			mirror any
		}{{o, outcomeMir(o)}, {c, classificationMir(c)}, {d, decisionMir(d)}} {
			wirecheck.Fill(r, reflect.ValueOf(m.msg).Elem())
			got, err := Marshal(m.msg)
			if err != nil {
				t.Fatal(err)
			}
			if want := wirecheck.Encodings(t, m.mirror)[0]; !bytes.Equal(got, want) {
				t.Fatalf("%T value %d: Marshal wrote\n%x\nreflection wrote\n%x", m.msg, i, got, want)
			}
		}
	}
}

// TestWireDecodeNil: a nil read by DecodeMsgpack itself (msgpack answers
// a nil before calling it, but a caller may call it directly) leaves the
// zero value, as reflection does.
func TestWireDecodeNil(t *testing.T) {
	d := Decision{OutcomeID: "o", Agent: "a", Action: ActionRetry}
	if err := d.DecodeMsgpack(msgpack.NewDecoder(bytes.NewReader([]byte{0xc0}))); err != nil || !reflect.DeepEqual(d, Decision{}) {
		t.Errorf("nil decoded into %+v, %v; want the zero decision", d, err)
	}
}

// TestWireCodecTablesCoverEveryField: each table has one entry per
// msgpack key of its type, in field order, with the type's omitempty.
func TestWireCodecTablesCoverEveryField(t *testing.T) {
	wirecheck.CoversTags(t, reflect.TypeFor[Outcome](), outcomeWire.Keys)
	wirecheck.CoversTags(t, reflect.TypeFor[Classification](), classificationWire.Keys)
	wirecheck.CoversTags(t, reflect.TypeFor[Decision](), decisionWire.Keys)
}

// TestWireArrayForm: a struct in msgpack's array form reads as reflection
// reads it: every field in order when the length is the struct's, an
// error when it is not.
func TestWireArrayForm(t *testing.T) {
	for _, b := range wirecheck.EdgeSeeds(reflect.TypeFor[Decision]().NumField()) {
		if err := wirecheck.SameDecode(b, decisionMir); err != nil {
			t.Error(err)
		}
	}
	fields := []any{"o", nil, "a", "retry", "", "", "", 5, nil, 2, "r", "p", "m", "k"}
	full, _ := msgpack.Marshal(fields)
	var d Decision
	if err := msgpack.Unmarshal(full, &d); err != nil || d.OutcomeID != "o" || d.DelayMS != 5 || d.Retry != 2 || d.Profile != "k" {
		t.Errorf("array form read as %+v, %v", d, err)
	}
	long, _ := msgpack.Marshal(append(fields, "extra"))
	if err := msgpack.Unmarshal(long, &d); err == nil {
		t.Errorf("an array one longer than the struct read without an error: %+v", d)
	}
}

// FuzzWireDecode: for any bytes within the default Limits (what a service
// decodes: UnmarshalLimits scans first, so nesting deep enough to exhaust
// the stack never reaches either decoder), the tables and reflection
// agree on whether they decode, and on what they decode to.
func FuzzWireDecode(f *testing.F) {
	for _, seeds := range [][][]byte{
		wirecheck.Seeds(7, 20, outcomeMir),
		wirecheck.Seeds(8, 20, classificationMir),
		wirecheck.Seeds(9, 20, decisionMir),
	} {
		for _, b := range seeds {
			f.Add(b)
		}
	}
	// Beside Seeds' edge shapes, what only these types have.
	for _, b := range [][]byte{
		{0x91, 0x01},                      // an array of the wrong length
		{0x81, 0xa2, 'i', 'd', 0xc0},      // id: nil
		{0x81, 0xa2, 'a', 't', 0xa1, 'x'}, // a bad time
		{0x81, 0xa6, 's', 't', 'a', 't', 'u', 's', 0xcb, 0x40, 0x59, 0, 0, 0, 0, 0, 0},    // status 100.0
		{0x81, 0xa6, 'o', 'r', 'i', 'g', 'i', 'n', 0x93, 0xa1, 'a', 0xa1, 'b', 0xa1, 'c'}, // origin as an array
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if CheckMsgpack(data, Limits{}) != nil {
			return
		}
		for _, err := range []error{
			wirecheck.SameDecode(data, outcomeMir),
			wirecheck.SameDecode(data, classificationMir),
			wirecheck.SameDecode(data, decisionMir),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}
