package topology_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/durable"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/storecheck"
	"github.com/failbus/failbus/internal/wiretypes"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// bundle is what a test against a real server needs.
type bundle struct {
	ctx context.Context
	nc  *nats.Conn
	js  jetstream.JetStream
}

// setup starts an embedded nats-server for one test.
func setup(t *testing.T) *bundle {
	t.Helper()
	srv := embedded.StartTest(t)
	nc := embedded.ConnectTest(t, srv)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return &bundle{ctx: ctx, nc: nc, js: js}
}

func (b *bundle) apply(t *testing.T, opts topology.Options) {
	t.Helper()
	if err := topology.Apply(b.ctx, b.js, opts); err != nil {
		t.Fatalf("Apply: %v", err)
	}
}

// snapshot is everything Apply must leave untouched when run again.
type snapshot struct {
	Streams   map[string]jetstream.StreamInfo
	Consumers map[string]jetstream.ConsumerInfo
}

func (b *bundle) snapshot(t *testing.T) snapshot {
	t.Helper()
	s := snapshot{Streams: map[string]jetstream.StreamInfo{}, Consumers: map[string]jetstream.ConsumerInfo{}}
	names := b.js.StreamNames(b.ctx)
	for n := range names.Name() {
		st, err := b.js.Stream(b.ctx, n)
		if err != nil {
			t.Fatalf("stream %s: %v", n, err)
		}
		info := *st.CachedInfo()
		info.TimeStamp = time.Time{}
		info.Cluster = nil
		s.Streams[n] = info
		for c := range st.ListConsumers(b.ctx).Info() {
			ci := *c
			ci.TimeStamp = time.Time{}
			ci.Cluster = nil
			s.Consumers[n+"/"+ci.Name] = ci
		}
	}
	if err := names.Err(); err != nil {
		t.Fatalf("list streams: %v", err)
	}
	return s
}

// embeddedFiles lists every topology file in the package directory.
func embeddedFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := fs.WalkDir(os.DirFS("."), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".json") {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestEveryFileIsLoadedAndRoundTrips(t *testing.T) {
	t.Parallel()
	paths := embeddedFiles(t)
	consumers := 0
	for _, p := range paths {
		if strings.HasPrefix(p, "consumers/") {
			consumers++
		}
	}
	if got, want := len(topology.Streams())+len(topology.Buckets())+consumers, len(paths); got != want {
		t.Fatalf("topology holds %d resources, directory has %d JSON files", got, want)
	}
	for _, p := range paths {
		t.Run(p, func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			name := strings.TrimSuffix(filepath.Base(p), ".json")
			switch {
			case strings.HasPrefix(p, "streams/"):
				got := roundTrip[jetstream.StreamConfig](t, data)
				i := slices.IndexFunc(topology.Streams(), func(s jetstream.StreamConfig) bool { return s.Name == name })
				if i < 0 || !reflect.DeepEqual(topology.Streams()[i], got) {
					t.Errorf("Streams() does not hold %s as the file says", name)
				}
			case strings.HasPrefix(p, "consumers/"):
				got := roundTrip[jetstream.ConsumerConfig](t, data)
				stream, cfg, ok := topology.Consumer(name)
				if !ok || stream != filepath.Base(filepath.Dir(p)) || !reflect.DeepEqual(cfg, got) {
					t.Errorf("Consumer(%q) = %s, %+v, %v; want the file on its stream directory", name, stream, cfg, ok)
				}
			case strings.HasPrefix(p, "buckets/"):
				got := roundTrip[jetstream.KeyValueConfig](t, data)
				i := slices.IndexFunc(topology.Buckets(), func(b jetstream.KeyValueConfig) bool { return b.Bucket == name })
				if i < 0 || !reflect.DeepEqual(topology.Buckets()[i], got) {
					t.Errorf("Buckets() does not hold %s as the file says", name)
				}
			default:
				t.Errorf("JSON file outside streams/, consumers/, buckets/")
			}
		})
	}
}

// roundTrip decodes data strictly into T, encodes it and decodes it again:
// both decodes must agree, so no setting of the file is lost on the way.
func roundTrip[T any](t *testing.T, data []byte) T {
	t.Helper()
	var first, second T
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&first); err != nil {
		t.Fatalf("decode: %v", err)
	}
	out, err := json.Marshal(first)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	if err := json.Unmarshal(out, &second); err != nil {
		t.Fatalf("decode again: %v", err)
	}
	if !reflect.DeepEqual(first, second) {
		t.Fatalf("round trip changed the config:\n%+v\n%+v", first, second)
	}
	return first
}

