package topology

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

const day = 24 * time.Hour

// Defaults for Options. They are the values the JSON files carry, so a
// topology applied by hand with the nats CLI and one applied by Apply with
// zero Options are the same; a test keeps the two from drifting apart.
const (
	// DefaultReplicas is one copy of every stream and bucket: right for a
	// single server and `failbus dev`. Use 3 on a cluster (docs/DEPLOY.md).
	DefaultReplicas = 1

	// DefaultStorage keeps streams and buckets on disk, so they survive a
	// restart (and a SIGKILL) of the server.
	DefaultStorage = jetstream.FileStorage

	// DefaultDuplicateWindow is how long a stream remembers a Nats-Msg-Id.
	// It is longer than the longest redelivery delay of any consumer
	// (MaxRedeliveryDelay): a service that published its outputs and then
	// died before acking sees the input again after at most that delay, and
	// its re-published outputs, carrying the same Nats-Msg-Id, are still
	// recognised as duplicates. A redelivery later than the window (a
	// handler stuck for longer, or a Nak with a delay beyond it) is not
	// deduplicated by the stream.
	DefaultDuplicateWindow = 10 * time.Minute

	// MaxRedeliveryDelay is the longest wait before a consumer redelivers an
	// unacknowledged message: the last step of every consumer's backoff
	// list (30s, 1m, 2m, 5m). DuplicateWindow must be longer.
	MaxRedeliveryDelay = 5 * time.Minute

	// NoLimit is the server's own "no limit" for MaxBytes (and
	// BucketMaxBytes): the stream is bounded by its MaxAge alone.
	NoLimit int64 = -1
)

// Default MaxBytes per stream: a ceiling under MaxAge, so one flood (an
// agent gone wrong, a stream of hostile input and its dead letters) fills
// its own stream instead of the disk every stream shares. A full stream
// drops its oldest messages (discard old), except FAILBUS_TASKS and
// FAILBUS_DISPATCH, which refuse new ones (discard new): held work is
// never dropped (the publisher is told), and a dispatch is never evicted
// before its agent read it (recovery keeps the task and tries again). JetStream reserves each stream's MaxBytes against the
// server's store limit (max_file_store) when the stream is created, so the
// server needs at least DefaultReservedBytes of it; `failbus dev` gives its
// server embedded.DefaultMaxStore (16 GiB). Size them for production with
// Options.MaxBytes: 30 days of outcomes at 100/s is hundreds of GB.
const (
	DefaultMaxBytesOutcomes   int64 = 2 << 30
	DefaultMaxBytesClassified int64 = 512 << 20
	DefaultMaxBytesHealth     int64 = 64 << 20
	DefaultMaxBytesDecisions  int64 = 256 << 20
	// DefaultMaxBytesRetries also holds pending schedules: a stream that
	// fills faster than its oldest schedule fires would drop it, so keep
	// the window MaxBytes covers (at the failure rate) above the longest
	// delay (6 h re-probes by default).
	DefaultMaxBytesRetries  int64 = 1 << 30
	DefaultMaxBytesNotify   int64 = 64 << 20
	DefaultMaxBytesControl  int64 = 64 << 20
	DefaultMaxBytesTasks    int64 = 512 << 20
	DefaultMaxBytesDLQ      int64 = 1 << 30
	DefaultMaxBytesAudit    int64 = 128 << 20
	DefaultMaxBytesLiveness int64 = 256 << 20
	DefaultMaxBytesReports  int64 = 64 << 20
	// DefaultMaxBytesDispatch is as large as FAILBUS_TASKS: every task is
	// dispatched at least once.
	DefaultMaxBytesDispatch   int64 = 512 << 20
	DefaultMaxBytesRecoveries int64 = 64 << 20
	DefaultMaxBytesStoreCheck int64 = 8 << 20

	// DefaultBucketMaxBytes caps every KV bucket (64 MiB). A full bucket
	// refuses new writes (KV buckets discard new), so a flood of keys
	// fails visibly instead of evicting live state.
	DefaultBucketMaxBytes int64 = 64 << 20

	// DefaultReservedBytes is what the default topology reserves of the
	// server's store: every stream's and bucket's MaxBytes (7.07 GiB; a
	// test keeps it equal to the files).
	DefaultReservedBytes = DefaultMaxBytesOutcomes + DefaultMaxBytesClassified + DefaultMaxBytesHealth +
		DefaultMaxBytesDecisions + DefaultMaxBytesRetries + DefaultMaxBytesNotify + DefaultMaxBytesControl +
		DefaultMaxBytesTasks + DefaultMaxBytesDLQ + DefaultMaxBytesAudit + DefaultMaxBytesLiveness +
		DefaultMaxBytesReports + DefaultMaxBytesDispatch + DefaultMaxBytesRecoveries + DefaultMaxBytesStoreCheck +
		10*DefaultBucketMaxBytes
)

