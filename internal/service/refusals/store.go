package refusals

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/policy/refusal"
	topology "github.com/failbus/failbus/jetstream"
)

// ErrTooManyConflicts is returned (wrapped) when an update lost the
// compare-and-set race MaxAttempts times in a row. The consumer runner then
// retries the message with backoff; nothing was written by the lost attempts.
var ErrTooManyConflicts = errors.New("refusals: too many compare-and-set conflicts")

// MaxAttempts bounds the compare-and-set retries of one update. Each lost
// attempt means another writer succeeded, so the bound is only reached under
// a storm of writers on one key.
const MaxAttempts = 100

// Store is the refusal state in KV bucket FAILBUS_REFUSALS, one
// refusal.Record per Key(segment, provider). Every write
// is a compare-and-set on the key's revision (Create for a new key, Update
// with the revision read otherwise), retried on conflict, so two writers on
// one key never lose each other's count. It is safe for concurrent use.
type Store struct {
	kv jetstream.KeyValue
	js jetstream.JetStream
}

// OpenStore binds the refusal bucket; apply the topology first.
func OpenStore(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	kv, err := topology.KeyValue(ctx, js, topology.BucketRefusals)
	if err != nil {
		return nil, fmt.Errorf("refusals: open KV %s (apply the topology first): %w", topology.BucketRefusals, err)
	}
	return &Store{kv: kv, js: js}, nil
}

// KV is the underlying bucket, for inspection in tests and tools.
func (s *Store) KV() jetstream.KeyValue { return s.kv }

// TTL is the bucket's TTL (0 = none): the backstop for state no boundary
// retires.
func (s *Store) TTL(ctx context.Context) (time.Duration, error) {
	st, err := s.kv.Status(ctx)
	if err != nil {
		return 0, fmt.Errorf("refusals: status of KV %s: %w", topology.BucketRefusals, err)
	}
	return st.TTL(), nil
}

// Entry is one stored record with what compare-and-set and the TTL refresh
// need: its revision and when it was written.
type Entry struct {
	Key      string
	Record   refusal.Record
	Revision uint64
	Written  time.Time
	// Raw is the stored value, rewritten unchanged by a TTL refresh.
	Raw []byte
	// DecodeErr is set when the value was (partly) unreadable; Record is
	// then the conservative reading (DecodeRecord).
	DecodeErr error
}

// Get reads key; found is false when there is no live value.
func (s *Store) Get(ctx context.Context, key string) (e Entry, found bool, err error) {
	kve, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Entry{Key: key}, false, nil
	}
	if err != nil {
		return Entry{Key: key}, false, fmt.Errorf("refusals: get %s: %w", key, err)
	}
	return entryOf(kve), true, nil
}

func entryOf(kve jetstream.KeyValueEntry) Entry {
	rec, derr := DecodeRecord(kve.Value())
	return Entry{
		Key: kve.Key(), Record: rec, Revision: kve.Revision(), Written: kve.Created(),
		Raw: kve.Value(), DecodeErr: derr,
	}
}

// Put writes rec at key if the key is still at revision (0: the key must not
// exist, or be deleted). ok is false on a conflict: someone else wrote first.
func (s *Store) Put(ctx context.Context, key string, rec refusal.Record, revision uint64) (newRev uint64, ok bool, err error) {
	data, err := EncodeRecord(rec)
	if err != nil {
		return 0, false, err
	}
	return s.PutRaw(ctx, key, data, revision)
}

// PutRaw is Put with an encoded value.
func (s *Store) PutRaw(ctx context.Context, key string, data []byte, revision uint64) (newRev uint64, ok bool, err error) {
	if revision == 0 {
		newRev, err = s.kv.Create(ctx, key, data)
	} else {
		newRev, err = s.kv.Update(ctx, key, data, revision)
	}
	switch {
	case err == nil:
		return newRev, true, nil
	case IsConflict(err):
		return 0, false, nil
	}
	return 0, false, fmt.Errorf("refusals: write %s: %w", key, err)
}

