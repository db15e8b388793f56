// Package scopestore is the fault scope in JetStream: engine.Providers on
// KV bucket FAILBUS_SCOPE, one key per provider (kvkey.Escape of its name),
// the msgpack of an engine.ProviderRecord, changed only by compare-and-set
// on the key's revision. Every scheduler replica reads and writes the same
// records, so two replicas cannot disagree about an outage: the one whose
// write lands first makes the transition, the other observes on top of it.
// The refusal tiers read it to skip providers in an outage.
package scopestore

import (
	"context"
	"errors"
	"fmt"
	"github.com/failbus/failbus/internal/streamread"
	"github.com/failbus/failbus/internal/wire"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/kvkey"
	topology "github.com/failbus/failbus/jetstream"
)

// Store is engine.Providers on FAILBUS_SCOPE. It is safe for concurrent
// use.
type Store struct {
	kv         jetstream.KeyValue
	conflicts  prometheus.Counter
	stale      prometheus.Counter
	unreadable prometheus.Counter
	log        zerolog.Logger
	missing    func(ctx context.Context, provider string) (*engine.ProviderRecord, error)

	// written remembers, per key, the record this Store last wrote and
	// the revision the write got, so the next Update of the provider
	// starts from it instead of reading the key again: one round trip per
	// write instead of two. Compare-and-set still decides: when another
	// replica wrote in between, the write fails on the revision, the entry
	// is dropped, and the update runs again from a fresh read. A key
	// found stale is read first for staleFor (two replicas writing one
	// provider in turn would otherwise pay a failed write on every
	// update).
	mu      sync.Mutex
	written map[string]cached
}

// cached is a record as this Store wrote it (data nil: none), and until
// when the key is read before every update because another writer was
// found writing it. rec, when set, is data decoded: the record the last
// Update's fn left, which nothing else holds. The next Update takes it
// (leaving rec nil until its own write is stored), so a provider's
// record is decoded once, not at every write: at a paced rate, where
// each failure writes alone, decoding was a third of a write's work.
type cached struct {
	data      []byte
	rev       uint64
	rec       *engine.ProviderRecord
	readUntil time.Time
}

// staleFor is how long a key found stale is read before each update.
const staleFor = 10 * time.Second

// maxCached bounds Store.written: past it an arbitrary entry is dropped
// (that provider's next update reads its key first, as without the
// cache). Providers are capped far below this by the scope's cardinality
// limits; the bound is for memory, not correctness.
const maxCached = 4096

// Options are a Store's metrics and log; every field may be left zero.
type Options struct {
	// Conflicts counts writes that lost a compare-and-set race to another
	// writer after reading the key.
	Conflicts prometheus.Counter
	// Stale counts updates that started from the record this Store wrote
	// last and found another writer had written since (the update then
	// reads the key and writes again).
	Stale prometheus.Counter
	// Unreadable counts records that could not be decoded.
	Unreadable prometheus.Counter
	// Log receives a line for each unreadable record.
	Log zerolog.Logger
	// Missing, when set, is asked for the record a provider starts from
	// when its key does not exist (a new provider, or a bucket lost and
	// recreated): nil starts it over as healthy. The scheduler rebuilds it
	// from the provider's latest health records, so an outage open when
	// the bucket was lost stays open until the provider recovers.
	Missing func(ctx context.Context, provider string) (*engine.ProviderRecord, error)
}

// Open binds the bucket; apply the topology first.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Store, error) {
	kv, err := streamread.KeyValue(ctx, js, topology.BucketScope)
	if err != nil {
		return nil, fmt.Errorf("open KV %s (apply the topology first): %w", topology.BucketScope, err)
	}
	s := &Store{kv: kv, conflicts: opts.Conflicts, stale: opts.Stale, unreadable: opts.Unreadable, log: opts.Log, missing: opts.Missing}
	if s.conflicts == nil {
		s.conflicts = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
	}
	if s.stale == nil {
		s.stale = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
	}
	if s.unreadable == nil {
		s.unreadable = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
	}
	return s, nil
}

// Key is the FAILBUS_SCOPE key of provider's fault scope.
func Key(provider string) string { return kvkey.Escape(provider) }