// Default MaxAge per stream: how long each stream keeps its messages.
const (
	// DefaultMaxAgeOutcomes keeps raw outcomes for 30 days: the evidence
	// for `failbus tail` and for simulating a new policy over past weeks.
	DefaultMaxAgeOutcomes = 30 * day
	// DefaultMaxAgeClassified keeps classifications as long as outcomes.
	DefaultMaxAgeClassified = 30 * day
	// DefaultMaxAgeHealth keeps provider health changes for 90 days: small,
	// and the history of outages is worth keeping.
	DefaultMaxAgeHealth = 90 * day
	// DefaultMaxAgeDecisions keeps decisions for 7 days: an agent reads its
	// own within seconds; the rest is for operators.
	DefaultMaxAgeDecisions = 7 * day
	// DefaultMaxAgeRetries keeps retry records and pending schedules for 7
	// days. It must stay longer than the longest delay anything schedules
	// (retry max delay, refusal re-probes up to 6 h): a schedule older than
	// MaxAge is removed before it fires, unless it was published with
	// "Nats-TTL: never" (nats-server exempts messages with a negative TTL
	// from MaxAge; the stream allows per-message TTLs).
	DefaultMaxAgeRetries = 7 * day
	// DefaultMaxAgeNotify keeps notification requests for 7 days.
	DefaultMaxAgeNotify = 7 * day
	// DefaultMaxAgeControl keeps control commands for 7 days.
	DefaultMaxAgeControl = 7 * day
	// DefaultMaxAgeTasks keeps queued tasks for 30 days, so work held
	// through a long outage is not lost.
	DefaultMaxAgeTasks = 30 * day
	// DefaultMaxAgeLiveness keeps heartbeats for 7 days: only the latest
	// per subagent matters, and it is kept in KV.
	DefaultMaxAgeLiveness = 7 * day
	// DefaultMaxAgeReports keeps cron and write reports for 30 days, as
	// long as tasks: the checklist reads them back over the whole outage.
	DefaultMaxAgeReports = 30 * day
	// DefaultMaxAgeDispatch keeps dispatched tasks for 30 days, as long as
	// the tasks themselves.
	DefaultMaxAgeDispatch = 30 * day
	// DefaultMaxAgeRecoveries keeps recovery step records for 90 days, like
	// the health history they follow.
	DefaultMaxAgeRecoveries = 90 * day
	// DefaultMaxAgeDLQ keeps dead letters for 90 days: they are read late,
	// by a human.
	DefaultMaxAgeDLQ = 90 * day
	// DefaultMaxAgeAudit keeps audit records for 90 days.
	DefaultMaxAgeAudit = 90 * day
	// DefaultMaxAgeStoreCheck keeps a store check for an hour: only the
	// write itself matters (one per service is kept).
	DefaultMaxAgeStoreCheck = time.Hour
)

// Default TTL per KV bucket: how long a key lives after its last write. 0
// keeps keys until they are deleted.
const (
	// DefaultTTLRefusals is a backstop for abandoned segments: refusal state
	// is meant to live until a segment boundary, but a segment that never
	// sends one would otherwise keep its key forever. A segment still alive
	// after 7 days without a new refusal starts over (its provider may see
	// the refused content again): set BucketTTL[BucketRefusals] to 0 to keep
	// state until the boundary, however long.
	DefaultTTLRefusals = 7 * day
	// DefaultTTLNotifyDedupe remembers a sent notification's dedupe key for
	// 7 days; the same key after that notifies again.
	DefaultTTLNotifyDedupe = 7 * day
	// DefaultTTLNotifyBudget drops daily budget counters after 7 days.
	DefaultTTLNotifyBudget = 7 * day
	// DefaultTTLHeartbeats forgets an agent that has not beaten for 30 days.
	DefaultTTLHeartbeats = 30 * day
	// DefaultTTLCrons keeps cron specs until deleted.
	DefaultTTLCrons time.Duration = 0
	// DefaultTTLRecovery forgets a provider's recovery state, a ledger
	// entry or a task's index 30 days after its last write, as long as
	// FAILBUS_TASKS keeps the task.
	DefaultTTLRecovery = 30 * day
	// DefaultTTLScope forgets a provider's fault scope 30 days after its
	// last outcome (its profiles and models are forgotten after the
	// policy's scope.forget_after anyway).
	DefaultTTLScope = 30 * day
	// DefaultTTLPolicy keeps the policy until replaced.
	DefaultTTLPolicy time.Duration = 0
	// DefaultTTLDLQRequeues keeps a requeue mark as long as FAILBUS_DLQ
	// keeps its dead letter (DefaultMaxAgeDLQ).
	DefaultTTLDLQRequeues = DefaultMaxAgeDLQ
	// DefaultTTLLimits forgets that an agent named a provider 30 days after
	// the last time it was noted (as FAILBUS_SCOPE forgets the provider),
	// and an agent's task bytes of a day with the tasks (DefaultMaxAgeTasks).
	DefaultTTLLimits = 30 * day
)