func TestFilesCarryTheDocumentedDefaults(t *testing.T) {
	t.Parallel()
	streams := map[string]struct {
		maxAge   time.Duration
		subjects []string
	}{
		topology.StreamOutcomes:   {topology.DefaultMaxAgeOutcomes, []string{events.OutcomePrefix + ".>", events.SegmentPrefix + ".>"}},
		topology.StreamClassified: {topology.DefaultMaxAgeClassified, []string{events.ClassifiedPrefix + ".>"}},
		topology.StreamHealth:     {topology.DefaultMaxAgeHealth, []string{events.HealthPrefix + ".>"}},
		topology.StreamDecisions:  {topology.DefaultMaxAgeDecisions, []string{events.DecisionPrefix + ".>"}},
		topology.StreamRetries:    {topology.DefaultMaxAgeRetries, []string{events.RetryPrefix + ".>"}},
		topology.StreamNotify:     {topology.DefaultMaxAgeNotify, []string{events.NotifyPrefix + ".>"}},
		topology.StreamControl:    {topology.DefaultMaxAgeControl, []string{events.ControlPrefix + ".>"}},
		topology.StreamTasks:      {topology.DefaultMaxAgeTasks, []string{events.TaskPrefix + ".>"}},
		topology.StreamDLQ:        {topology.DefaultMaxAgeDLQ, []string{events.DLQPrefix + ".>"}},
		topology.StreamLiveness:   {topology.DefaultMaxAgeLiveness, []string{events.HeartbeatPrefix + ".>"}},
		topology.StreamReports:    {topology.DefaultMaxAgeReports, []string{events.Prefix + ".cron.>", events.WritePrefix + ".>"}},
		topology.StreamDispatch:   {topology.DefaultMaxAgeDispatch, []string{events.DispatchPrefix + ".>"}},
		topology.StreamRecoveries: {topology.DefaultMaxAgeRecoveries, []string{events.RecoveryPrefix + ".>"}},
		topology.StreamAudit:      {topology.DefaultMaxAgeAudit, []string{events.AuditPrefix + ".>"}},
		topology.StreamStoreCheck: {topology.DefaultMaxAgeStoreCheck, []string{storecheck.Prefix + ".>"}},
	}
	maxBytes := map[string]int64{
		topology.StreamOutcomes: topology.DefaultMaxBytesOutcomes, topology.StreamClassified: topology.DefaultMaxBytesClassified,
		topology.StreamHealth: topology.DefaultMaxBytesHealth, topology.StreamDecisions: topology.DefaultMaxBytesDecisions,
		topology.StreamRetries: topology.DefaultMaxBytesRetries, topology.StreamNotify: topology.DefaultMaxBytesNotify,
		topology.StreamControl: topology.DefaultMaxBytesControl, topology.StreamTasks: topology.DefaultMaxBytesTasks,
		topology.StreamDLQ: topology.DefaultMaxBytesDLQ, topology.StreamAudit: topology.DefaultMaxBytesAudit,
		topology.StreamLiveness: topology.DefaultMaxBytesLiveness, topology.StreamReports: topology.DefaultMaxBytesReports,
		topology.StreamDispatch: topology.DefaultMaxBytesDispatch, topology.StreamRecoveries: topology.DefaultMaxBytesRecoveries,
		topology.StreamStoreCheck: topology.DefaultMaxBytesStoreCheck,
	}
	var reserved int64
	got := topology.Streams()
	if len(got) != len(streams) {
		t.Errorf("%d streams, want %d", len(got), len(streams))
	}
	for _, s := range got {
		want, ok := streams[s.Name]
		if !ok {
			t.Errorf("stream %s has no name constant", s.Name)
			continue
		}
		if s.MaxAge != want.maxAge || s.Duplicates != topology.DefaultDuplicateWindow ||
			s.Replicas != topology.DefaultReplicas || s.Storage != topology.DefaultStorage ||
			s.MaxBytes != maxBytes[s.Name] || s.Retention != jetstream.LimitsPolicy {
			t.Errorf("%s: max_age %v, duplicate_window %v, replicas %d, storage %v, max_bytes %d, retention %v; want the documented defaults",
				s.Name, s.MaxAge, s.Duplicates, s.Replicas, s.Storage, s.MaxBytes, s.Retention)
		}
		reserved += s.MaxBytes
		protected := s.Name == topology.StreamDLQ || s.Name == topology.StreamAudit
		if s.DenyDelete != protected || s.DenyPurge != protected {
			t.Errorf("%s: deny_delete %v, deny_purge %v; want both only on the dead letters and the audit trail", s.Name, s.DenyDelete, s.DenyPurge)
		}
		if wantDiscard := map[bool]jetstream.DiscardPolicy{true: jetstream.DiscardNew, false: jetstream.DiscardOld}[s.Name == topology.StreamTasks || s.Name == topology.StreamDispatch]; s.Discard != wantDiscard {
			t.Errorf("%s: discard %v, want %v", s.Name, s.Discard, wantDiscard)
		}
		if !slices.Equal(s.Subjects, want.subjects) {
			t.Errorf("%s: subjects %v, want %v (pkg/events prefixes)", s.Name, s.Subjects, want.subjects)
		}
		if retries := s.Name == topology.StreamRetries; s.AllowMsgSchedules != retries || s.AllowMsgTTL != retries {
			t.Errorf("%s: allow_msg_schedules %v, allow_msg_ttl %v; want both only on %s",
				s.Name, s.AllowMsgSchedules, s.AllowMsgTTL, topology.StreamRetries)
		}
	}

	buckets := map[string]time.Duration{
		topology.BucketRefusals:     topology.DefaultTTLRefusals,
		topology.BucketScope:        topology.DefaultTTLScope,
		topology.BucketNotifyDedupe: topology.DefaultTTLNotifyDedupe,
		topology.BucketNotifyBudget: topology.DefaultTTLNotifyBudget,
		topology.BucketHeartbeats:   topology.DefaultTTLHeartbeats,
		topology.BucketCrons:        topology.DefaultTTLCrons,
		topology.BucketRecovery:     topology.DefaultTTLRecovery,
		topology.BucketPolicy:       topology.DefaultTTLPolicy,
		topology.BucketDLQRequeues:  topology.DefaultTTLDLQRequeues,
		topology.BucketLimits:       topology.DefaultTTLLimits,
	}
	gotBuckets := topology.Buckets()
	if len(gotBuckets) != len(buckets) {
		t.Errorf("%d buckets, want %d", len(gotBuckets), len(buckets))
	}
	for _, b := range gotBuckets {
		ttl, ok := buckets[b.Bucket]
		if !ok {
			t.Errorf("bucket %s has no name constant", b.Bucket)
			continue
		}
		if b.TTL != ttl || b.Replicas != topology.DefaultReplicas || b.Storage != topology.DefaultStorage || b.MaxBytes != topology.DefaultBucketMaxBytes {
			t.Errorf("%s: ttl %v, replicas %d, storage %v, max_bytes %d; want the documented defaults", b.Bucket, b.TTL, b.Replicas, b.Storage, b.MaxBytes)
		}
		reserved += b.MaxBytes
	}
	if reserved != topology.DefaultReservedBytes {
		t.Errorf("the topology reserves %d bytes of store, DefaultReservedBytes says %d", reserved, topology.DefaultReservedBytes)
	}
	if b := gotBuckets[slices.IndexFunc(gotBuckets, func(b jetstream.KeyValueConfig) bool { return b.Bucket == topology.BucketRefusals })]; b.History != 1 {
		t.Errorf("%s: history %d, want 1", b.Bucket, b.History)
	}
}

