package memstore

import (
	"bytes"
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/pkg/events"
)

var (
	timeType   = reflect.TypeFor[time.Time]()
	evTimeType = reflect.TypeFor[events.Time]()
	rawType    = reflect.TypeFor[events.Raw]()
)

// fill sets every field reachable from v: n varies the values, empty
// leaves slices and maps empty but not nil (what omitempty drops).
func fill(v reflect.Value, n int, empty bool) {
	loc := time.FixedZone("x", 3600+n)
	switch {
	case v.Type() == timeType:
		v.Set(reflect.ValueOf(time.Date(2026, 3, 1, 12, n%60, 7, 123456789+n, loc)))
		return
	case v.Type() == evTimeType:
		// with a monotonic reading, as time.Now gives
		v.Set(reflect.ValueOf(events.Time{Time: time.Now().In(loc).Add(time.Duration(n))}))
		return
	case v.Type() == rawType:
		b, _ := msgpack.Marshal(map[string]int{"k": n})
		v.Set(reflect.ValueOf(events.Raw(b)))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("s" + string(rune('a'+n%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(n + 1))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(n + 1))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(n) + 0.5)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(p.Elem(), n+1, empty)
		v.Set(p)
	case reflect.Slice:
		if empty {
			v.Set(reflect.MakeSlice(v.Type(), 0, 1))
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), n+i+1, empty)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		if !empty {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(k, n, empty)
			fill(e, n+1, empty)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), n+i+1, empty)
			}
		}
	case reflect.Interface:
		// left nil
	default:
		panic("fill: " + v.Type().String())
	}
}

// mutate changes every value reachable from v in place (through the
// pointers, slices and maps it holds).
func mutate(v reflect.Value) {
	switch {
	case v.Type() == timeType || v.Type() == evTimeType || v.Type() == rawType:
		if v.Type() == rawType {
			for i := range v.Len() {
				v.Index(i).SetUint(0xc1)
			}
			return
		}
		v.Set(reflect.Zero(v.Type()))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("mutated")
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 100)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 100)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(v.Float() + 100)
	case reflect.Pointer:
		if !v.IsNil() {
			mutate(v.Elem())
		}
	case reflect.Slice:
		for i := range v.Len() {
			mutate(v.Index(i))
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			e := reflect.New(v.Type().Elem()).Elem()
			e.Set(v.MapIndex(k))
			mutate(e)
			v.SetMapIndex(k, e)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				mutate(v.Field(i))
			}
		}
	}
}

func records() map[string]*recovery.ProviderRecord {
	full, empty := &recovery.ProviderRecord{}, &recovery.ProviderRecord{}
	fill(reflect.ValueOf(full).Elem(), 0, false)
	fill(reflect.ValueOf(empty).Elem(), 0, true)
	users := &recovery.ProviderRecord{Provider: "p", Users: []recovery.User{{Agent: "a", At: events.At(time.Now())}}}
	users.Queue.NextAt = events.Time{Time: time.Now()}
	return map[string]*recovery.ProviderRecord{
		"every field set":               full,
		"empty slices and maps":         empty,
		"zero":                          {},
		"users, times with a monotonic": users,
	}
}

// TestCopyRecordIsARoundTrip: what the store keeps and hands out is what
// KV would (a msgpack round trip), for every field of the record — a field
// added to recovery.ProviderRecord that copyRecord does not copy right
// fails here — and shares nothing with what it was copied from.
func TestCopyRecordIsARoundTrip(t *testing.T) {
	for name, r := range records() {
		t.Run(name, func(t *testing.T) {
			b, err := msgpack.Marshal(r)
			if err != nil {
				t.Fatal(err)
			}
			want := &recovery.ProviderRecord{}
			if err := msgpack.Unmarshal(b, want); err != nil {
				t.Fatal(err)
			}
			got, err := copyRecord(r)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("copy differs from a msgpack round trip:\n got %#v\nwant %#v", got, want)
			}
			mutate(reflect.ValueOf(got).Elem())
			if after, _ := msgpack.Marshal(r); !bytes.Equal(after, b) {
				t.Fatalf("changing the copy changed the original:\n%#v", r)
			}
		})
	}
}