// Options adjust the topology to a deployment. The zero value is the topology
// exactly as the JSON files say: one replica, file storage and the default
// ages above.
//
// Apply makes the server match: lowering a MaxAge, MaxBytes or TTL on an
// existing stream or bucket drops the messages beyond it at once.
type Options struct {
	// Replicas is the number of copies of every stream and bucket (consumers
	// follow their stream). Must be between 1 and 5; more than 1 needs a
	// cluster with at least that many JetStream servers up: Apply refuses
	// it on a single server before changing anything, and explains the
	// server's refusal when the cluster cannot place them (both match
	// ErrReplicas). Changing it on existing streams and buckets is an
	// update. Defaults to DefaultReplicas (1).
	Replicas int

	// Storage is where streams and buckets keep their messages. The zero
	// value is jetstream.FileStorage (DefaultStorage); MemoryStorage loses
	// everything on a server restart and suits only tests and demos. An
	// existing stream's storage cannot be changed: Apply returns an
	// *IncompatibleError instead.
	Storage jetstream.StorageType

	// MaxAge overrides how long a stream keeps messages, keyed by stream
	// name (StreamOutcomes, ...). A stream absent from the map keeps its
	// default (DefaultMaxAgeOutcomes, ...). 0 keeps messages forever; a
	// positive value must be at least DuplicateWindow.
	MaxAge map[string]time.Duration

	// MaxBytes caps a stream's size, keyed by stream name. A stream absent
	// from the map keeps its default (DefaultMaxBytesOutcomes, ...).
	// Values are NoLimit (-1) or positive. A full stream drops its oldest
	// messages (FAILBUS_TASKS refuses new ones); for StreamRetries that
	// includes pending schedules, so size it generously. The server must
	// have store (max_file_store) for the sum of all of them.
	MaxBytes map[string]int64

	// BucketMaxBytes caps a KV bucket's size, keyed by bucket name. A
	// bucket absent from the map keeps DefaultBucketMaxBytes (64 MiB).
	// Values are NoLimit (-1) or positive. A full bucket refuses writes.
	BucketMaxBytes map[string]int64

	// DuplicateWindow is how long every stream remembers a Nats-Msg-Id.
	// Defaults to DefaultDuplicateWindow (10 minutes). Must be longer than
	// MaxRedeliveryDelay, so a redelivered input's re-published outputs are
	// still deduplicated.
	DuplicateWindow time.Duration

	// BucketTTL overrides how long a key lives after its last write, keyed
	// by bucket name (BucketRefusals, ...). A bucket absent from the map
	// keeps its default (DefaultTTLRefusals, ...). 0 keeps keys forever.
	BucketTTL map[string]time.Duration

	// MaxMsgSize caps one message of a stream, keyed by stream name: the
	// server refuses a larger publish, so it is never stored. A stream
	// absent from the map keeps its default (-1, the server's
	// max_payload). Values are -1 or positive. The services set
	// StreamTasks' from the policy's limits.task_bytes.
	MaxMsgSize map[string]int32

	// AckWait is every durable consumer's lease on a first delivery: how
	// long a message delivered but never acknowledged waits before it is
	// redelivered — its service died, or it was in flight to a cluster node
	// that went away (the node loss's stall: see docs/DEPLOY.md). It
	// replaces the first step of each consumer's backoff; the later ones
	// (1m, 2m, 5m) stay. The runners keep inputs waiting for a worker
	// alive and slow handlers heartbeat at a third of it, so a short one
	// redelivers only what a dead or starved process held. Defaults to
	// the consumers' own (30s). Must be at least MinAckWait and at most
	// the backoff's next step.
	AckWait time.Duration
}

// MinAckWait is the shortest Options.AckWait: below it, a process paused
// for a moment (a long GC, a loaded machine) would see its inputs
// redelivered to another replica while it still handles them.
const MinAckWait = 2 * time.Second

// resolved is the topology with Options applied: what Apply sends.
type resolved struct {
	replicas  int
	streams   []jetstream.StreamConfig
	consumers []consumerDef
	buckets   []jetstream.KeyValueConfig
}