func TestConsumers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		stream  string
		filters []string
	}{
		{topology.ConsumerClassifier, topology.StreamOutcomes, nil}, // every subject of its stream
		{topology.ConsumerScheduler, topology.StreamClassified, []string{"failbus.classified.>"}},
		{topology.ConsumerRefusals, topology.StreamClassified, []string{"failbus.classified.*.content_refusal"}},
		{topology.ConsumerNotifier, topology.StreamNotify, []string{"failbus.notify.>"}},
		{topology.ConsumerRecovery, topology.StreamHealth, []string{"failbus.health.>"}},
		{topology.ConsumerRecoveryHeartbeats, topology.StreamLiveness, []string{"failbus.heartbeat.>"}},
		{topology.ConsumerRecoveryReports, topology.StreamReports, nil}, // every subject of its stream
		{topology.ConsumerRecoveryTasks, topology.StreamTasks, []string{"failbus.task.>"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			stream, cfg, ok := topology.Consumer(tt.name)
			if !ok || stream != tt.stream {
				t.Fatalf("Consumer(%q) = %q, %v; want %q", tt.name, stream, ok, tt.stream)
			}
			filters := cfg.FilterSubjects
			if cfg.FilterSubject != "" {
				filters = []string{cfg.FilterSubject}
			}
			if !slices.Equal(filters, tt.filters) {
				t.Errorf("filters %v, want %v", filters, tt.filters)
			}
			if cfg.Durable != tt.name || cfg.AckPolicy != jetstream.AckExplicitPolicy || cfg.DeliverSubject != "" {
				t.Errorf("want a durable pull consumer with explicit ack, got %+v", cfg)
			}
			if cfg.MaxAckPending <= 0 || cfg.MaxAckPending > 10000 {
				t.Errorf("max_ack_pending %d, want a bounded positive value", cfg.MaxAckPending)
			}
			// The server replaces ack_wait by backoff[0]; they must agree.
			// Every redelivery delay stays inside the duplicate window.
			if len(cfg.BackOff) == 0 || cfg.AckWait != cfg.BackOff[0] || cfg.MaxDeliver <= len(cfg.BackOff) {
				t.Errorf("ack_wait %v, backoff %v, max_deliver %d: want ack_wait = backoff[0] and max_deliver > len(backoff)",
					cfg.AckWait, cfg.BackOff, cfg.MaxDeliver)
			}
			if last := cfg.BackOff[len(cfg.BackOff)-1]; last != topology.MaxRedeliveryDelay || slices.Max(cfg.BackOff) != last {
				t.Errorf("backoff %v: last step must be the longest and equal MaxRedeliveryDelay %v", cfg.BackOff, topology.MaxRedeliveryDelay)
			}
			if topology.MaxRedeliveryDelay >= topology.DefaultDuplicateWindow {
				t.Errorf("MaxRedeliveryDelay %v must be below DefaultDuplicateWindow %v", topology.MaxRedeliveryDelay, topology.DefaultDuplicateWindow)
			}
			cfg.FilterSubjects = append(cfg.FilterSubjects, "mutated")
			cfg.BackOff[0] = time.Hour
			if _, again, _ := topology.Consumer(tt.name); slices.Contains(again.FilterSubjects, "mutated") || again.BackOff[0] == time.Hour {
				t.Errorf("Consumer returned shared slices")
			}
		})
	}
	if _, _, ok := topology.Consumer("nope"); ok {
		t.Errorf("Consumer(nope) found something")
	}
}

