package scopestore_test

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/internal/scopestore"
	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// bump is an update that counts in the record's Seq, so a lost update
// shows as a missing count.
func bump(rec *engine.ProviderRecord) (bool, error) {
	rec.Seq++
	return true, nil
}

func open(t *testing.T, b *bustest.Bus) (*scopestore.Store, prometheus.Counter, prometheus.Counter) {
	t.Helper()
	conflicts := prometheus.NewCounter(prometheus.CounterOpts{Name: "conflicts"})
	stale := prometheus.NewCounter(prometheus.CounterOpts{Name: "stale"})
	s, err := scopestore.Open(b.Ctx, b.JS, scopestore.Options{Conflicts: conflicts, Stale: stale})
	if err != nil {
		t.Fatal(err)
	}
	return s, conflicts, stale
}

func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// sent is how many messages the test's connection has sent to the server
// (both stores share it). The client counts each message as it sends it;
// the server's own in-message count is summed per read-loop pass and can
// lag behind the reply the client already has.
func sent(b *bustest.Bus) uint64 { return b.NC.Stats().OutMsgs }

// A Store's next update of a provider starts from the record it wrote
// last: one message to the server (the compare-and-set write) instead of a
// read and a write. When another writer changed the key in between, the
// write fails on the revision and the update runs again from a fresh read:
// nothing the other writer stored is lost.
func TestUpdateStartsFromItsOwnWriteAndRereadsAfterAnotherWriter(t *testing.T) {
	b := bustest.Start(t, 30*time.Second)
	a, aConflicts, aStale := open(t, b)
	other, _, _ := open(t, b)
	const p = "anthropic"

	if err := a.Update(b.Ctx, p, bump); err != nil { // first: read (none), create
		t.Fatal(err)
	}
	before := sent(b)
	if err := a.Update(b.Ctx, p, bump); err != nil {
		t.Fatal(err)
	}
	if got := sent(b) - before; got != 1 {
		t.Fatalf("second update of a provider this store wrote: the store sent %d messages, want 1 (the write alone)", got)
	}

	if err := other.Update(b.Ctx, p, bump); err != nil { // another replica writes
		t.Fatal(err)
	}
	if err := a.Update(b.Ctx, p, bump); err != nil { // stale revision: failed write, read, write
		t.Fatal(err)
	}
	if got, conflicts := value(t, aStale), value(t, aConflicts); got != 1 || conflicts != 0 {
		t.Fatalf("after another writer: stale %v, conflicts %v; want 1 and 0 (a stale start is not a race)", got, conflicts)
	}
	// Another writer is about: the key is read before the next update
	// (a read and a write), not started stale again (a failed write, a
	// read and a write).
	if err := other.Update(b.Ctx, p, bump); err != nil {
		t.Fatal(err)
	}
	before = sent(b)
	if err := a.Update(b.Ctx, p, bump); err != nil {
		t.Fatal(err)
	}
	if got := sent(b) - before; got != 2 {
		t.Fatalf("update after the key was found stale: the store sent %d messages, want 2 (read, write)", got)
	}
	if got := value(t, aStale); got != 1 {
		t.Fatalf("stale starts: %v, want still 1", got)
	}
	rec, err := a.Get(b.Ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if rec == nil || rec.Seq != 6 {
		t.Fatalf("record after 6 updates by two writers: %+v, want seq 6", rec)
	}
}

// Two stores updating one provider at once (two scheduler replicas) lose
// no update. One store can lose engine.MaxConflicts races in a row: the
// one that just wrote starts its next update from its own write, one round
// trip ahead of the one that must read first, so it can win every race
// until its own updates run out (1 run in 30 saw it). Update then returns
// engine.ErrConflict, and a service's runner delivers the classification
// again later; the test does what the redelivery does. A lost update
// still shows in the final count.
func TestConcurrentStoresLoseNoUpdate(t *testing.T) {
	b := bustest.Start(t, 60*time.Second)
	const p, each = "openai", 40
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for range 2 {
		s, _, _ := open(t, b)
		wg.Go(func() {
			for range each {
				err := s.Update(b.Ctx, p, bump)
				for errors.Is(err, engine.ErrConflict) && b.Ctx.Err() == nil {
					err = s.Update(b.Ctx, p, bump) // the redelivery
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s, _, _ := open(t, b)
	rec, err := s.Get(b.Ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if rec == nil || rec.Seq != 2*each {
		t.Fatalf("after %d updates by two stores: %+v, want seq %d", 2*each, rec, 2*each)
	}
}

// A key removed behind the store's back (an operator purging a provider's
// state) is not resurrected from memory: the write on the remembered
// revision fails and the provider starts over from a fresh record.
func TestDeletedKeyStartsOver(t *testing.T) {
	b := bustest.Start(t, 30*time.Second)
	s, _, _ := open(t, b)
	const p = "groq"
	for range 3 {
		if err := s.Update(b.Ctx, p, bump); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := streamread.KeyValue(context.Background(), b.JS, topology.BucketScope)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(b.Ctx, scopestore.Key(p)); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(b.Ctx, p, bump); err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(b.Ctx, scopestore.Key(p))
	if err != nil {
		t.Fatalf("after delete and update: %v", err)
	}
	rec, err := scopestore.DecodeRecord(e.Value())
	if err != nil {
		t.Fatal(err)
	}
	if rec.Seq != 1 {
		t.Fatalf("after delete: seq %d, want 1 (started over, not the remembered 3+1)", rec.Seq)
	}
}

// EncodeRecord writes what a fresh encoder with SetSortMapKeys writes
// (its pooled encoders keep no setting or byte of an earlier record), a
// result stays as it was after later encodings, and DecodeRecord reads the
// record back.
func TestEncodeRecordOnPooledEncoders(t *testing.T) {
	at := events.At(time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC))
	rec := func(keys ...string) *engine.ProviderRecord {
		r := &engine.ProviderRecord{Seq: 7}
		r.State.Provider, r.State.Clock = "p", at
		r.State.Profiles, r.State.Models = map[string]*scope.Entry{}, map[string]*scope.Entry{}
		for _, k := range keys {
			r.State.Profiles[k] = &scope.Entry{LastID: "o-" + k, LastAt: at, LastClass: "auth", LastOK: k < "c"}
			r.State.Models[k+"-m"] = &scope.Entry{LastAt: at, LastClass: "model_not_found"}
		}
		return r
	}
	fresh := func(r *engine.ProviderRecord) []byte {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.SetSortMapKeys(true)
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	first, err := scopestore.EncodeRecord(rec("a"))
	if err != nil {
		t.Fatal(err)
	}
	kept := bytes.Clone(first)
	for _, keys := range [][]string{{"b"}, {"a", "b", "c", "d", "e", "f"}, {"zz"}} {
		// Marshal, on the same pool, sets compact integers: its setting
		// must not reach a record (Seq 7 is one byte compact, nine not).
		if _, err := events.Marshal(&events.Decision{OutcomeID: "o", Agent: "a", Action: events.ActionGiveUp, Retry: 300}); err != nil {
			t.Fatal(err)
		}
		want := rec(keys...)
		got, err := scopestore.EncodeRecord(want)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 1 && !bytes.Equal(got, fresh(want)) { // one key a map: one order
			t.Errorf("%v: %x, a fresh encoder writes %x", keys, got, fresh(want))
		}
		back, err := scopestore.DecodeRecord(got)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back.State.Profiles, want.State.Profiles) || back.Seq != want.Seq || !back.State.Clock.Equal(at.Time) {
			t.Errorf("%v: read back %+v, wrote %+v", keys, back, want)
		}
	}
	if !bytes.Equal(first, kept) || !bytes.Equal(first, fresh(rec("a"))) {
		t.Errorf("the first encoding changed after later ones: %x, was %x", first, kept)
	}
}

// The next update of a provider starts from the very record the store's
// last update left, not from its bytes decoded again (a third of a
// write's work at a paced rate), and that record holds what was stored.
// An update whose fn wrote nothing hands its record to nobody: whatever
// fn changed in it was not stored, so the next update starts from the
// stored bytes.
func TestUpdateStartsFromTheRecordItWroteAndNeverFromAnUnwrittenOne(t *testing.T) {
	b := bustest.Start(t, 30*time.Second)
	s, _, _ := open(t, b)
	const p = "openai"
	var seen []*engine.ProviderRecord
	step := func(write bool) func(*engine.ProviderRecord) (bool, error) {
		return func(rec *engine.ProviderRecord) (bool, error) {
			seen = append(seen, rec)
			rec.Seq++
			rec.State.Streak = append(rec.State.Streak, "o-"+string(rune('a'+len(seen))))
			return write, nil
		}
	}
	for _, write := range []bool{true, true, false, true} {
		if err := s.Update(b.Ctx, p, step(write)); err != nil {
			t.Fatal(err)
		}
	}
	if seen[1] != seen[0] {
		t.Fatal("second update: fn got a new record, want the one the first update wrote")
	}
	if seen[3] == seen[2] {
		t.Fatal("update after one that wrote nothing: fn got that update's record, want one decoded from what is stored")
	}
	if seen[3].Seq != 3 || len(seen[3].State.Streak) != 3 {
		t.Fatalf("record after 3 writes: seq %d, streak %v; want 3 and 3 entries (the unwritten change left out)", seen[3].Seq, seen[3].State.Streak)
	}
	stored, err := s.Get(b.Ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(stored.State.Streak, seen[3].State.Streak) || stored.Seq != seen[3].Seq {
		t.Fatalf("stored %+v, want what the last update left: %+v", stored, seen[3])
	}
}

// Put stores only on the revision it was given: a writer that loaded the
// record before another wrote it gets engine.ErrConflict and nothing of
// its write is stored; loaded again, it writes on top of the other's.
func TestPutStoresOnlyOnTheRevisionItLoaded(t *testing.T) {
	b := bustest.Start(t, 30*time.Second)
	a, _, _ := open(t, b)
	other, _, _ := open(t, b)
	const p = "mistral"
	rec, rev, err := a.Load(b.Ctx, p)
	if err != nil || rev != 0 || rec.State.Provider != p {
		t.Fatalf("load of a new provider: %+v, revision %d, %v; want a healthy record of %s, no revision", rec, rev, err, p)
	}
	if err := other.Update(b.Ctx, p, bump); err != nil { // another replica first
		t.Fatal(err)
	}
	rec.Seq = 100
	data, err := scopestore.EncodeRecord(rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(b.Ctx, p, data, rev); !errors.Is(err, engine.ErrConflict) {
		t.Fatalf("put on a stale revision: %v, want engine.ErrConflict", err)
	}
	rec, rev, err = a.Load(b.Ctx, p)
	if err != nil || rec.Seq != 1 {
		t.Fatalf("after the conflict: %+v, %v; want the other writer's record (seq 1)", rec, err)
	}
	rec.Seq++
	if data, err = scopestore.EncodeRecord(rec); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(b.Ctx, p, data, rev); err != nil {
		t.Fatalf("put on the revision just loaded: %v", err)
	}
	if err := other.Update(b.Ctx, p, bump); err != nil { // its next update sees the put
		t.Fatal(err)
	}
	got, err := other.Get(b.Ctx, p)
	if err != nil || got.Seq != 3 {
		t.Fatalf("record after three writes by two writers: %+v, %v; want seq 3", got, err)
	}
}