// resolve applies o to the embedded topology t.
func (o Options) resolve(t *topo) (*resolved, error) {
	replicas := o.Replicas
	if replicas == 0 {
		replicas = DefaultReplicas
	}
	if replicas < 1 || replicas > 5 {
		return nil, fmt.Errorf("options: Replicas %d: must be between 1 and 5", o.Replicas)
	}
	if o.Storage != jetstream.FileStorage && o.Storage != jetstream.MemoryStorage {
		return nil, fmt.Errorf("options: Storage %d: must be file or memory", o.Storage)
	}
	dup := o.DuplicateWindow
	if dup == 0 {
		dup = DefaultDuplicateWindow
	}
	if dup <= MaxRedeliveryDelay {
		return nil, fmt.Errorf("options: DuplicateWindow %v: must be longer than MaxRedeliveryDelay (%v), or a redelivered input's outputs would not be deduplicated", dup, MaxRedeliveryDelay)
	}

	streamNames := make(map[string]bool, len(t.streams))
	for _, s := range t.streams {
		streamNames[s.Name] = true
	}
	bucketNames := make(map[string]bool, len(t.buckets))
	for _, b := range t.buckets {
		bucketNames[b.Bucket] = true
	}
	if err := knownKeys("MaxAge", "stream", o.MaxAge, streamNames); err != nil {
		return nil, err
	}
	if err := knownKeys("BucketMaxBytes", "bucket", o.BucketMaxBytes, bucketNames); err != nil {
		return nil, err
	}
	if err := knownKeys("MaxBytes", "stream", o.MaxBytes, streamNames); err != nil {
		return nil, err
	}
	if err := knownKeys("BucketTTL", "bucket", o.BucketTTL, bucketNames); err != nil {
		return nil, err
	}
	if err := knownKeys("MaxMsgSize", "stream", o.MaxMsgSize, streamNames); err != nil {
		return nil, err
	}

	r := &resolved{replicas: replicas}
	for _, s := range t.streams {
		c := cloneStream(s)
		c.Replicas = replicas
		c.Storage = o.Storage
		c.Duplicates = dup
		if age, ok := o.MaxAge[c.Name]; ok {
			c.MaxAge = age
		}
		if c.MaxAge < 0 {
			return nil, fmt.Errorf("options: MaxAge[%s] %v: must not be negative", c.Name, c.MaxAge)
		}
		if c.MaxAge > 0 && c.MaxAge < dup {
			return nil, fmt.Errorf("options: MaxAge[%s] %v: must be 0 or at least DuplicateWindow (%v)", c.Name, c.MaxAge, dup)
		}
		if n, ok := o.MaxBytes[c.Name]; ok {
			if n != -1 && n <= 0 {
				return nil, fmt.Errorf("options: MaxBytes[%s] %d: must be -1 (unlimited) or positive", c.Name, n)
			}
			c.MaxBytes = n
		}
		if n, ok := o.MaxMsgSize[c.Name]; ok {
			if n != -1 && n <= 0 {
				return nil, fmt.Errorf("options: MaxMsgSize[%s] %d: must be -1 (unlimited) or positive", c.Name, n)
			}
			c.MaxMsgSize = n
		}
		r.streams = append(r.streams, c)
	}
	for _, d := range t.consumers {
		c := cloneConsumer(d.cfg)
		if o.AckWait != 0 && c.AckPolicy != jetstream.AckNonePolicy {
			most := MaxRedeliveryDelay
			if len(c.BackOff) > 1 {
				most = c.BackOff[1]
			}
			if o.AckWait < MinAckWait || o.AckWait > most {
				return nil, fmt.Errorf("options: AckWait %v: must be between %v and %v (consumer %s)", o.AckWait, MinAckWait, most, c.Durable)
			}
			c.AckWait = o.AckWait
			if len(c.BackOff) > 0 {
				c.BackOff[0] = o.AckWait // the server takes the first delivery's wait from here
			}
		}
		r.consumers = append(r.consumers, consumerDef{stream: d.stream, cfg: c})
	}
	for _, b := range t.buckets {
		c := cloneBucket(b)
		c.Replicas = replicas
		c.Storage = o.Storage
		if ttl, ok := o.BucketTTL[c.Bucket]; ok {
			if ttl < 0 {
				return nil, fmt.Errorf("options: BucketTTL[%s] %v: must not be negative", c.Bucket, ttl)
			}
			c.TTL = ttl
		}
		if n, ok := o.BucketMaxBytes[c.Bucket]; ok {
			if n != -1 && n <= 0 {
				return nil, fmt.Errorf("options: BucketMaxBytes[%s] %d: must be -1 (unlimited) or positive", c.Bucket, n)
			}
			c.MaxBytes = n
		}
		r.buckets = append(r.buckets, c)
	}
	return r, nil
}

// knownKeys rejects a map key that names no stream or bucket: a typo would
// otherwise silently leave the default in place.
func knownKeys[V any](field, kind string, m map[string]V, known map[string]bool) error {
	var bad []string
	for k := range m {
		if !known[k] {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, k)
	}
	sort.Strings(names)
	return errors.New("options: " + field + ": unknown " + kind + " " + strings.Join(bad, ", ") +
		" (known: " + strings.Join(names, ", ") + ")")
}
