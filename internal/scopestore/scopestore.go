// Package scopestore is the fault scope in JetStream: engine.Providers on
// KV bucket FAILBUS_SCOPE, one key per provider (kvkey.Escape of its name),
// the msgpack of an engine.ProviderRecord, changed only by compare-and-set
// on the key's revision. Every scheduler replica reads and writes the same
// records, so two replicas cannot disagree about an outage: the one whose
// write lands first makes the transition, the other observes on top of it.
// The refusal tiers read it to skip providers in an outage.
package scopestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/kvkey"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/engine"
)

// Store is engine.Providers on FAILBUS_SCOPE. It is safe for concurrent
// use.
type Store struct {
	kv         jetstream.KeyValue
	conflicts  prometheus.Counter
	unreadable prometheus.Counter
	log        zerolog.Logger
}

// Options are a Store's metrics and log; every field may be left zero.
type Options struct {
	// Conflicts counts writes that lost a compare-and-set race.
	Conflicts prometheus.Counter
	// Unreadable counts records that could not be decoded.
	Unreadable prometheus.Counter
	// Log receives a line for each unreadable record.
	Log zerolog.Logger
}

// Open binds the bucket; apply the topology first.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Store, error) {
	kv, err := topology.KeyValue(ctx, js, topology.BucketScope)
	if err != nil {
		return nil, fmt.Errorf("open KV %s (apply the topology first): %w", topology.BucketScope, err)
	}
	s := &Store{kv: kv, conflicts: opts.Conflicts, unreadable: opts.Unreadable, log: opts.Log}
	if s.conflicts == nil {
		s.conflicts = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
	}
	if s.unreadable == nil {
		s.unreadable = prometheus.NewCounter(prometheus.CounterOpts{Name: "unused"})
	}
	return s, nil
}

// Key is the FAILBUS_SCOPE key of provider's fault scope.
func Key(provider string) string { return kvkey.Escape(provider) }

// EncodeRecord is the stored form of a provider's record: msgpack
// with snake_case keys, map keys sorted, so equal records store equal
// bytes.
func EncodeRecord(rec *engine.ProviderRecord) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(rec); err != nil {
		return nil, fmt.Errorf("encode fault scope of %s: %w", rec.State.Provider, err)
	}
	return buf.Bytes(), nil
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
	rec, err := DecodeRecord(e.Value())
	if err != nil {
		p.unreadable.Inc()
		p.log.Error().Err(err).Str("key", key).Msg("unreadable fault-scope record: the provider starts over")
		return nil, e.Revision(), nil
	}
	if rec.State.Provider == "" {
		rec.State.Provider = provider
	}
	return rec, e.Revision(), nil
}

// Get implements engine.Providers.
func (p *Store) Get(ctx context.Context, provider string) (*engine.ProviderRecord, error) {
	rec, _, err := p.get(ctx, provider)
	return rec, err
}

// Update implements engine.Providers: read, fn, compare-and-set write; on a
// conflict again from a fresh read.
func (p *Store) Update(ctx context.Context, provider string, fn func(*engine.ProviderRecord) (bool, error)) error {
	key := Key(provider)
	for range engine.MaxConflicts {
		rec, rev, err := p.get(ctx, provider)
		if err != nil {
			return err
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
		if rev == 0 {
			_, err = p.kv.Create(ctx, key, data)
		} else {
			_, err = p.kv.Update(ctx, key, data, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || isWrongLastSeq(err) {
			p.conflicts.Inc()
			continue
		}
		if err != nil {
			return fmt.Errorf("write fault scope %s: %w", key, err)
		}
		return nil
	}
	return fmt.Errorf("fault scope %s: %w %d times in a row", key, engine.ErrConflict, engine.MaxConflicts)
}

// isWrongLastSeq reports a compare-and-set conflict as the server words it
// (10071, or 10164 on replicated streams).
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}