// EncodeRecord is the stored form of a provider's record: msgpack
// with snake_case keys, on a pooled encoder (one is most of an encoding's
// allocations, and every fault-scope write encodes). SetSortMapKeys only
// sorts maps of strings, bools and interfaces: the profile and model maps
// are written in Go's map order, so equal records need not store equal
// bytes (nothing compares them: compare-and-set is on revisions).
func EncodeRecord(rec *engine.ProviderRecord) ([]byte, error) {
	data, err := wire.MarshalSorted(rec)
	if err != nil {
		return nil, fmt.Errorf("encode fault scope of %s: %w", rec.State.Provider, err)
	}
	return data, nil
}

// DecodeRecord reads a stored record.
func DecodeRecord(data []byte) (*engine.ProviderRecord, error) {
	var rec engine.ProviderRecord
	if err := msgpack.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("decode fault scope: %w", err)
	}
	return &rec, nil
}

// get reads provider's record and its revision; nil and 0 when none. A
// record that cannot be read is logged, counted and read as none: the
// provider starts over as healthy rather than stopping the scheduler.
func (p *Store) get(ctx context.Context, provider string) (*engine.ProviderRecord, uint64, error) {
	key := Key(provider)
	e, err := p.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read fault scope %s: %w", key, err)
	}
	rec, err := decodeFor(provider, e.Value())
	if err != nil {
		p.unreadable.Inc()
		p.log.Error().Err(err).Str("key", key).Msg("unreadable fault-scope record: the provider starts over")
		return nil, e.Revision(), nil
	}
	return rec, e.Revision(), nil
}

// decodeFor is DecodeRecord for provider's key: a record that does not
// name its provider is the key's.
func decodeFor(provider string, data []byte) (*engine.ProviderRecord, error) {
	rec, err := DecodeRecord(data)
	if err != nil {
		return nil, err
	}
	if rec.State.Provider == "" {
		rec.State.Provider = provider
	}
	return rec, nil
}

// Get implements engine.Providers.
func (p *Store) Get(ctx context.Context, provider string) (*engine.ProviderRecord, error) {
	rec, _, err := p.get(ctx, provider)
	return rec, err
}

