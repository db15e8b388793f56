package streamread_test

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/streamread"
)

type kvRow struct {
	key, value string
	rev        uint64
	created    time.Time
}

func rowsOf(es []jetstream.KeyValueEntry) []kvRow {
	out := make([]kvRow, 0, len(es))
	for _, e := range es {
		out = append(out, kvRow{e.Key(), string(e.Value()), e.Revision(), e.Created().UTC()})
	}
	slices.SortFunc(out, func(a, b kvRow) int { return strings.Compare(a.key, b.key) })
	return out
}

// watchRows is what a filtered watch with IgnoreDeletes delivers before
// its end-of-snapshot nil: the answer LatestEntries must give.
func watchRows(t *testing.T, b *bundle, kv jetstream.KeyValue, filter string) []kvRow {
	t.Helper()
	w, err := kv.WatchFiltered(b.ctx, []string{filter}, jetstream.IgnoreDeletes())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var es []jetstream.KeyValueEntry
	for e := range w.Updates() {
		if e == nil {
			break
		}
		es = append(es, e)
	}
	return rowsOf(es)
}

// TestLatestEntries: the batch read answers what a watch's snapshot does —
// the latest value and revision of every live key matching the filter,
// deleted and purged keys left out — and creates no consumer doing it.
func TestLatestEntries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	kv := newBucket(t, b, "LATEST")
	for _, kvp := range [][2]string{
		{"s1.1.p1", "a"}, {"s1.1.p2", "b"}, {"s1.1.p1", "a2"}, {"s1.2.p1", "c"},
		{"s1.1.p3", "d"}, {"s2.1.p1", "e"}, {"s1.2.p2", "f"}, {"s1.1.p1", "a3"},
	} {
		if _, err := kv.Put(b.ctx, kvp[0], []byte(kvp[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(b.ctx, "s1.1.p2"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(b.ctx, "s1.2.p2"); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		filter string
		keys   []string
	}{
		{"s1.1.*", []string{"s1.1.p1", "s1.1.p3"}},
		{"s1.>", []string{"s1.1.p1", "s1.1.p3", "s1.2.p1"}},
		{">", []string{"s1.1.p1", "s1.1.p3", "s1.2.p1", "s2.1.p1"}},
		{"s1.1.p2", nil}, // deleted
		{"s1.2.*", []string{"s1.2.p1"}},
		{"s3.>", nil}, // never written
	}
	for _, tt := range tests {
		got, err := streamread.LatestEntries(b.ctx, b.js, kv, tt.filter)
		if err != nil {
			t.Fatalf("%s: %v", tt.filter, err)
		}
		rows := rowsOf(got)
		var keys []string
		for _, r := range rows {
			keys = append(keys, r.key)
		}
		if !slices.Equal(keys, tt.keys) {
			t.Errorf("%s: keys %v, want %v", tt.filter, keys, tt.keys)
		}
		if want := watchRows(t, b, kv, tt.filter); !slices.Equal(rows, want) {
			t.Errorf("%s: %v, the watch says %v", tt.filter, rows, want)
		}
		for _, e := range got {
			if e.Bucket() != "LATEST" || e.Operation() != jetstream.KeyValuePut {
				t.Errorf("%s: entry %s of bucket %q, operation %v", tt.filter, e.Key(), e.Bucket(), e.Operation())
			}
		}
	}
	if rows := rowsOf(must(streamread.LatestEntries(b.ctx, b.js, kv, "s1.1.p1"))); len(rows) != 1 || rows[0].value != "a3" {
		t.Errorf("s1.1.p1: %v, want its latest value a3", rows)
	}

	// Each answer reaches the client once: s1.> is five subjects (two of
	// them a delete and a purge marker) and the end of the batch. (An
	// inbox under the connection's request mux, which the bucket's
	// creation started, would get every answer twice.)
	in := b.nc.Stats().InMsgs
	if _, err := streamread.LatestEntries(b.ctx, b.js, kv, "s1.>"); err != nil {
		t.Fatal(err)
	}
	if got := b.nc.Stats().InMsgs - in; got != 6 {
		t.Errorf("%d messages received for 5 subjects' answers and the end of the batch, want 6", got)
	}

	// The point of it: no consumer was created. A watch's consumer is
	// gone again once it stops, so count the JetStream API requests: a
	// watch makes at least two (create, delete), a direct get none.
	before := must(b.js.AccountInfo(b.ctx)).API.Total
	for range 3 {
		if _, err := streamread.LatestEntries(b.ctx, b.js, kv, "s1.>"); err != nil {
			t.Fatal(err)
		}
	}
	if after := must(b.js.AccountInfo(b.ctx)).API.Total; after != before+1 {
		t.Errorf("%d JetStream API requests for 3 reads (one is the account info): the batch read must not watch", after-before)
	}
}

// TestLatestEntriesBeyondOneBatch: as many keys as one batch answer may
// carry (the server's 1024) are read in one batch; more are still all
// read — by a watch.
func TestLatestEntriesBeyondOneBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	kv := newBucket(t, b, "MANY")
	put := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := kv.Put(b.ctx, fmt.Sprintf("k.%04d", i), []byte{byte(i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tt := range []struct {
		n       int
		watches bool
	}{{1024, false}, {1100, true}} {
		put(0, tt.n)
		before := must(b.js.AccountInfo(b.ctx)).API.Total
		got, err := streamread.LatestEntries(b.ctx, b.js, kv, "k.*")
		if err != nil {
			t.Fatal(err)
		}
		if rows, want := rowsOf(got), watchRows(t, b, kv, "k.*"); len(rows) != tt.n || !slices.Equal(rows, want) {
			t.Errorf("%d keys: %d entries, want %d as the watch reads them", tt.n, len(rows), tt.n)
		}
		// The watch of watchRows and the account info: 3 requests or
		// more; LatestEntries' own watch adds as many again.
		api := must(b.js.AccountInfo(b.ctx)).API.Total - before
		if watched := api > 4; watched != tt.watches {
			t.Errorf("%d keys: %d JetStream API requests; want LatestEntries to watch: %v", tt.n, api, tt.watches)
		}
	}
}

// TestLatestEntriesWithoutDirectGets: a bucket whose stream does not
// answer direct gets is read by the watch.
func TestLatestEntriesWithoutDirectGets(t *testing.T) {
	t.Parallel()
	b := setup(t)
	kv := newBucket(t, b, "NODIRECT")
	st, err := b.js.Stream(b.ctx, "KV_NODIRECT")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := b.js.UpdateStream(b.ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a.1", "a.2", "b.1"} {
		if _, err := kv.Put(b.ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := streamread.LatestEntries(b.ctx, b.js, kv, "a.*")
	if err != nil {
		t.Fatal(err)
	}
	if rows, want := rowsOf(got), watchRows(t, b, kv, "a.*"); len(rows) != 2 || !slices.Equal(rows, want) {
		t.Errorf("%v, want %v", rows, want)
	}
}

// newBucket creates a KV bucket with nats.go's defaults (direct gets on).
func newBucket(t *testing.T, b *bundle, name string) jetstream.KeyValue {
	t.Helper()
	kv, err := b.js.CreateKeyValue(b.ctx, jetstream.KeyValueConfig{Bucket: name})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestLastPerSubject: the last message of each matching subject, from a
// sequence on; more subjects than one answer is ErrTooManySubjects (and
// ErrBatchUnavailable), whatever the first sequence; LastSeq names the
// last matching message; ReadFrom reads a range in order, in as many
// answers as its byte limit takes.
func TestLastPerSubject(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "LAST", Subjects: []string{"last.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	pub := func(subj, data string) uint64 {
		return must(b.js.Publish(b.ctx, subj, []byte(data))).Sequence
	}
	read := func(filter string, from uint64) (map[string]string, error) {
		got := map[string]string{}
		err := streamread.LastPerSubject(b.ctx, b.js, "LAST", []string{filter}, from, func(m *nats.Msg) error {
			got[m.Header.Get(jetstream.SubjectHeader)] = string(m.Data)
			return nil
		})
		return got, err
	}
	pub("last.p.a", "a1")
	pub("last.p.b", "b1")
	mid := pub("last.q.a", "qa")
	pub("last.p.a", "a2")
	lastP := pub("last.p.c", "c1")
	pub("last.q.b", "qb")

	for _, tt := range []struct {
		filter string
		from   uint64
		want   map[string]string
	}{
		{"last.p.*", 0, map[string]string{"last.p.a": "a2", "last.p.b": "b1", "last.p.c": "c1"}},
		{"last.p.*", mid, map[string]string{"last.p.a": "a2", "last.p.c": "c1"}},
		{"last.x.*", 0, map[string]string{}},
	} {
		got, err := read(tt.filter, tt.from)
		if err != nil || !maps.Equal(got, tt.want) {
			t.Errorf("%s from %d: %v, %v; want %v", tt.filter, tt.from, got, err, tt.want)
		}
	}
	for filter, want := range map[string]uint64{"last.p.*": lastP, "last.p.b": 2, "last.x.*": 0} {
		if got, err := streamread.LastSeq(b.ctx, b.js, "LAST", filter); err != nil || got != want {
			t.Errorf("LastSeq %s = %d, %v; want %d", filter, got, err, want)
		}
	}

	first := pub("last.many.0", "0")
	for i := 1; i < 1100; i++ {
		pub(fmt.Sprintf("last.many.%d", i), fmt.Sprint(i))
	}
	for _, from := range []uint64{0, first + 1000} {
		if _, err := read("last.many.*", from); !errors.Is(err, streamread.ErrTooManySubjects) || !errors.Is(err, streamread.ErrBatchUnavailable) {
			t.Fatalf("1100 subjects from %d: %v, want ErrTooManySubjects", from, err)
		}
	}
	last := must(streamread.LastSeq(b.ctx, b.js, "LAST", "last.many.*"))
	nums := func(from, to int) []string {
		var out []string
		for i := from; i <= to; i++ {
			out = append(out, fmt.Sprint(i))
		}
		return out
	}
	for _, tt := range []struct {
		name         string
		from, upto   uint64
		n, pageBytes int
		want         []string
	}{
		{"the tail", last - 99, 0, 500, 0, nums(1000, 1099)},
		{"the first 10", first, 0, 10, 0, nums(0, 9)},
		{"up to a bound", first + 990, first + 999, 500, 0, nums(990, 999)},
		{"in pages of ~100 bytes", last - 199, 0, 500, 100, nums(900, 1099)},
		{"in pages, the first 150", first, 0, 150, 100, nums(0, 149)},
		{"in pages, up to a bound", first + 500, first + 799, 4096, 300, nums(500, 799)},
	} {
		var got []string
		err := streamread.ReadFromPaged(b.ctx, b.js, "LAST", "last.many.*", tt.from, tt.upto, tt.n, cmp.Or(tt.pageBytes, 4<<20), func(m *nats.Msg) error {
			got = append(got, string(m.Data))
			return nil
		})
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("%s: %d messages %v…, %v; want %d from %s", tt.name, len(got), got[:min(len(got), 3)], err, len(tt.want), tt.want[0])
		}
	}
}

// TestBatchReadsTakeTheServersHeaders: a message published with headers
// the server sets on its answers (Nats-Sequence, Nats-Time-Stamp,
// Nats-Subject) or with an empty body and a Status header is read as the
// message it is, with the server's values, by the batch reads and by
// LastSeq.
func TestBatchReadsTakeTheServersHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.js.CreateStream(b.ctx, jetstream.StreamConfig{Name: "HDR", Subjects: []string{"hdr.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	forged := nats.Header{}
	forged.Set(jetstream.SequenceHeader, "999")
	forged.Set(jetstream.TimeStampHeaer, "2000-01-01T00:00:00Z")
	forged.Set(jetstream.SubjectHeader, "hdr.elsewhere")
	status := nats.Header{}
	status.Set("Status", "404")
	seqs := map[string]uint64{}
	for subj, h := range map[string]nats.Header{"hdr.forged": forged, "hdr.status": status} {
		seqs[subj] = must(b.js.PublishMsg(b.ctx, &nats.Msg{Subject: subj, Header: h})).Sequence
	}
	check := func(how string, m *nats.Msg) {
		subj := streamread.ServerHeader(m, jetstream.SubjectHeader)
		seq := streamread.ServerHeader(m, jetstream.SequenceHeader)
		at, err := time.Parse(time.RFC3339Nano, streamread.ServerHeader(m, jetstream.TimeStampHeaer))
		if want, ok := seqs[subj]; !ok || seq != fmt.Sprint(want) || err != nil || at.Year() < 2026 {
			t.Errorf("%s: subject %q sequence %s time %v (%v); want the server's", how, subj, seq, at, err)
		}
	}
	n := 0
	if err := streamread.LastPerSubject(b.ctx, b.js, "HDR", []string{"hdr.>"}, 0, func(m *nats.Msg) error {
		n++
		check("last per subject", m)
		return nil
	}); err != nil || n != 2 {
		t.Errorf("last per subject: %d messages, %v; want 2", n, err)
	}
	n = 0
	if err := streamread.ReadFrom(b.ctx, b.js, "HDR", "hdr.>", 0, 0, 10, func(m *nats.Msg) error {
		n++
		check("read from", m)
		return nil
	}); err != nil || n != 2 {
		t.Errorf("read from: %d messages, %v; want 2", n, err)
	}
	for subj, want := range seqs {
		if got, err := streamread.LastSeq(b.ctx, b.js, "HDR", subj); err != nil || got != want {
			t.Errorf("LastSeq %s = %d, %v; want the server's %d", subj, got, err, want)
		}
	}
}
