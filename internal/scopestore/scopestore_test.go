package scopestore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/scopestore"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/engine"
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
// no update.
func TestConcurrentStoresLoseNoUpdate(t *testing.T) {
	b := bustest.Start(t, 60*time.Second)
	const p, each = "openai", 40
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for range 2 {
		s, _, _ := open(t, b)
		wg.Go(func() {
			for range each {
				if err := s.Update(b.Ctx, p, bump); err != nil {
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
	kv, err := topology.KeyValue(context.Background(), b.JS, topology.BucketScope)
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