// IsConflict reports whether err is a lost compare-and-set: the key exists
// (Create) or moved past the revision (Update).
func IsConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// UpdateFunc computes a record's next value from the current one (found is
// false for a new key, with rec zero). write false leaves the key as it is.
// It may run several times, once per compare-and-set attempt, so it must
// not have side effects beyond its return values; err aborts the update.
type UpdateFunc func(ctx context.Context, cur Entry, found bool) (next refusal.Record, write bool, err error)

// Update reads key, applies fn and writes the result with compare-and-set,
// re-reading and re-applying fn on every conflict, up to MaxAttempts. It
// returns the number of conflicts met, for metrics.
func (s *Store) Update(ctx context.Context, key string, fn UpdateFunc) (conflicts int, err error) {
	for range MaxAttempts {
		cur, found, err := s.Get(ctx, key)
		if err != nil {
			return conflicts, err
		}
		next, write, err := fn(ctx, cur, found)
		if err != nil || !write {
			return conflicts, err
		}
		rev := uint64(0)
		if found {
			rev = cur.Revision
		}
		if _, ok, err := s.Put(ctx, key, next, rev); err != nil {
			return conflicts, err
		} else if ok {
			return conflicts, nil
		}
		conflicts++
		if err := ctx.Err(); err != nil {
			return conflicts, fmt.Errorf("refusals: update %s: %w", key, err)
		}
	}
	return conflicts, fmt.Errorf("%w: key %s, %d attempts", ErrTooManyConflicts, key, MaxAttempts)
}

// Entries returns every live entry matching the KV key filter (with values
// unless metaOnly), read once: a snapshot, not a subscription. It is one
// batch read (topology.LatestEntries), not a watch: a refusal that
// notifies and every segment boundary ask for one, and a watch would
// create and delete a consumer each time.
func (s *Store) Entries(ctx context.Context, filter string, metaOnly bool) ([]Entry, error) {
	kves, err := topology.LatestEntries(ctx, s.js, s.kv, filter)
	if err != nil {
		return nil, fmt.Errorf("refusals: read %s: %w", filter, err)
	}
	out := make([]Entry, 0, len(kves))
	for _, kve := range kves {
		if metaOnly {
			out = append(out, Entry{Key: kve.Key(), Revision: kve.Revision(), Written: kve.Created()})
		} else {
			out = append(out, entryOf(kve))
		}
	}
	return out, nil
}

// SegmentStates returns the state of every provider in segment
// (`<session>#<n>`): what the notification dedupe key's provider list
// (refusal.Peers) is computed from.
func (s *Store) SegmentStates(ctx context.Context, segment string) ([]refusal.State, error) {
	entries, err := s.Entries(ctx, SegmentFilter(segment), false)
	if err != nil {
		return nil, err
	}
	out := make([]refusal.State, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.Record.State)
	}
	return out, nil
}

// RetireBefore deletes the state of every segment of session numbered below
// segment, whichever agent or provider it belongs to, and returns the keys
// it deleted. The new segment and later ones are kept, so a boundary handled
// late cannot wipe newer state; other sessions are left to the bucket TTL.
func (s *Store) RetireBefore(ctx context.Context, session string, segment int) ([]string, error) {
	entries, err := s.Entries(ctx, SessionFilter(session), true)
	if err != nil {
		return nil, err
	}
	var retired []string
	for _, e := range entries {
		n, ok := keySegment(e.Key, session)
		if !ok || n >= segment {
			continue
		}
		if err := s.kv.Delete(ctx, e.Key); err != nil {
			return retired, fmt.Errorf("refusals: retire %s: %w", e.Key, err)
		}
		retired = append(retired, e.Key)
	}
	return retired, nil
}

// keySegment is the segment number of a refusal key of session; false for
// keys of another session or without a numbered segment.
func keySegment(key, session string) (int, bool) {
	seg, _, err := ParseKey(key)
	if err != nil {
		return 0, false
	}
	i := strings.LastIndexByte(seg, '#')
	if i < 0 || seg[:i] != session {
		return 0, false
	}
	n, err := strconv.Atoi(seg[i+1:])
	return n, err == nil
}
