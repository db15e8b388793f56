package events

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
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

// wireCase is one type under test: a fresh value of it and of its mirror,
// and the mirror of a value.
type wireCase struct {
	name   string
	fresh  func() any
	mirror func() any
	toMir  func(any) any
}

var wireCases = []wireCase{
	{"outcome", func() any { return new(Outcome) }, func() any { return new(outcomeMirror) }, func(v any) any { return (*outcomeMirror)(v.(*Outcome)) }},
	{"classification", func() any { return new(Classification) }, func() any { return new(classificationMirror) }, func(v any) any { return (*classificationMirror)(v.(*Classification)) }},
	{"decision", func() any { return new(Decision) }, func() any { return new(decisionMirror) }, func(v any) any { return (*decisionMirror)(v.(*Decision)) }},
}

// fill sets every exported field of the struct v points to at random:
// empty half of the time (so omitempty is exercised both ways), otherwise
// a value of its kind, including edge integers. Fields added to a type
// later are filled too, so a table that misses one fails the test.
func fill(r *rand.Rand, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if r.IntN(3) == 0 {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		p := reflect.New(v.Type().Elem())
		fill(r, p.Elem())
		v.Set(p)
		return
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[Time]() {
			if r.IntN(2) == 0 {
				v.Set(reflect.Zero(v.Type()))
			} else {
				v.Set(reflect.ValueOf(FromMillis(r.Int64N(4_000_000_000_000))))
			}
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(r, v.Field(i))
			}
		}
		return
	}
	if r.IntN(2) == 0 {
		v.Set(reflect.Zero(v.Type()))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(randString(r))
	case reflect.Int, reflect.Int64:
		edges := []int64{1, -1, 127, 128, -32, -33, 255, 256, 65535, 65536, math.MaxInt32, math.MaxInt32 + 1, math.MaxInt64, math.MinInt64}
		if r.IntN(2) == 0 {
			v.SetInt(edges[r.IntN(len(edges))])
		} else {
			v.SetInt(r.Int64N(1<<40) - 1<<39)
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		n := r.IntN(4)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := range n {
			fill(r, s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		// One key at most: msgpack writes a map in Go's map order, so
		// two keys would make the bytes differ between two runs of the
		// same encoder.
		m := reflect.MakeMap(v.Type())
		if r.IntN(3) > 0 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			k.SetString(randString(r))
			fill(r, e)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	default:
		panic(fmt.Sprintf("fill: no case for %s", v.Type()))
	}
}

func randString(r *rand.Rand) string {
	lens := []int{0, 1, 31, 32, 255, 256, 70000}
	n := r.IntN(12)
	if r.IntN(8) == 0 {
		n = lens[r.IntN(len(lens))]
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = "abcxyz-_. é"[r.IntN(12)]
	}
	return string(b)
}

// encodings of v by every encoder set-up the code uses: Marshal's
// (compact ints), a default encoder's, and MarshalSorted's.
func encodings(t *testing.T, v any) [3][]byte {
	t.Helper()
	var out [3][]byte
	for i, setup := range []func(*msgpack.Encoder){
		func(e *msgpack.Encoder) { e.UseCompactInts(true) },
		func(*msgpack.Encoder) {},
		func(e *msgpack.Encoder) { e.SetSortMapKeys(true) },
	} {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		setup(enc)
		if err := enc.Encode(v); err != nil {
			t.Fatalf("encode %T: %v", v, err)
		}
		out[i] = buf.Bytes()
	}
	return out
}

// TestWireCodecMatchesReflection: for random values of each type (every
// field filled or empty), the tables write exactly the bytes msgpack's
// reflection writes for the mirror type, under each encoder set-up, and
// read back what reflection reads, field for field.
func TestWireCodecMatchesReflection(t *testing.T) {
	for _, c := range wireCases {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(len(c.name))))
			for i := range 2000 {
				v := c.fresh()
				fill(r, reflect.ValueOf(v).Elem())
				got, want := encodings(t, v), encodings(t, c.toMir(v))
				for k := range got {
					if !bytes.Equal(got[k], want[k]) {
						t.Fatalf("value %d, encoder set-up %d: table wrote\n%x\nreflection wrote\n%x\nfor %+v", i, k, got[k], want[k], v)
					}
				}
				back, backMir := c.fresh(), c.mirror()
				if err := msgpack.Unmarshal(got[1], back); err != nil {
					t.Fatalf("value %d: decode: %v", i, err)
				}
				if err := msgpack.Unmarshal(got[1], backMir); err != nil {
					t.Fatalf("value %d: reflective decode: %v", i, err)
				}
				if !reflect.DeepEqual(c.toMir(back), backMir) {
					t.Fatalf("value %d: table read\n%+v\nreflection read\n%+v", i, back, backMir)
				}
			}
		})
	}
}

