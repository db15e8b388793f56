package topology

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/durable"
	"github.com/failbus/failbus/pkg/events"
)

// kvStreamPrefix is how JetStream names the stream behind a KV bucket.
const kvStreamPrefix = "KV_"

// Apply makes the server behind js hold every stream, durable consumer and
// KV bucket of the topology, adjusted by opts. It is idempotent: a missing
// resource is created, an existing one is updated to the topology (a no-op
// when it already matches), and consumer positions and stored messages are
// kept.
//
// Apply works in two steps. It first reads what exists and checks that each
// existing resource can be updated in place; if any cannot, it returns every
// such problem as an *IncompatibleError (joined; use errors.As) and changes
// nothing. Then it creates or updates streams, consumers and buckets in that
// order, stopping at the first error, which names the resource, and
// deletes the durable consumers earlier versions had and this one retired
// (names.go). Running
// Apply from several processes at once is safe: each converges on the same
// configuration.
func Apply(ctx context.Context, js jetstream.JetStream, opts Options) error {
	t, err := loaded()
	if err != nil {
		return err
	}
	r, err := opts.resolve(t)
	if err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	if err := checkClustered(js, r.replicas); err != nil {
		return err
	}

	// Step 1: check what exists, change nothing.
	var incompatible []error
	exists := map[string]bool{}
	haveConsumers := map[string]jetstream.ConsumerConfig{}
	for _, want := range r.streams {
		have, err := streamConfig(ctx, js, want.Name)
		if err != nil {
			return err
		}
		if have == nil {
			continue
		}
		if e := checkStream(kindStream, want.Name, *have, want); e != nil {
			incompatible = append(incompatible, e)
			continue
		}
		exists[want.Name] = true
	}
	for _, d := range r.consumers {
		if !exists[d.stream] {
			continue
		}
		c, err := js.Consumer(ctx, d.stream, d.cfg.Durable)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("topology: look up consumer %s on %s: %w", d.cfg.Durable, d.stream, err)
		}
		have := c.CachedInfo().Config
		haveConsumers[d.cfg.Durable] = have
		if e := checkConsumer(d.cfg.Durable, have, keepRecreatedStart(have, d.cfg)); e != nil {
			incompatible = append(incompatible, e)
		}
	}
	for _, want := range r.buckets {
		have, err := streamConfig(ctx, js, kvStreamPrefix+want.Bucket)
		if err != nil {
			return err
		}
		if have == nil {
			continue
		}
		if e := checkBucket(want.Bucket, *have, want); e != nil {
			incompatible = append(incompatible, e)
		}
	}
	if len(incompatible) > 0 {
		return errors.Join(incompatible...)
	}

	// Step 2: create or update.
	for _, want := range r.streams {
		if err := applyStream(ctx, js, want, exists[want.Name]); err != nil {
			return err
		}
	}
	for _, d := range r.consumers {
		want := d.cfg
		if have, ok := haveConsumers[want.Durable]; ok {
			want = keepRecreatedStart(have, want)
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, d.stream, want); err != nil {
			return fmt.Errorf("topology: create or update consumer %s on %s: %w", d.cfg.Durable, d.stream, replicasError(js, r.replicas, err))
		}
	}
	for _, want := range r.buckets {
		if _, err := js.CreateOrUpdateKeyValue(ctx, want); err != nil {
			return fmt.Errorf("topology: create or update bucket %s: %w", want.Bucket, replicasError(js, r.replicas, err))
		}
	}
	for _, c := range durable.Retired {
		if err := js.DeleteConsumer(ctx, c.Stream, c.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("topology: delete retired consumer %s on %s: %w", c.Name, c.Stream, err)
		}
	}
	return nil
}

// ErrReplicas matches (errors.Is) every error Apply returns because the
// servers cannot hold Options.Replicas copies: a single server asked for
// more than one, or a cluster with fewer JetStream servers up than
// replicas.
var ErrReplicas = errors.New("topology: not enough servers for the replicas")

// checkClustered refuses, before anything is changed, more than one
// replica on a server that is not part of a cluster: the server would
// refuse each stream in turn, after Apply had created the others.
func checkClustered(js jetstream.JetStream, replicas int) error {
	nc := js.Conn()
	if replicas <= 1 || nc == nil || nc.ConnectedClusterName() != "" {
		return nil
	}
	return fmt.Errorf("%w: Replicas %d needs a NATS cluster of at least %d servers, but %s (server %s) is a single server; run it with replicas 1 (--replicas 1), or join it to a cluster",
		ErrReplicas, replicas, replicas, nc.ConnectedUrlRedacted(), nc.ConnectedServerName())
}

