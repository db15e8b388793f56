package streamread

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// KeyValue opens bucket like js.KeyValue, and keeps it open: when a read or
// write finds the bucket gone (an operator deleted it), the bucket is
// recreated with the configuration it had when opened — the topology's, as
// Apply made it — the recreation is logged with its cause, and the
// operation runs once more. Without it, a service whose bucket was deleted
// fails every operation until someone re-applies the topology.
//
// The recreation is logged to the logger of the failed operation's context
// (zerolog.Ctx: a consumer runner puts its service's logger in every
// handler's context), else nowhere. What the bucket held is gone with it: a
// service reads a recreated bucket as empty (refusal state starts over,
// notification keys may be sent again). Watchers and listers are passed
// through untouched.
func KeyValue(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("bucket %s status: %w", bucket, err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok || bs.StreamInfo() == nil {
		return kv, nil // not a JetStream-backed status: nothing to heal from
	}
	return &healingKV{KeyValue: kv, js: js, cfg: bs.StreamInfo().Config}, nil
}

// healingKV is a KeyValue that recreates its bucket when it disappears.
type healingKV struct {
	jetstream.KeyValue
	js  jetstream.JetStream
	cfg jetstream.StreamConfig
	mu  sync.Mutex
}

// bucketGone reports whether err is what a KV operation returns once its
// bucket's stream is deleted.
func bucketGone(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// heal recreates the bucket if it is gone and reports whether the failed
// operation is worth running again.
func (h *healingKV) heal(ctx context.Context, cause error) bool {
	if !bucketGone(cause) {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.js.KeyValue(ctx, h.Bucket())
	if err == nil {
		return true // recreated meanwhile (by us, another replica or Apply)
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return false
	}
	log := zerolog.Ctx(ctx)
	if _, err := h.js.CreateStream(ctx, h.cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		log.Error().Err(err).Str("bucket", h.Bucket()).AnErr("cause", cause).Msg("bucket was deleted and could not be recreated")
		return false
	}
	log.Warn().Str("bucket", h.Bucket()).AnErr("cause", cause).
		Msg("bucket was deleted: recreated from the topology, empty")
	return true
}

func (h *healingKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := h.KeyValue.Get(ctx, key)
	if err != nil && h.heal(ctx, err) {
		return h.KeyValue.Get(ctx, key)
	}
	return e, err
}

func (h *healingKV) GetRevision(ctx context.Context, key string, revision uint64) (jetstream.KeyValueEntry, error) {
	e, err := h.KeyValue.GetRevision(ctx, key, revision)
	if err != nil && h.heal(ctx, err) {
		return h.KeyValue.GetRevision(ctx, key, revision)
	}
	return e, err
}

func (h *healingKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := h.KeyValue.Put(ctx, key, value)
	if err != nil && h.heal(ctx, err) {
		return h.KeyValue.Put(ctx, key, value)
	}
	return rev, err
}

func (h *healingKV) PutString(ctx context.Context, key string, value string) (uint64, error) {
	return h.Put(ctx, key, []byte(value))
}

func (h *healingKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	rev, err := h.KeyValue.Create(ctx, key, value, opts...)
	if err != nil && h.heal(ctx, err) {
		return h.KeyValue.Create(ctx, key, value, opts...)
	}
	return rev, err
}

// Update runs again after a recreation too: in the empty bucket the
// revision it expects does not exist, so the caller's compare-and-set gets
// the wrong-revision error and re-reads, as after any lost race.
func (h *healingKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	rev, err := h.KeyValue.Update(ctx, key, value, revision)
	if err != nil && h.heal(ctx, err) {
		return h.KeyValue.Update(ctx, key, value, revision)
	}
	return rev, err
}

func (h *healingKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	err := h.KeyValue.Delete(ctx, key, opts...)
	if err != nil && h.heal(ctx, err) {
		return h.KeyValue.Delete(ctx, key, opts...)
	}
	return err
}

func (h *healingKV) Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	err := h.KeyValue.Purge(ctx, key, opts...)
	if err != nil && h.heal(ctx, err) {
		return h.KeyValue.Purge(ctx, key, opts...)
	}
	return err
}