// Update implements engine.Providers: read (or start from the record this
// Store wrote last), fn, compare-and-set write; on a conflict again from a
// fresh read, and the key is read first for a while. A run of fn that
// writes nothing is not checked against the key.
func (p *Store) Update(ctx context.Context, provider string, fn func(*engine.ProviderRecord) (bool, error)) error {
	key := Key(provider)
	for attempt := range engine.MaxConflicts {
		var (
			rec       *engine.ProviderRecord
			rev       uint64
			err       error
			fromCache bool
		)
		if c, ok := p.take(key); ok && attempt == 0 {
			// A copy fn may change: the record as written, decoded
			// then or now.
			rec, rev, fromCache = c.rec, c.rev, true
			if rec == nil {
				rec, err = decodeFor(provider, c.data)
			}
		} else {
			rec, rev, err = p.get(ctx, provider)
		}
		if err != nil {
			return err
		}
		if rec == nil && rev == 0 && p.missing != nil {
			if rec, err = p.missing(ctx, provider); err != nil {
				return fmt.Errorf("rebuild fault scope %s: %w", key, err)
			}
		}
		if rec == nil {
			rec = &engine.ProviderRecord{}
			rec.State.Provider = provider
		}
		write, err := fn(rec)
		if err != nil || !write {
			return err
		}
		data, err := EncodeRecord(rec)
		if err != nil {
			return err
		}
		var newRev uint64
		if rev == 0 {
			newRev, err = p.kv.Create(ctx, key, data)
		} else {
			newRev, err = p.kv.Update(ctx, key, data, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || streamread.IsWrongLastSeq(err) {
			// Another writer has the key either way: read it before each
			// update for a while.
			if fromCache {
				p.stale.Inc()
			} else {
				p.conflicts.Inc()
			}
			p.readFirst(key)
			continue
		}
		if err != nil {
			// Stored or not, nobody knows: read the key next time.
			p.forget(key)
			return fmt.Errorf("write fault scope %s: %w", key, err)
		}
		p.remember(key, cached{data: data, rev: newRev, rec: rec})
		return nil
	}
	return fmt.Errorf("fault scope %s: %w %d times in a row", key, engine.ErrConflict, engine.MaxConflicts)
}

// Load reads the record a writer that keeps provider's record in memory
// starts from (the scheduler's lanes), and its revision (0: no key yet).
// A missing key starts from what Options.Missing rebuilds, else from a
// healthy record; an unreadable one is logged, counted and started over.
// Store the record with Put.
func (p *Store) Load(ctx context.Context, provider string) (*engine.ProviderRecord, uint64, error) {
	rec, rev, err := p.get(ctx, provider)
	if err != nil {
		return nil, 0, err
	}
	if rec == nil && rev == 0 && p.missing != nil {
		if rec, err = p.missing(ctx, provider); err != nil {
			return nil, 0, fmt.Errorf("rebuild fault scope %s: %w", Key(provider), err)
		}
	}
	if rec == nil {
		rec = &engine.ProviderRecord{}
		rec.State.Provider = provider
	}
	return rec, rev, nil
}

// Put stores data (EncodeRecord) as provider's record if the key is
// still at revision rev (0: absent) and returns the new revision. When
// another writer changed the key since, it stores nothing and returns an
// error wrapping engine.ErrConflict: Load again and fold again (the
// caller counts it: it knows whether it started from a fresh read), and
// ReadFirst reports true for a while.
func (p *Store) Put(ctx context.Context, provider string, data []byte, rev uint64) (uint64, error) {
	key := Key(provider)
	var (
		newRev uint64
		err    error
	)
	if rev == 0 {
		newRev, err = p.kv.Create(ctx, key, data)
	} else {
		newRev, err = p.kv.Update(ctx, key, data, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || streamread.IsWrongLastSeq(err) {
		p.readFirst(key)
		return 0, fmt.Errorf("write fault scope %s at revision %d: %w", key, rev, engine.ErrConflict)
	}
	if err != nil {
		p.forget(key)
		return 0, fmt.Errorf("write fault scope %s: %w", key, err)
	}
	p.remember(key, cached{data: data, rev: newRev})
	return newRev, nil
}

// ReadFirst reports whether another writer was found writing provider's
// key in the last staleFor (a Put or an Update lost to it): a writer that
// holds the record in memory should Load it again before its next Put.
func (p *Store) ReadFirst(provider string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Now().Before(p.written[Key(provider)].readUntil)
}

// Seed stores the record Options.Missing rebuilds for provider when its
// key does not exist, so readers that only Get (the refusal tiers) see an
// outage that was open when the bucket was lost before the provider's next
// classification. It reports whether it wrote; an existing key, or a
// provider Missing has nothing for, is left alone.
func (p *Store) Seed(ctx context.Context, provider string) (bool, error) {
	if p.missing == nil {
		return false, nil
	}
	key := Key(provider)
	if _, err := p.kv.Get(ctx, key); err == nil || !errors.Is(err, jetstream.ErrKeyNotFound) {
		if err != nil {
			return false, fmt.Errorf("read fault scope %s: %w", key, err)
		}
		return false, nil
	}
	rec, err := p.missing(ctx, provider)
	if err != nil || rec == nil {
		return false, err
	}
	data, err := EncodeRecord(rec)
	if err != nil {
		return false, err
	}
	rev, err := p.kv.Create(ctx, key, data)
	if errors.Is(err, jetstream.ErrKeyExists) || streamread.IsWrongLastSeq(err) {
		return false, nil // a writer was first: its record stands
	}
	if err != nil {
		return false, fmt.Errorf("write fault scope %s: %w", key, err)
	}
	p.remember(key, cached{data: data, rev: rev})
	return true, nil
}

// take returns the record this Store last wrote under key, if it still
// remembers it and the key is not being read first. Its decoded form is
// the caller's from now on: the entry keeps only the bytes until the
// caller's write is stored (an Update running alongside, or one whose fn
// wrote nothing, decodes them).
func (p *Store) take(key string) (cached, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.written[key]
	if !ok || c.data == nil || time.Now().Before(c.readUntil) {
		return cached{}, false
	}
	if c.rec != nil {
		p.written[key] = cached{data: c.data, rev: c.rev, readUntil: c.readUntil}
	}
	return c, true
}

// remember keeps c as key's last write (and the key's read-first period).
func (p *Store) remember(key string, c cached) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c.readUntil = p.written[key].readUntil
	p.put(key, c)
}

// put stores c under key, dropping an arbitrary other key past
// maxCached; call with mu held.
func (p *Store) put(key string, c cached) {
	if p.written == nil {
		p.written = map[string]cached{}
	}
	if _, ok := p.written[key]; !ok && len(p.written) >= maxCached {
		for k := range p.written {
			delete(p.written, k)
			break
		}
	}
	p.written[key] = c
}

// readFirst drops key's last write and reads the key before each update
// for staleFor: another writer is writing it too.
func (p *Store) readFirst(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.put(key, cached{readUntil: time.Now().Add(staleFor)})
}

func (p *Store) forget(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.written, key)
}