// nats-server's error codes for replicas it cannot place (nats.go has no
// names for them).
const (
	errCodeNoSuitablePeers       jetstream.ErrorCode = 10005 // JSClusterNoPeersErrF
	errCodeInsufficientResources jetstream.ErrorCode = 10023 // JSInsufficientResourcesErr
	errCodeReplicasNotSupported  jetstream.ErrorCode = 10074 // JSStreamReplicasNotSupportedErr
	errCodeStoreExceeded         jetstream.ErrorCode = 10047 // JSStorageResourcesExceededErr
)

// replicasError explains the server's refusals that come from too few
// servers for the replicas asked for; other errors are returned as they
// are.
func replicasError(js jetstream.JetStream, replicas int, err error) error {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return err
	}
	switch apiErr.ErrorCode {
	case errCodeReplicasNotSupported:
		return fmt.Errorf("%w: the server is not clustered and cannot keep %d replicas; use replicas 1: %w", ErrReplicas, replicas, err)
	case errCodeStoreExceeded:
		return fmt.Errorf("%w: the server's JetStream store limit (max_file_store; failbus dev --max-store) is below what the topology reserves, "+
			"the max_bytes of every stream and bucket (%d bytes with the defaults): raise the limit, or lower Options.MaxBytes and BucketMaxBytes: %w",
			ErrStore, DefaultReservedBytes, err)
	case errCodeInsufficientResources, errCodeNoSuitablePeers:
		known := len(js.Conn().Servers())
		return fmt.Errorf("%w: the cluster cannot place %d replicas (%d servers known to this client; are %d JetStream servers up, with room on disk?): %w", ErrReplicas, replicas, known, replicas, err)
	}
	return err
}

// streamConfig returns the configuration of the stream called name, or nil
// when there is none.
func streamConfig(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamConfig, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("topology: look up stream %s: %w", name, err)
	}
	cfg := s.CachedInfo().Config
	return &cfg, nil
}

// applyStream creates want, or updates it when it exists. A stream created
// by someone else since step 1 is checked like any existing one.
func applyStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, exists bool) error {
	if !exists {
		_, err := js.CreateStream(ctx, want)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("topology: create stream %s: %w", want.Name, replicasError(js, want.Replicas, err))
		}
		have, err := streamConfig(ctx, js, want.Name)
		if err != nil {
			return err
		}
		if have != nil {
			if e := checkStream(kindStream, want.Name, *have, want); e != nil {
				return e
			}
		}
	}
	if _, err := js.UpdateStream(ctx, want); err != nil {
		return fmt.Errorf("topology: update stream %s: %w", want.Name, replicasError(js, want.Replicas, err))
	}
	return nil
}

// checkStream returns an *IncompatibleError for the first setting of have
// that an update to want cannot change: those the server refuses to update,
// and subjects the update would drop (messages on them would silently stop
// being stored). Widening subjects (failbus.retry.ledger.> to
// failbus.retry.>), changing limits, replicas or the duplicate window, and
// turning schedules or TTLs on are updates.
func checkStream(kind, name string, have, want jetstream.StreamConfig) error {
	bad := func(field string, h, w any) error {
		return &IncompatibleError{Kind: kind, Name: name, Field: field, Have: jsonText(h), Want: jsonText(w)}
	}
	switch {
	case have.Mirror != nil && want.Mirror == nil:
		return bad("mirror", have.Mirror.Name, "")
	case have.Storage != want.Storage:
		return bad("storage", have.Storage, want.Storage)
	case have.Retention != want.Retention:
		return bad("retention", have.Retention, want.Retention)
	case slices.ContainsFunc(have.Subjects, func(h string) bool { return !covered(h, want.Subjects) }):
		return bad("subjects", strings.Join(have.Subjects, ","), strings.Join(want.Subjects, ","))
	case have.AllowMsgSchedules && !want.AllowMsgSchedules:
		return bad("allow_msg_schedules", true, false)
	case have.AllowMsgTTL && !want.AllowMsgTTL:
		return bad("allow_msg_ttl", true, false)
	case have.AllowMsgCounter != want.AllowMsgCounter:
		return bad("allow_msg_counter", have.AllowMsgCounter, want.AllowMsgCounter)
	case have.Sealed && !want.Sealed:
		return bad("sealed", true, false)
	case have.DenyDelete && !want.DenyDelete:
		return bad("deny_delete", true, false)
	case have.DenyPurge && !want.DenyPurge:
		return bad("deny_purge", true, false)
	case have.PersistMode != want.PersistMode:
		return bad("persist_mode", have.PersistMode, want.PersistMode)
	}
	return nil
}