// A consumer that reads every subject of a stream with several subjects
// lists no filters: the server reads a consumer with several filters
// through a search of the stream's subject index (nats-server 2.15,
// LoadNextMsgMulti), and at a fleet's rates (1,000 outcome subjects,
// 8k outcomes/s) that search was a fifth of the bus's CPU; without
// filters the next message is the next sequence.
func TestNoConsumerFiltersAllOfItsStream(t *testing.T) {
	t.Parallel()
	subjects := map[string][]string{}
	for _, s := range topology.Streams() {
		subjects[s.Name] = s.Subjects
	}
	for _, name := range topology.Consumers() {
		stream, cfg, _ := topology.Consumer(name)
		filters := slices.Clone(cfg.FilterSubjects)
		if cfg.FilterSubject != "" {
			filters = append(filters, cfg.FilterSubject)
		}
		all := slices.Clone(subjects[stream])
		slices.Sort(filters)
		slices.Sort(all)
		if len(filters) > 1 && slices.Equal(filters, all) {
			t.Errorf("%s on %s filters %v, every subject of the stream: leave its filters out", name, stream, filters)
		}
	}
}

// Apply takes an existing consumer to the topology's filters: a bus set up
// when the classifier's consumer still listed its stream's two subjects
// reads the same messages from the same place without them.
func TestApplyDropsFiltersThatListTheWholeStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.apply(t, topology.Options{})
	_, cfg, _ := topology.Consumer(topology.ConsumerClassifier)
	cfg.FilterSubject, cfg.FilterSubjects = "", []string{"failbus.outcome.>", "failbus.segment.>"}
	if _, err := b.js.UpdateConsumer(b.ctx, topology.StreamOutcomes, cfg); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := b.js.Publish(b.ctx, fmt.Sprintf("failbus.outcome.openai.a%d", i), []byte("x"), jetstream.WithMsgID(fmt.Sprintf("o-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	cons := b.ackFirst(t)
	b.apply(t, topology.Options{})
	info, err := cons.Info(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f := info.Config.FilterSubjects; len(f) != 0 || info.Config.FilterSubject != "" {
		t.Errorf("filters after Apply: %v %q, want none", f, info.Config.FilterSubject)
	}
	if info.AckFloor.Stream != 1 || info.NumPending != 1 {
		t.Errorf("after Apply: ack floor %d, pending %d; want 1 and 1 (the same place)", info.AckFloor.Stream, info.NumPending)
	}
}

// ackFirst acknowledges the first outcome at the classifier's consumer,
// moving its ack floor, and returns the consumer.
func (b *bundle) ackFirst(t *testing.T) jetstream.Consumer {
	t.Helper()
	cons, err := b.js.Consumer(b.ctx, topology.StreamOutcomes, topology.ConsumerClassifier)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
	return cons
}

func TestApplyTwiceIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.apply(t, topology.Options{})

	// Move the classifier: an acknowledged message must stay acknowledged.
	if _, err := b.js.Publish(b.ctx, "failbus.outcome.openai.a1", []byte("x"), jetstream.WithMsgID("o-1")); err != nil {
		t.Fatal(err)
	}
	b.ackFirst(t)
	kv, err := b.js.KeyValue(b.ctx, topology.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(b.ctx, "active", []byte("v1")); err != nil {
		t.Fatal(err)
	}

	before := b.snapshot(t)
	b.apply(t, topology.Options{})
	after := b.snapshot(t)

	if want := len(topology.Streams()) + len(topology.Buckets()); len(after.Streams) != want {
		t.Errorf("%d streams after Apply, want %d (streams and bucket streams)", len(after.Streams), want)
	}
	if want := len(topology.Consumers()); len(after.Consumers) != want {
		t.Errorf("%d consumers after Apply, want %d", len(after.Consumers), want)
	}
	if !reflect.DeepEqual(before, after) {
		for n := range after.Streams {
			if !reflect.DeepEqual(before.Streams[n], after.Streams[n]) {
				t.Errorf("stream %s changed:\n%+v\n%+v", n, before.Streams[n], after.Streams[n])
			}
		}
		for n := range after.Consumers {
			if !reflect.DeepEqual(before.Consumers[n], after.Consumers[n]) {
				t.Errorf("consumer %s changed:\n%+v\n%+v", n, before.Consumers[n], after.Consumers[n])
			}
		}
	}
	if ci := after.Consumers[topology.StreamOutcomes+"/"+topology.ConsumerClassifier]; ci.AckFloor.Stream != 1 {
		t.Errorf("classifier ack floor %d after second Apply, want 1", ci.AckFloor.Stream)
	}
	if e, err := kv.Get(b.ctx, "active"); err != nil || string(e.Value()) != "v1" {
		t.Errorf("policy bucket lost its key: %v", err)
	}
}

// TestApplyDeletesRetiredConsumers: a bus set up by an earlier version
// keeps the durables it had; Apply deletes those this version retired,
// and leaves everything else, a durable of someone else's included.
func TestApplyDeletesRetiredConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.apply(t, topology.Options{})
	for _, name := range []string{durable.RetiredRecoveryDecisions, "someone-elses"} {
		if _, err := b.js.CreateConsumer(b.ctx, topology.StreamDecisions, jetstream.ConsumerConfig{
			Durable: name, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: "failbus.decision.>",
		}); err != nil {
			t.Fatal(err)
		}
	}
	b.apply(t, topology.Options{})
	if _, err := b.js.Consumer(b.ctx, topology.StreamDecisions, durable.RetiredRecoveryDecisions); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("retired consumer %s after Apply: %v, want not found", durable.RetiredRecoveryDecisions, err)
	}
	if _, err := b.js.Consumer(b.ctx, topology.StreamDecisions, "someone-elses"); err != nil {
		t.Errorf("Apply deleted a consumer it does not own: %v", err)
	}
	if _, _, ok := topology.Consumer(durable.RetiredRecoveryDecisions); ok {
		t.Errorf("retired consumer %s is still in the topology", durable.RetiredRecoveryDecisions)
	}
	for _, c := range durable.Retired {
		if !slices.ContainsFunc(topology.Streams(), func(s jetstream.StreamConfig) bool { return s.Name == c.Stream }) {
			t.Errorf("retired consumer %s names stream %s, which is not the topology's", c.Name, c.Stream)
		}
	}
}

func TestApplyRefusesIncompatibleExistingResources(t *testing.T) {
	t.Parallel()
	base := func(name string) jetstream.StreamConfig {
		i := slices.IndexFunc(topology.Streams(), func(s jetstream.StreamConfig) bool { return s.Name == name })
		return topology.Streams()[i]
	}
	tests := []struct {
		name    string
		prepare func(t *testing.T, b *bundle)
		want    topology.IncompatibleError
	}{
		{
			name: "stream with work-queue retention",
			prepare: func(t *testing.T, b *bundle) {
				c := base(topology.StreamOutcomes)
				c.Retention = jetstream.WorkQueuePolicy
				createStream(t, b, c)
			},
			want: topology.IncompatibleError{Kind: "stream", Name: topology.StreamOutcomes, Field: "retention", Have: "workqueue", Want: "limits"},
		},
		{
			name: "stream in memory",
			prepare: func(t *testing.T, b *bundle) {
				c := base(topology.StreamDLQ)
				c.Storage = jetstream.MemoryStorage
				createStream(t, b, c)
			},
			want: topology.IncompatibleError{Kind: "stream", Name: topology.StreamDLQ, Field: "storage", Have: "memory", Want: "file"},
		},
		{
			name: "stream with a subject the topology would drop",
			prepare: func(t *testing.T, b *bundle) {
				c := base(topology.StreamHealth)
				c.Subjects = append(c.Subjects, "legacy.health.>")
				createStream(t, b, c)
			},
			want: topology.IncompatibleError{Kind: "stream", Name: topology.StreamHealth, Field: "subjects",
				Have: "failbus.health.>,legacy.health.>", Want: "failbus.health.>"},
		},
		{
			name: "stream with message schedules the topology would turn off",
			prepare: func(t *testing.T, b *bundle) {
				c := base(topology.StreamControl)
				c.AllowMsgSchedules, c.AllowRollup = true, true
				createStream(t, b, c)
			},
			want: topology.IncompatibleError{Kind: "stream", Name: topology.StreamControl, Field: "allow_msg_schedules", Have: "true", Want: "false"},
		},
		{
			name: "consumer with another ack policy",
			prepare: func(t *testing.T, b *bundle) {
				createStream(t, b, base(topology.StreamNotify))
				_, cfg, _ := topology.Consumer(topology.ConsumerNotifier)
				cfg.AckPolicy, cfg.AckWait, cfg.BackOff, cfg.MaxDeliver = jetstream.AckNonePolicy, 0, nil, 0
				if _, err := b.js.CreateConsumer(b.ctx, topology.StreamNotify, cfg); err != nil {
					t.Fatal(err)
				}
			},
			want: topology.IncompatibleError{Kind: "consumer", Name: topology.ConsumerNotifier, Field: "ack_policy", Have: "none", Want: "explicit"},
		},
		{
			name: "bucket in memory",
			prepare: func(t *testing.T, b *bundle) {
				if _, err := b.js.CreateKeyValue(b.ctx, jetstream.KeyValueConfig{Bucket: topology.BucketRefusals, Storage: jetstream.MemoryStorage}); err != nil {
					t.Fatal(err)
				}
			},
			want: topology.IncompatibleError{Kind: "bucket", Name: topology.BucketRefusals, Field: "storage", Have: "memory", Want: "file"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tt.prepare(t, b)
			err := topology.Apply(b.ctx, b.js, topology.Options{})
			var ie *topology.IncompatibleError
			if !errors.As(err, &ie) {
				t.Fatalf("Apply = %v, want an *IncompatibleError", err)
			}
			if *ie != tt.want {
				t.Errorf("IncompatibleError = %+v, want %+v", *ie, tt.want)
			}
			if !errors.Is(err, topology.ErrIncompatible) {
				t.Errorf("errors.Is(err, ErrIncompatible) = false")
			}
			for _, s := range []string{tt.want.Name, tt.want.Field, tt.want.Have, tt.want.Want} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			// Nothing was changed: the other streams were not created.
			n := 0
			for range b.js.StreamNames(b.ctx).Name() {
				n++
			}
			if n != 1 {
				t.Errorf("%d streams exist after the refused Apply, want only the prepared one", n)
			}
		})
	}
}

func createStream(t *testing.T, b *bundle, c jetstream.StreamConfig) {
	t.Helper()
	if _, err := b.js.CreateStream(b.ctx, c); err != nil {
		t.Fatalf("create %s: %v", c.Name, err)
	}
}

func TestApplyUpdatesCompatibleExistingStreams(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// An older retries stream: no schedules, no TTLs, part of the subjects,
	// a short duplicate window.
	createStream(t, b, jetstream.StreamConfig{
		Name:       topology.StreamRetries,
		Subjects:   []string{"failbus.retry.ledger.>"},
		Duplicates: time.Minute,
	})
	if _, err := b.js.Publish(b.ctx, "failbus.retry.ledger.k", []byte("r1")); err != nil {
		t.Fatal(err)
	}
	b.apply(t, topology.Options{})
	st, err := b.js.Stream(b.ctx, topology.StreamRetries)
	if err != nil {
		t.Fatal(err)
	}
	info := st.CachedInfo()
	if !info.Config.AllowMsgSchedules || !info.Config.AllowMsgTTL || info.Config.Duplicates != topology.DefaultDuplicateWindow ||
		!slices.Equal(info.Config.Subjects, []string{"failbus.retry.>"}) {
		t.Errorf("retries stream not updated: %+v", info.Config)
	}
	if info.State.Msgs != 1 {
		t.Errorf("retries stream holds %d messages after the update, want the 1 it had", info.State.Msgs)
	}
}

func TestApplyOptions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.apply(t, topology.Options{
		Storage:         jetstream.MemoryStorage,
		DuplicateWindow: 20 * time.Minute,
		MaxAge:          map[string]time.Duration{topology.StreamDLQ: time.Hour},
		MaxBytes:        map[string]int64{topology.StreamOutcomes: 1 << 30},
		BucketTTL:       map[string]time.Duration{topology.BucketRefusals: 0},
		AckWait:         5 * time.Second,
	})
	for _, name := range topology.Consumers() {
		stream, want, _ := topology.Consumer(name)
		c, err := b.js.Consumer(b.ctx, stream, name)
		if err != nil {
			t.Fatal(err)
		}
		got := c.CachedInfo().Config
		if want.AckPolicy == jetstream.AckNonePolicy {
			continue
		}
		if got.AckWait != 5*time.Second || len(got.BackOff) != len(want.BackOff) || len(got.BackOff) > 0 && (got.BackOff[0] != 5*time.Second || got.BackOff[1] != want.BackOff[1]) {
			t.Errorf("%s: ack wait %v, backoff %v; want 5s, the first step 5s and the rest as %v", name, got.AckWait, got.BackOff, want.BackOff)
		}
	}
	for _, s := range topology.Streams() {
		st, err := b.js.Stream(b.ctx, s.Name)
		if err != nil {
			t.Fatal(err)
		}
		c := st.CachedInfo().Config
		wantAge, wantBytes := s.MaxAge, s.MaxBytes
		switch s.Name {
		case topology.StreamDLQ:
			wantAge = time.Hour
		case topology.StreamOutcomes:
			wantBytes = 1 << 30
		}
		if c.Storage != jetstream.MemoryStorage || c.Duplicates != 20*time.Minute || c.MaxAge != wantAge || c.MaxBytes != wantBytes {
			t.Errorf("%s: storage %v, duplicates %v, max_age %v, max_bytes %d", s.Name, c.Storage, c.Duplicates, c.MaxAge, c.MaxBytes)
		}
	}
	kv, err := b.js.KeyValue(b.ctx, topology.BucketRefusals)
	if err != nil {
		t.Fatal(err)
	}
	status, err := kv.Status(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if status.TTL() != 0 || status.History() != 1 {
		t.Errorf("refusals bucket: ttl %v, history %d; want 0 and 1", status.TTL(), status.History())
	}
}

func TestApplyRejectsBadOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts topology.Options
		want string
	}{
		{"too many replicas", topology.Options{Replicas: 6}, "Replicas"},
		{"negative replicas", topology.Options{Replicas: -1}, "Replicas"},
		{"unknown storage", topology.Options{Storage: 7}, "Storage"},
		{"duplicate window within redelivery delay", topology.Options{DuplicateWindow: time.Minute}, "DuplicateWindow"},
		{"max age for an unknown stream", topology.Options{MaxAge: map[string]time.Duration{"FAILBUS_OUTCOME": time.Hour}}, "FAILBUS_OUTCOME"},
		{"max age shorter than the duplicate window", topology.Options{MaxAge: map[string]time.Duration{topology.StreamDLQ: time.Minute}}, "MaxAge[FAILBUS_DLQ]"},
		{"negative max age", topology.Options{MaxAge: map[string]time.Duration{topology.StreamDLQ: -time.Hour}}, "MaxAge[FAILBUS_DLQ]"},
		{"zero max bytes", topology.Options{MaxBytes: map[string]int64{topology.StreamDLQ: 0}}, "MaxBytes[FAILBUS_DLQ]"},
		{"ttl for an unknown bucket", topology.Options{BucketTTL: map[string]time.Duration{"REFUSALS": time.Hour}}, "REFUSALS"},
		{"negative ttl", topology.Options{BucketTTL: map[string]time.Duration{topology.BucketCrons: -1}}, "BucketTTL[FAILBUS_CRONS]"},
		{"an ack wait a pause would outlast", topology.Options{AckWait: time.Second}, "AckWait"},
		{"an ack wait beyond the backoff's next step", topology.Options{AckWait: 2 * time.Minute}, "AckWait"},
	}
	b := setup(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := topology.Apply(b.ctx, b.js, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Apply = %v, want an error naming %q", err, tt.want)
			}
		})
	}
	for range b.js.StreamNames(b.ctx).Name() {
		t.Fatalf("a rejected Apply created a stream")
	}
}