// TestCopyRecordRefusesWhatKVCannotLoad: a time outside years 0001–9999
// fails as the round trip does.
func TestCopyRecordRefusesWhatKVCannotLoad(t *testing.T) {
	r := &recovery.ProviderRecord{Provider: "p", Users: []recovery.User{{Agent: "a", At: events.Time{Time: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}}}
	if _, err := copyRecord(r); err == nil {
		t.Fatal("no error for year 10000")
	}
	if _, err := New().SaveProvider(context.Background(), r, 0); err == nil {
		t.Fatal("saved a record with year 10000")
	}
}

// TestProvidersAreCopies: like KV, a loaded record is the caller's to
// change, a saved one is kept as it was at the save, saves compare and set
// by revision, and a peek shows what a load would.
func TestProvidersAreCopies(t *testing.T) {
	ctx := context.Background()
	s := New()
	r := records()["every field set"]
	r.Provider = "p"
	rev, err := s.SaveProvider(ctx, r, 0)
	if err != nil || rev != 1 {
		t.Fatalf("first save: rev %d, %v", rev, err)
	}
	if _, err := s.SaveProvider(ctx, r, 0); err != recovery.ErrConflict {
		t.Fatalf("create over an existing record: %v, want ErrConflict", err)
	}
	saved, _ := msgpack.Marshal(r)
	mutate(reflect.ValueOf(r).Elem()) // after the save: not in the store
	got, rev, err := s.LoadProvider(ctx, "p")
	if err != nil || rev != 1 {
		t.Fatalf("load: rev %d, %v", rev, err)
	}
	if b, _ := msgpack.Marshal(got); !bytes.Equal(b, saved) {
		t.Fatal("the record loaded is not the record saved")
	}
	mutate(reflect.ValueOf(got).Elem()) // the caller's copy
	again, _, _ := s.LoadProvider(ctx, "p")
	peeked, prev, _ := s.PeekProvider("p")
	if !reflect.DeepEqual(again, peeked) || prev != 1 {
		t.Fatalf("peek (rev %d) differs from a load", prev)
	}
	if b, _ := msgpack.Marshal(again); !bytes.Equal(b, saved) {
		t.Fatal("changing a loaded record changed the store")
	}
	clone := s.Clone()
	fresh, _, _ := s.LoadProvider(ctx, "p")
	fresh.Health = "changed"
	if _, err := s.SaveProvider(ctx, fresh, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SaveProvider(ctx, fresh, 1); err != recovery.ErrConflict {
		t.Fatalf("save at an old revision: %v, want ErrConflict", err)
	}
	if c, crev, _ := clone.LoadProvider(ctx, "p"); crev != 1 || !reflect.DeepEqual(c, again) {
		t.Fatal("a save after Clone changed the clone")
	}
}

// TestListProvidersSorted: every provider with a record, sorted, in a
// slice the caller owns; a clone lists its own.
func TestListProvidersSorted(t *testing.T) {
	ctx := context.Background()
	s := New()
	for _, p := range []string{"m", "b", "", "z", "b", "a"} {
		r, rev, _ := s.LoadProvider(ctx, p)
		if r == nil {
			r = &recovery.ProviderRecord{Provider: p}
		}
		if _, err := s.SaveProvider(ctx, r, rev); err != nil {
			t.Fatal(err)
		}
	}
	c := s.Clone()
	if _, err := c.SaveProvider(ctx, &recovery.ProviderRecord{Provider: "c"}, 0); err != nil {
		t.Fatal(err)
	}
	got, _ := s.ListProviders(ctx)
	if want := []string{"", "a", "b", "m", "z"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("ListProviders = %q, want %q", got, want)
	}
	got[0] = "changed"
	again, _ := s.ListProviders(ctx)
	cl, _ := c.ListProviders(ctx)
	if again[0] != "" || !reflect.DeepEqual(cl, []string{"", "a", "b", "c", "m", "z"}) {
		t.Fatalf("ListProviders shares its slice: %q; clone %q", again, cl)
	}
}