// covered reports whether every subject matching subject is stored under one
// of subjects, so an update to subjects keeps storing it.
func covered(subject string, subjects []string) bool {
	return slices.ContainsFunc(subjects, func(s string) bool { return events.SubjectWithin(subject, s) })
}

// keepRecreatedStart returns want with the start position of have when have
// is a durable a consumer runner recreated (durable.MetaRecreated) at a stream
// sequence, where the topology says "deliver all": the server cannot move a
// consumer's start, and moving it back would hand the whole stream to the
// service again.
func keepRecreatedStart(have, want jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	if have.Metadata[durable.MetaRecreated] == "" || have.DeliverPolicy != jetstream.DeliverByStartSequencePolicy ||
		want.DeliverPolicy != jetstream.DeliverAllPolicy {
		return want
	}
	want.DeliverPolicy, want.OptStartSeq = have.DeliverPolicy, have.OptStartSeq
	meta := make(map[string]string, len(want.Metadata)+1)
	for k, v := range want.Metadata {
		meta[k] = v
	}
	meta[durable.MetaRecreated] = have.Metadata[durable.MetaRecreated]
	want.Metadata = meta
	return want
}

// checkConsumer returns an *IncompatibleError for the first setting of an
// existing consumer that the server refuses to update. Changing a filter,
// AckWait, backoff, MaxDeliver or MaxAckPending is an update that keeps the
// consumer's position.
func checkConsumer(name string, have, want jetstream.ConsumerConfig) error {
	bad := func(field string, h, w any) error {
		return &IncompatibleError{Kind: kindConsumer, Name: name, Field: field, Have: jsonText(h), Want: jsonText(w)}
	}
	switch {
	case have.DeliverSubject != "":
		return bad("deliver_subject", have.DeliverSubject, "")
	case have.DeliverPolicy != want.DeliverPolicy:
		return bad("deliver_policy", have.DeliverPolicy, want.DeliverPolicy)
	case have.AckPolicy != want.AckPolicy:
		return bad("ack_policy", have.AckPolicy, want.AckPolicy)
	case have.ReplayPolicy != want.ReplayPolicy:
		return bad("replay_policy", have.ReplayPolicy, want.ReplayPolicy)
	case have.OptStartSeq != want.OptStartSeq:
		return bad("opt_start_seq", have.OptStartSeq, want.OptStartSeq)
	case have.MemoryStorage != want.MemoryStorage:
		return bad("mem_storage", have.MemoryStorage, want.MemoryStorage)
	case want.MaxWaiting != 0 && have.MaxWaiting != want.MaxWaiting:
		return bad("max_waiting", have.MaxWaiting, want.MaxWaiting)
	}
	return nil
}

// checkBucket returns an *IncompatibleError when the stream behind an
// existing bucket cannot be updated to want.
func checkBucket(name string, have jetstream.StreamConfig, want jetstream.KeyValueConfig) error {
	bad := func(field string, h, w any) error {
		return &IncompatibleError{Kind: kindBucket, Name: name, Field: field, Have: jsonText(h), Want: jsonText(w)}
	}
	switch {
	case have.Mirror != nil && want.Mirror == nil:
		return bad("mirror", have.Mirror.Name, "")
	case have.Storage != want.Storage:
		return bad("storage", have.Storage, want.Storage)
	case have.AllowMsgTTL && want.LimitMarkerTTL == 0:
		return bad("limit_marker_ttl", have.SubjectDeleteMarkerTTL, want.LimitMarkerTTL)
	}
	return nil
}

// jsonText renders a setting as it is spelt in the JSON files ("limits",
// "file", 600000000000), so an error reads like the file to fix.
func jsonText(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if s, err := strconv.Unquote(string(b)); err == nil {
		return s
	}
	return string(b)
}