// TestWireCodecTablesCoverEveryField: each table has one entry per
// msgpack key of its type, in field order, with the type's omitempty.
func TestWireCodecTablesCoverEveryField(t *testing.T) {
	type entry struct {
		name      string
		omitEmpty bool
	}
	tableOf := func(fields int, name func(int) string, omits func(int) bool) []entry {
		var out []entry
		for i := range fields {
			out = append(out, entry{name(i), omits(i)})
		}
		return out
	}
	for _, c := range []struct {
		typ   reflect.Type
		table []entry
	}{
		{reflect.TypeFor[Outcome](), tableOf(len(outcomeWire.fields), func(i int) string { return outcomeWire.fields[i].name }, func(i int) bool { return outcomeWire.fields[i].empty != nil })},
		{reflect.TypeFor[Classification](), tableOf(len(classificationWire.fields), func(i int) string { return classificationWire.fields[i].name }, func(i int) bool { return classificationWire.fields[i].empty != nil })},
		{reflect.TypeFor[Decision](), tableOf(len(decisionWire.fields), func(i int) string { return decisionWire.fields[i].name }, func(i int) bool { return decisionWire.fields[i].empty != nil })},
	} {
		var want []entry
		for i := range c.typ.NumField() {
			tag := c.typ.Field(i).Tag.Get("msgpack")
			name, opts, _ := cutComma(tag)
			want = append(want, entry{name, opts == "omitempty"})
		}
		if !reflect.DeepEqual(c.table, want) {
			t.Errorf("%s: table %v, struct tags %v", c.typ, c.table, want)
		}
	}
}

func cutComma(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == ',' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// FuzzWireDecode: for any bytes within the default Limits (what a service
// decodes: UnmarshalLimits scans first, so nesting deep enough to exhaust
// the stack never reaches either decoder), the tables and reflection
// agree on whether they decode, and on what they decode to.
func FuzzWireDecode(f *testing.F) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, c := range wireCases {
		for range 20 {
			v := c.fresh()
			fill(r, reflect.ValueOf(v).Elem())
			b, err := msgpack.Marshal(c.toMir(v))
			if err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	for _, b := range [][]byte{
		{0xc0},                       // nil
		{0x90},                       // empty array
		{0x91, 0x01},                 // array of the wrong length
		{0x81, 0xc0, 0x01},           // nil key
		{0x81, 0xa2, 'i', 'd', 0xc0}, // id: nil
		{0x82, 0xa2, 'i', 'd', 0xa1, 'a', 0xa2, 'i', 'd', 0xa1, 'b'},                   // a key twice
		{0x81, 0xa2, 'a', 't', 0xa1, 'x'},                                              // a bad time
		{0x81, 0xa6, 's', 't', 'a', 't', 'u', 's', 0xcb, 0x40, 0x59, 0, 0, 0, 0, 0, 0}, // status 100.0
		{0x81, 0xd9, 0x28, 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 0x01}, // a long unknown key
		{0xd4, 0x01, 0x01}, // an ext where a map belongs
		{0x81, 0xa6, 'o', 'r', 'i', 'g', 'i', 'n', 0x93, 0xa1, 'a', 0xa1, 'b', 0xa1, 'c'}, // origin as an array
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if CheckMsgpack(data, Limits{}) != nil {
			return
		}
		for _, c := range wireCases {
			got, want := c.fresh(), c.mirror()
			gotErr := msgpack.Unmarshal(data, got)
			wantErr := msgpack.Unmarshal(data, want)
			if (gotErr == nil) != (wantErr == nil) {
				t.Fatalf("%s: %x: table error %v, reflection error %v", c.name, data, gotErr, wantErr)
			}
			if gotErr == nil && !reflect.DeepEqual(c.toMir(got), want) {
				t.Fatalf("%s: %x: table read\n%+v\nreflection read\n%+v", c.name, data, got, want)
			}
		}
	})
}
