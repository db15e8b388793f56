package refusals

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/kvkey"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/pkg/events"
)

func mustMsgpack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRefusalStateDecodesEveryTimestampShape: a guard that understood one
// timestamp shape silently flipped behaviour on the other.
func TestRefusalStateDecodesEveryTimestampShape(t *testing.T) {
	at := time.Date(2025, 10, 7, 9, 15, 30, 123_000_000, time.UTC)
	ms := at.UnixMilli()
	tests := []struct {
		name string
		data []byte
	}{
		{"msgpack timestamp", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": 2, "refused_at": at})},
		{"msgpack epoch ms integer", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": 2, "refused_at": ms})},
		{"msgpack epoch ms unsigned", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": uint64(2), "refused_at": uint64(ms)})},
		{"msgpack epoch ms float", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": 2, "refused_at": float64(ms)})},
		{"msgpack RFC 3339 string", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": 2, "refused_at": at.Format(time.RFC3339Nano)})},
		{"msgpack RFC 3339 with offset", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": 2, "refused_at": at.In(time.FixedZone("CST", 8*3600)).Format(time.RFC3339Nano)})},
		{"msgpack epoch ms as string", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": 2, "refused_at": "1759828530123"})},
		{"JSON RFC 3339", []byte(`{"segment":"s#0","provider":"p","refusals":2,"refused_at":"2025-10-07T09:15:30.123Z"}`)},
		{"JSON epoch ms number", []byte(`{"segment":"s#0","provider":"p","refusals":2,"refused_at":1759828530123}`)},
		{"JSON epoch ms string, leading space", []byte(` {"segment":"s#0","provider":"p","refusals":2,"refused_at":"1759828530123"}`)},
	}
	if ms != 1759828530123 {
		t.Fatalf("fixture drift: %d", ms)
	}
	cfg := refusal.DefaultConfig()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := DecodeState(tt.data)
			if err != nil {
				t.Fatal(err)
			}
			if s.Legacy || s.Refusals != 2 || !s.RefusedAt.Equal(at) || s.Segment != "s#0" || s.Provider != "p" {
				t.Fatalf("decoded %+v, want 2 refusals at %v", s, at)
			}
			if got, want := s.NextProbeAt(cfg), at.Add(time.Hour); !got.Equal(want) {
				t.Fatalf("next probe %v, want %v", got, want)
			}
		})
	}
}

// TestRefusalStateLegacyDecodesFrozen: a stored value without a refusal count
// (or unreadable) is frozen until a boundary, never "no refusal".
func TestRefusalStateLegacyDecodesFrozen(t *testing.T) {
	tests := []struct {
		name    string
		data    []byte
		wantErr bool
	}{
		{"msgpack without refusals", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refused_at": codecT0}), false},
		{"msgpack with nil refusals", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": nil, "refused_at": codecT0}), false},
		{"msgpack negative refusals", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": -1, "refused_at": codecT0}), false},
		{"msgpack count without a time", mustMsgpack(t, map[string]any{"segment": "s#0", "provider": "p", "refusals": 1}), false},
		{"JSON without refusals (seed-era row)", []byte(`{"segment":"s#0","provider":"p","refused_at":1759828530123}`), false},
		{"JSON with null refusals", []byte(`{"segment":"s#0","provider":"p","refusals":null}`), false},
		{"JSON refusals as text", []byte(`{"segment":"s#0","provider":"p","refusals":"two"}`), true},
		{"JSON unreadable time", []byte(`{"segment":"s#0","provider":"p","refusals":1,"refused_at":"yesterday"}`), true},
		{"garbage bytes", []byte{0xc1, 0x00, 0xff}, true},
		{"empty value", nil, true},
	}
	cfg := refusal.DefaultConfig()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := DecodeState(tt.data)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if !s.Legacy || !s.Frozen(cfg) {
				t.Fatalf("decoded %+v, want legacy and frozen", s)
			}
			if ok, _, frozen := s.Allow(codecT0.Add(10_000*time.Hour), cfg); ok || !frozen {
				t.Fatalf("legacy state allowed a send")
			}
		})
	}
}

func TestRefusalStateRoundTrip(t *testing.T) {
	states := []refusal.State{
		{Segment: "s#0", Provider: "p", Agent: "a", Refusals: 3, RefusedAt: events.At(codecT0.Add(123 * time.Millisecond))},
		{Segment: "s#0", Provider: "p", Increment: "4.2", Rerenders: 2}, // re-render phase: count 0 is kept as 0
		{Segment: "s#0", Provider: "p", Legacy: true, RefusedAt: events.At(codecT0)},
	}
	for _, s := range states {
		mp, err := EncodeState(s)
		if err != nil {
			t.Fatal(err)
		}
		js, err := json.Marshal(wireOf(s))
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{"msgpack": mp, "json": js} {
			got, err := DecodeState(data)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if got != s {
				t.Fatalf("%s round trip: got %+v, want %+v", name, got, s)
			}
		}
		if !s.Legacy && !strings.Contains(string(js), `"refusals":`) {
			t.Fatalf("JSON %s must always carry the count", js)
		}
	}
}

var kvKeyRE = regexp.MustCompile(`^[-/_=.a-zA-Z0-9]+$`)

func TestRefusalKey(t *testing.T) {
	tests := []struct {
		segment, provider, want string
	}{
		{"s-1#0", "openai", "s-1.0.openai"},
		{"sess_9#12", "my-gateway", "sess_9.12.my-gateway"},
		{"a.b/c#3", "vendor/model.x", "a=2Eb=2Fc.3.vendor=2Fmodel=2Ex"},
		{"#1", "", "=.1.="},
		{"no-number", "p", "no-number.=.p"},
		{"s#007", "p", "s=23007.=.p"},
		{"s#-1", "p", "s.-1.p"},
		{"会话#2", "p", "=E4=BC=9A=E8=AF=9D.2.p"},
		{"x=y#2", "p p", "x=3Dy.2.p=20p"},
	}
	seen := map[string]string{}
	for _, tt := range tests {
		got := Key(tt.segment, tt.provider)
		if got != tt.want {
			t.Errorf("Key(%q, %q) = %q, want %q", tt.segment, tt.provider, got, tt.want)
		}
		if !kvKeyRE.MatchString(got) || strings.HasPrefix(got, ".") || strings.HasSuffix(got, ".") || strings.Contains(got, "..") {
			t.Errorf("%q is not a valid KV key", got)
		}
		seg, prov, err := ParseKey(got)
		if err != nil || seg != tt.segment || prov != tt.provider {
			t.Errorf("ParseKey(%q) = %q, %q, %v; want %q, %q", got, seg, prov, err, tt.segment, tt.provider)
		}
		if prev, dup := seen[got]; dup {
			t.Errorf("%q and %q share key %q", prev, tt.segment+"|"+tt.provider, got)
		}
		seen[got] = tt.segment + "|" + tt.provider
		if f := SegmentFilter(tt.segment); strings.TrimSuffix(f, "*") != strings.TrimSuffix(got, kvkey.Escape(tt.provider)) {
			t.Errorf("segment filter %q does not match key %q", f, got)
		}
		if !strings.Contains(got, ".=.") { // a `<session>#<n>` segment: listed by its session
			if f := SessionFilter(sessionOf(tt.segment)); !strings.HasPrefix(got, strings.TrimSuffix(f, ">")) {
				t.Errorf("session filter %q does not match key %q", f, got)
			}
		}
	}
	for _, bad := range []string{"a.b", "a.1.b.c", "a.x1.b", "a.01.b", "a=6.1.b", "a=61.1.b", "a=2e.1.b", ".1.b", "a.1.b b"} {
		if seg, prov, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) = %q, %q; want an error", bad, seg, prov)
		}
	}
}

func sessionOf(segment string) string {
	i := strings.LastIndexByte(segment, '#')
	if i < 0 {
		return segment
	}
	return segment[:i]
}

func TestRefusalRecordCodec(t *testing.T) {
	cfg := refusal.DefaultConfig()
	var rec refusal.Record
	rec.State = refusal.State{Segment: "s#1", Provider: "p"}
	rec, ev := rec.Refused("a", refusal.ScopeHistory, "3.1", codecT0, cfg)
	rec = rec.Remember("o-1", ev, []string{"p", "q"})
	rec.Claim = refusal.Claim{Agent: "b", Until: codecT0.Add(20 * time.Minute)}

	data, err := EncodeRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeRecord(data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rec) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, rec)
	}
	// A reader that knows only the state reads the same state.
	st, err := DecodeState(data)
	if err != nil || !reflect.DeepEqual(st, rec.State) {
		t.Errorf("DecodeState of a record = %+v, %v; want %+v", st, err, rec.State)
	}

	tests := []struct {
		name    string
		data    string
		want    refusal.Record
		wantErr bool
	}{
		{"state only (EncodeState): no claim, nothing applied", string(mustState(t, rec.State)), refusal.Record{State: rec.State}, false},
		{"operator JSON with a claim", `{"segment":"s#1","provider":"p","refusals":1,"refused_at":"2025-10-07T09:00:00Z","probe_agent":"x","probe_until":1759828500000}`,
			refusal.Record{State: refusal.State{Segment: "s#1", Provider: "p", Refusals: 1, RefusedAt: events.At(codecT0)}, Claim: refusal.Claim{Agent: "x", Until: codecT0.Add(15 * time.Minute)}}, false},
		{"operator JSON without a count: legacy", `{"segment":"s#1","provider":"p"}`, refusal.Record{State: refusal.State{Segment: "s#1", Provider: "p", Legacy: true}}, false},
		{"garbage: legacy with an error", "\xc1", refusal.Record{State: refusal.State{Legacy: true}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeRecord([]byte(tt.data))
			if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecodeRecord = %+v, %v; want %+v (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func mustState(t *testing.T, s refusal.State) []byte {
	t.Helper()
	b, err := EncodeState(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// codecT0 is the time the codec tests store.
var codecT0 = time.Date(2025, 10, 7, 9, 0, 0, 0, time.UTC)

// mergedRecord is how EncodeRecord wrote a record before recordWire: the
// state and the extras each encoded and merged in a map (then encoded with
// SetSortMapKeys, which leaves a map of RawMessage in Go's map order, so
// its bytes were never stable). Kept here as the reference the one-pass
// form must equal, key for key and value byte for value byte.
func mergedRecord(t *testing.T, r refusal.Record) map[string]msgpack.RawMessage {
	t.Helper()
	fields := map[string]msgpack.RawMessage{}
	for _, v := range []any{ptr(wireOf(r.State)), ptr(extrasOf(r))} {
		if err := msgpack.Unmarshal(mustMsgpack(t, v), &fields); err != nil {
			t.Fatal(err)
		}
	}
	return fields
}

func ptr[T any](v T) *T { return &v }

// TestRecordWireMatchesMerge: for records with and without each part (a
// legacy state, a claim, applied refusals with peers), EncodeRecord writes
// the bytes the merged form wrote, and DecodeRecord's one pass reads what
// the two passes (state, then extras) read. A value whose extras are
// unreadable still gives its state, with the error.
func TestRecordWireMatchesMerge(t *testing.T) {
	cfg := refusal.DefaultConfig()
	var recs []refusal.Record
	for i := range 24 {
		var r refusal.Record
		r.State = refusal.State{Segment: fmt.Sprintf("s%d#%d", i, i%3), Provider: "p"}
		if i%2 == 1 {
			r.State.Agent = "a"
		}
		for k := range i % 4 {
			var ev refusal.Event
			r, ev = r.Refused(fmt.Sprintf("a%d", k), refusal.ScopeHistory, "3.1", codecT0.Add(time.Duration(k)*time.Minute), cfg)
			if i%3 != 0 {
				r = r.Remember(fmt.Sprintf("o-%d", k), ev, []string{"p", "q"}[:k%3%2+1])
			}
		}
		if i%5 == 0 {
			r.State.Legacy = true
		}
		if i%4 == 1 {
			r.Claim = refusal.Claim{Agent: "b", Until: codecT0.Add(20 * time.Minute)}
		}
		recs = append(recs, r)
	}
	for i, r := range recs {
		got, err := EncodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		var gotFields map[string]msgpack.RawMessage
		if err := msgpack.Unmarshal(got, &gotFields); err != nil {
			t.Fatal(err)
		}
		if want := mergedRecord(t, r); !reflect.DeepEqual(gotFields, want) {
			t.Fatalf("record %d: one pass wrote\n%x\nthe merge wrote\n%x", i, gotFields, want)
		}
		if keys := msgpackKeys(t, got); !slices.IsSorted(keys) {
			t.Fatalf("record %d: keys %v, want them sorted", i, keys)
		}
		back, err := DecodeRecord(got)
		if err != nil {
			t.Fatal(err)
		}
		want := refusal.Record{State: mustDecodeState(t, got)}
		var x recordExtras
		if err := msgpack.Unmarshal(got, &x); err != nil {
			t.Fatal(err)
		}
		x.apply(&want)
		if !reflect.DeepEqual(back, want) {
			t.Fatalf("record %d: one pass read\n%+v\ntwo passes read\n%+v", i, back, want)
		}
	}

	// An array as long as recordWire's fields is not a record: read as
	// the two passes read it (frozen, with the error), not field by field.
	arr := mustMsgpack(t, []any{"a", nil, "", "", nil, "p", 2, codecT0.UnixMilli(), 0, "s#1"})
	if r, err := DecodeRecord(arr); err == nil || !r.State.Legacy {
		t.Errorf("a 10-element array read as %+v, %v; want a frozen state and an error", r.State, err)
	}

	// Extras that cannot be read: the state is kept, the error says so.
	bad := mustMsgpack(t, map[string]any{"segment": "s#1", "provider": "p", "refusals": 1, "refused_at": codecT0.UnixMilli(), "applied": "not a list"})
	r, err := DecodeRecord(bad)
	if err == nil || !strings.Contains(err.Error(), "claim and applied refusals dropped") {
		t.Errorf("unreadable applied: error %v, want it to say the extras were dropped", err)
	}
	if want := (refusal.State{Segment: "s#1", Provider: "p", Refusals: 1, RefusedAt: events.At(codecT0)}); !reflect.DeepEqual(r.State, want) {
		t.Errorf("unreadable applied: state %+v, want %+v", r.State, want)
	}
}

// msgpackKeys are the keys of a msgpack map, in the order written.
func msgpackKeys(t *testing.T, data []byte) []string {
	t.Helper()
	dec := msgpack.NewDecoder(bytes.NewReader(data))
	n, err := dec.DecodeMapLen()
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, n)
	for i := range keys {
		if keys[i], err = dec.DecodeString(); err != nil {
			t.Fatal(err)
		}
		if err := dec.Skip(); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func mustDecodeState(t *testing.T, data []byte) refusal.State {
	t.Helper()
	s, err := DecodeState(data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