func TestEveryStreamDeduplicatesByMsgID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.apply(t, topology.Options{})
	for _, s := range topology.Streams() {
		t.Run(s.Name, func(t *testing.T) {
			subj := strings.NewReplacer("*", "x", ">", "dedupe.test").Replace(s.Subjects[0])
			first, err := b.js.Publish(b.ctx, subj, []byte("one"), jetstream.WithMsgID("same-id"))
			if err != nil {
				t.Fatal(err)
			}
			second, err := b.js.Publish(b.ctx, subj, []byte("two"), jetstream.WithMsgID("same-id"))
			if err != nil {
				t.Fatal(err)
			}
			if first.Stream != s.Name || first.Duplicate || !second.Duplicate || second.Sequence != first.Sequence {
				t.Errorf("first %+v, second %+v: want the second acknowledged as a duplicate of the first in %s", first, second, s.Name)
			}
			st, err := b.js.Stream(b.ctx, s.Name)
			if err != nil {
				t.Fatal(err)
			}
			if n := st.CachedInfo().State.Msgs; n != 1 {
				t.Errorf("%s holds %d messages, want 1", s.Name, n)
			}
		})
	}
}

func TestScheduledRetryFiresIntoTheDueSubject(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.apply(t, topology.Options{})
	const (
		schedSubj = "failbus.retry.sched.x"
		dueSubj   = "failbus.retry.due.x"
	)
	due := time.Now().Add(time.Second).UTC()
	msg := nats.NewMsg(schedSubj)
	msg.Data = []byte("retry r-1")
	msg.Header.Set("Nats-Schedule", "@at "+due.Format(time.RFC3339Nano))
	msg.Header.Set("Nats-Schedule-Target", dueSubj)
	msg.Header.Set(jetstream.MsgIDHeader, "r-1")
	if _, err := b.js.PublishMsg(b.ctx, msg); err != nil {
		t.Fatalf("publish schedule: %v", err)
	}

	cons, err := b.js.OrderedConsumer(b.ctx, topology.StreamRetries, jetstream.OrderedConsumerConfig{FilterSubjects: []string{dueSubj}})
	if err != nil {
		t.Fatal(err)
	}
	// Poll with a deadline: the server fires schedules on a 250 ms timer.
	deadline := time.Now().Add(20 * time.Second)
	for {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var got jetstream.Msg
		for m := range batch.Messages() {
			got = m
		}
		if got != nil {
			if string(got.Data()) != "retry r-1" || got.Subject() != dueSubj {
				t.Fatalf("fired %q on %s, want %q on %s", got.Data(), got.Subject(), "retry r-1", dueSubj)
			}
			md, err := got.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			if md.Timestamp.Before(due) {
				t.Errorf("fired at %v, before it was due at %v", md.Timestamp, due)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("schedule due at %v did not fire into %s by %v", due, dueSubj, deadline)
		}
	}
}

func TestREADMENamesEveryResource(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range topology.Streams() {
		names = append(names, "| "+s.Name+" |")
	}
	for _, b := range topology.Buckets() {
		names = append(names, "| "+b.Bucket+" |", "nats kv add "+b.Bucket+" ")
	}
	for _, c := range []string{topology.ConsumerClassifier, topology.ConsumerScheduler, topology.ConsumerRefusals, topology.ConsumerNotifier, topology.ConsumerRecovery,
		topology.ConsumerRecoveryHeartbeats, topology.ConsumerRecoveryReports, topology.ConsumerRecoveryTasks} {
		names = append(names, "| "+c+" |")
	}
	for _, n := range names {
		if !strings.Contains(string(readme), n) {
			t.Errorf("README.md does not mention %q", n)
		}
	}
}

func TestConcurrentApplyConverges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const services = 4
	errs := make(chan error, services)
	for range services {
		go func() { errs <- topology.Apply(b.ctx, b.js, topology.Options{}) }()
	}
	for range services {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Apply: %v", err)
		}
	}
	if got, want := len(b.snapshot(t).Consumers), len(topology.Consumers()); got != want {
		t.Errorf("%d consumers, want %d", got, want)
	}
}

