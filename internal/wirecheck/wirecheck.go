// Package wirecheck holds a hand-written msgpack codec (wire.FieldTable)
// to what msgpack's reflection does for the same struct tags: tests give
// it a type with the codec and a mirror type (the same fields, none of
// the methods) and it compares bytes written and values read, on random
// values that fill every exported field, so a field added to a type but
// not to its table fails the test.
package wirecheck

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Fill sets every exported field of v (addressable) at random: empty half
// of the time, so omitempty is exercised both ways, otherwise a value of
// its kind, edge integers included. A struct that decodes itself and says
// when it is zero (events.Time) is filled by decoding a random msgpack
// timestamp into it. Maps get one key at most: msgpack
// writes a map in Go's map order, so two keys would make two encodings of
// one value differ.
func Fill(r *rand.Rand, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if r.IntN(3) == 0 {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		p := reflect.New(v.Type().Elem())
		Fill(r, p.Elem())
		v.Set(p)
		return
	case reflect.Struct:
		if d, ok := v.Addr().Interface().(timeLike); ok {
			if r.IntN(2) == 0 {
				v.Set(reflect.Zero(v.Type()))
				return
			}
			b, err := msgpack.Marshal(time.UnixMilli(r.Int64N(4_000_000_000_000)).UTC())
			if err != nil {
				panic(err)
			}
			if err := d.DecodeMsgpack(msgpack.NewDecoder(bytes.NewReader(b))); err != nil {
				panic(fmt.Sprintf("fill %s: %v", v.Type(), err))
			}
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				Fill(r, v.Field(i))
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
	case reflect.Uint64:
		edges := []uint64{1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxUint64}
		if r.IntN(2) == 0 {
			v.SetUint(edges[r.IntN(len(edges))])
		} else {
			v.SetUint(r.Uint64N(1 << 40))
		}
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		n := r.IntN(4)
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := range n {
			Fill(r, s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		if r.IntN(3) > 0 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			k.SetString(randString(r))
			Fill(r, e)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	default:
		panic(fmt.Sprintf("wirecheck.Fill: no case for %s", v.Type()))
	}
}

// timeLike is a scalar struct that decodes itself (events.Time): filled
// by decoding a timestamp into it, not field by field.
type timeLike interface {
	msgpack.CustomDecoder
	IsZero() bool
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

// Encodings are v's bytes under each encoder set-up failbus uses:
// events.Marshal's (compact ints), a default encoder's, and
// wire.MarshalSorted's (sorted map keys).
func Encodings(t testing.TB, v any) [3][]byte {
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

// Match checks n random values of T (seeded by seed): the bytes T's codec
// writes equal what reflection writes for mirror(v), under each of
// Encodings' set-ups, and what T's codec reads back equals what reflection
// reads into a fresh mirror. mirror converts a *T to a pointer to its
// mirror type (a Go conversion: the types have identical fields).
func Match[T any](t *testing.T, seed uint64, n int, mirror func(*T) any) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed))
	for i := range n {
		v := new(T)
		Fill(r, reflect.ValueOf(v).Elem())
		// Through a pointer, and as a value (not addressable: a map
		// value, a struct passed by value), both as reflection writes.
		got, byValue, want := Encodings(t, v), Encodings(t, *v), Encodings(t, mirror(v))
		for k := range got {
			if !bytes.Equal(got[k], want[k]) {
				t.Fatalf("%T value %d, encoder set-up %d: the table wrote\n%x\nreflection wrote\n%x\nfor %+v", v, i, k, got[k], want[k], v)
			}
			if !bytes.Equal(byValue[k], want[k]) {
				t.Fatalf("%T value %d by value, encoder set-up %d: the table wrote\n%x\nreflection wrote\n%x\nfor %+v", v, i, k, byValue[k], want[k], v)
			}
		}
		back, backMir := new(T), freshMirror(mirror)
		if err := msgpack.Unmarshal(got[1], back); err != nil {
			t.Fatalf("%T value %d: decode: %v", v, i, err)
		}
		if err := msgpack.Unmarshal(got[1], backMir); err != nil {
			t.Fatalf("%T value %d: reflective decode: %v", v, i, err)
		}
		if !reflect.DeepEqual(mirror(back), backMir) {
			t.Fatalf("%T value %d: the table read\n%+v\nreflection read\n%+v", v, i, back, backMir)
		}
	}
}

// Seeds are encodings of n random values of T (reflection's, by way of
// mirror) of at most 4 KiB each (a long one slows the fuzzer down), then
// the edge shapes every table must read as reflection does, for a fuzz
// test's corpus.
func Seeds[T any](seed uint64, n int, mirror func(*T) any) [][]byte {
	r := rand.New(rand.NewPCG(seed, seed))
	var out [][]byte
	for len(out) < n {
		v := new(T)
		Fill(r, reflect.ValueOf(v).Elem())
		b, err := msgpack.Marshal(mirror(v))
		if err != nil {
			panic(err)
		}
		if len(b) <= 4<<10 {
			out = append(out, b)
		}
	}
	keys, _ := TagKeys(reflect.TypeFor[T]())
	return append(out, EdgeSeeds(len(keys))...)
}

// EdgeSeeds are the shapes beside a plain map that a table must read as
// reflection does, for a struct of fields keys: nil, arrays (empty, of
// its length and one off), a nil key, a key twice, a long unknown key, an
// ext where a map belongs.
func EdgeSeeds(fields int) [][]byte {
	array := func(n int) []byte { // the array form, every field nil
		b, err := msgpack.Marshal(make([]any, n))
		if err != nil {
			panic(err)
		}
		return b
	}
	return [][]byte{
		{0xc0},             // nil
		{0x90},             // an empty array
		array(fields),      // the array form
		array(fields + 1),  // an array one too long
		array(fields - 1),  // one too short
		{0x81, 0xc0, 0x01}, // a nil key
		{0x82, 0xa2, 'i', 'd', 0xa1, 'a', 0xa2, 'i', 'd', 0xa1, 'b'},          // a key twice
		append(append([]byte{0x81, 0xd9, 0x28}, make([]byte, 0x28)...), 0x01), // a long unknown key
		{0xd4, 0x01, 0x01}, // an ext where a map belongs
	}
}

// freshMirror is a new zero value of the mirror type mirror converts to.
func freshMirror[T any](mirror func(*T) any) any {
	return reflect.New(reflect.TypeOf(mirror(new(T))).Elem()).Interface()
}

// SameDecode reports, for data, whether T's codec and reflection (into a
// fresh mirror) agree: both fail, or both succeed with equal values.
func SameDecode[T any](data []byte, mirror func(*T) any) error {
	got, want := new(T), freshMirror(mirror)
	gotErr, wantErr := msgpack.Unmarshal(data, got), msgpack.Unmarshal(data, want)
	if (gotErr == nil) != (wantErr == nil) {
		return fmt.Errorf("%T: %x: table error %v, reflection error %v", got, data, gotErr, wantErr)
	}
	if gotErr == nil && !reflect.DeepEqual(mirror(got), want) {
		return fmt.Errorf("%T: %x: the table read\n%+v\nreflection read\n%+v", got, data, got, want)
	}
	return nil
}

// TagKeys are the msgpack keys of struct type typ in the order msgpack
// writes them, each with whether its tag says omitempty; an anonymous
// struct field without a msgpack name is inlined, as msgpack does. A
// table's Keys must equal them.
func TagKeys(typ reflect.Type) (names []string, omitEmpty []bool) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("msgpack")
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			n, o := TagKeys(f.Type)
			names, omitEmpty = append(names, n...), append(omitEmpty, o...)
			continue
		}
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names, omitEmpty = append(names, name), append(omitEmpty, slices.Contains(strings.Split(opts, ","), "omitempty"))
	}
	return names, omitEmpty
}

// CoversTags fails t unless a table's keys (its Keys method: names and
// omitempty, in order) are typ's struct tags (TagKeys).
func CoversTags(t testing.TB, typ reflect.Type, keys func() ([]string, []bool)) {
	t.Helper()
	names, omitEmpty := keys()
	wantNames, wantOmit := TagKeys(typ)
	if !slices.Equal(names, wantNames) || !slices.Equal(omitEmpty, wantOmit) {
		t.Errorf("%s: table %v %v, struct tags %v %v", typ, names, omitEmpty, wantNames, wantOmit)
	}
}