// Replicas above 1 on a server that is not part of a cluster are refused
// before anything is created, with an error that says why and what to do.
func TestApplyRefusesReplicasOnASingleServer(t *testing.T) {
	b := setup(t)
	err := topology.Apply(b.ctx, b.js, topology.Options{Replicas: 3})
	if !errors.Is(err, topology.ErrReplicas) {
		t.Fatalf("Apply R3 on one server: %v, want ErrReplicas", err)
	}
	for _, want := range []string{"Replicas 3 needs a NATS cluster", "is a single server", "--replicas 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\nlacks %q", err, want)
		}
	}
	names := b.js.StreamNames(b.ctx)
	for n := range names.Name() {
		t.Errorf("stream %s created although Apply refused", n)
	}
	if names.Err() != nil {
		t.Fatal(names.Err())
	}
	b.apply(t, topology.Options{Replicas: 1})
}

// TestEveryTypedSubjectIsStored: each subject family that carries a wire
// type (the contract's and the services' own, wiretypes.Bus) lies inside
// one stream's subjects, so what a client or a service publishes there is
// kept, never dropped for want of a stream.
func TestEveryTypedSubjectIsStored(t *testing.T) {
	for _, schema := range wiretypes.Bus.Schemas() {
		fam := wiretypes.Bus.SubjectFamily(schema)
		if fam == "" {
			continue
		}
		var in []string
		for _, s := range topology.Streams() {
			for _, subj := range s.Subjects {
				if events.SubjectWithin(fam, subj) {
					in = append(in, s.Name)
				}
			}
		}
		if len(in) != 1 {
			t.Errorf("%s (%s) is stored by %d streams %v, want 1", fam, schema, len(in), in)
		}
	}
}
