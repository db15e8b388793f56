package recoverer

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/limitstore"
	"github.com/failbus/failbus/internal/policy/limits"
	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/checklist"
	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Store is recovery.Store on the bus: provider records, the command ledger
// and the task index in KV FAILBUS_RECOVERY, heartbeats in
// FAILBUS_HEARTBEATS, cron specs in FAILBUS_CRONS (all updated by
// revision), and what the streams hold anyway read back from them: held
// tasks from FAILBUS_TASKS (by sequence, direct get), cron runs and writes
// from FAILBUS_REPORTS, the latest health from FAILBUS_HEALTH. It is safe for
// concurrent use.
//
// KV keys:
//
//	FAILBUS_RECOVERY  prov.<provider>            recovery.ProviderRecord
//	                  sent.<sha-256 of id>       ledger entry: when the command was sent
//	                  task.<task id>             recovery.TaskIndex
//	FAILBUS_HEARTBEATS hb.<agent>.<subagent>     latest events.Heartbeat
//	FAILBUS_CRONS     cron.<agent>.<cron>        checklist.CronState
//
// where names are base64url (no padding; "=" for the empty name), so any
// name is a valid key and distinct names never share one.
type Store struct {
	js         jetstream.JetStream
	state      jetstream.KeyValue
	heartbeats jetstream.KeyValue
	crons      jetstream.KeyValue
	tasks      jetstream.Stream
	health     jetstream.Stream

	// subagents and crons keep each agent's new heartbeat and cron keys
	// within the policy's limits (nil: unbounded, as OpenStore leaves it).
	subagents *limitstore.Keys
	cronKeys  *limitstore.Keys
}

// limit bounds the subagents and crons each agent (and all agents) may
// have keys for.
func (s *Store) limit(cfg limits.Config) {
	s.subagents = limitstore.NewKeys(s.js, s.heartbeats, limitstore.KeysConfig{
		Kind: "subagent", PerAgent: cfg.SubagentsPerAgent, Total: cfg.Subagents,
		LimitAgent: limits.SubagentsPerAgent, Limit: limits.Subagents,
		Prefix: func(agent string) string { return hbPrefix + part(agent) + "." }, Token: part,
	})
	s.cronKeys = limitstore.NewKeys(s.js, s.crons, limitstore.KeysConfig{
		Kind: "cron", PerAgent: cfg.CronsPerAgent, Total: cfg.Crons,
		LimitAgent: limits.CronsPerAgent, Limit: limits.Crons,
		Prefix: func(agent string) string { return cronPrefix + part(agent) + "." }, Token: part,
	})
}

var _ recovery.Store = (*Store)(nil)

// OpenStore binds the buckets and streams; apply the topology first.
func OpenStore(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	s := &Store{js: js}
	var err error
	for _, b := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{{topology.BucketRecovery, &s.state}, {topology.BucketHeartbeats, &s.heartbeats}, {topology.BucketCrons, &s.crons}} {
		if *b.kv, err = streamread.KeyValue(ctx, js, b.name); err != nil {
			return nil, fmt.Errorf("recovery: open KV %s (apply the topology first): %w", b.name, err)
		}
	}
	if s.tasks, err = js.Stream(ctx, topology.StreamTasks); err != nil {
		return nil, fmt.Errorf("recovery: open stream %s: %w", topology.StreamTasks, err)
	}
	if s.health, err = js.Stream(ctx, topology.StreamHealth); err != nil {
		return nil, fmt.Errorf("recovery: open stream %s: %w", topology.StreamHealth, err)
	}
	return s, nil
}

// State is the FAILBUS_RECOVERY bucket (tests, tools).
func (s *Store) State() jetstream.KeyValue { return s.state }

func part(name string) string {
	if name == "" {
		return "="
	}
	return base64.RawURLEncoding.EncodeToString([]byte(name))
}

func unpart(p string) (string, error) {
	if p == "=" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(p)
	return string(b), err
}

const (
	provPrefix = "prov."
	sentPrefix = "sent."
	taskPrefix = "task."
	hbPrefix   = "hb."
	cronPrefix = "cron."
)

// ProviderKey is the FAILBUS_RECOVERY key of a provider's record.
func ProviderKey(provider string) string { return provPrefix + part(provider) }

// LedgerKey is the FAILBUS_RECOVERY key of a command's ledger entry.
func LedgerKey(id string) string {
	h := sha256.Sum256([]byte(id))
	return sentPrefix + hex.EncodeToString(h[:20])
}

func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// getKV reads key into v; found is false when there is no live value.
func getKV(ctx context.Context, kv jetstream.KeyValue, key string, v any) (rev uint64, found bool, err error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("get %s/%s: %w", kv.Bucket(), key, err)
	}
	if err := msgpack.Unmarshal(e.Value(), v); err != nil {
		return 0, false, fmt.Errorf("decode %s/%s: %w", kv.Bucket(), key, err)
	}
	return e.Revision(), true, nil
}

// putKV writes v at key if it is still at rev (0: absent); ErrConflict
// otherwise.
func putKV(ctx context.Context, kv jetstream.KeyValue, key string, v any, rev uint64) (uint64, error) {
	data, err := msgpack.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("encode %s/%s: %w", kv.Bucket(), key, err)
	}
	var n uint64
	if rev == 0 {
		n, err = kv.Create(ctx, key, data)
	} else {
		n, err = kv.Update(ctx, key, data, rev)
	}
	if isConflict(err) {
		return 0, recovery.ErrConflict
	}
	if err != nil {
		return 0, fmt.Errorf("write %s/%s: %w", kv.Bucket(), key, err)
	}
	return n, nil
}

// CaughtUp implements recovery.Store: the heartbeat and report consumers
// have acknowledged everything their streams held when it was called.
func (s *Store) CaughtUp(ctx context.Context) (bool, error) {
	for _, c := range []struct{ stream, name, filter string }{
		{topology.StreamLiveness, topology.ConsumerRecoveryHeartbeats, events.HeartbeatPrefix + ".>"},
		{topology.StreamReports, topology.ConsumerRecoveryReports, events.CronSpecPrefix + ".>"},
		{topology.StreamReports, topology.ConsumerRecoveryReports, events.CronRunPrefix + ".>"},
	} {
		st, err := s.js.Stream(ctx, c.stream)
		if err != nil {
			return false, fmt.Errorf("stream %s: %w", c.stream, err)
		}
		m, err := st.GetLastMsgForSubject(ctx, c.filter)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("last of %s: %w", c.filter, err)
		}
		cons, err := s.js.Consumer(ctx, c.stream, c.name)
		if err != nil {
			return false, fmt.Errorf("consumer %s: %w", c.name, err)
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return false, fmt.Errorf("consumer %s: %w", c.name, err)
		}
		if info.AckFloor.Stream < m.Sequence {
			return false, nil
		}
	}
	return true, nil
}

// LoadProvider implements recovery.Providers.
func (s *Store) LoadProvider(ctx context.Context, provider string) (*recovery.ProviderRecord, uint64, error) {
	var r recovery.ProviderRecord
	rev, found, err := getKV(ctx, s.state, ProviderKey(provider), &r)
	if err != nil || !found {
		return nil, 0, err
	}
	return &r, rev, nil
}

// SaveProvider implements recovery.Providers.
func (s *Store) SaveProvider(ctx context.Context, r *recovery.ProviderRecord, rev uint64) (uint64, error) {
	return putKV(ctx, s.state, ProviderKey(r.Provider), r, rev)
}

// ListProviders implements recovery.Providers. It reads the records (one
// batch read, streamread.LatestEntries) rather than listing keys: a key
// listing creates and deletes a consumer, and a submitted task asks.
func (s *Store) ListProviders(ctx context.Context) ([]string, error) {
	es, err := streamread.LatestEntries(ctx, s.js, s.state, provPrefix+">")
	if err != nil {
		return nil, fmt.Errorf("list providers: %w", err)
	}
	var out []string
	for _, e := range es {
		name, err := unpart(strings.TrimPrefix(e.Key(), provPrefix))
		if err != nil {
			continue
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return out, nil
}

// LatestHealth implements recovery.Providers: the last record on
// failbus.health.<provider> (a direct get).
func (s *Store) LatestHealth(ctx context.Context, provider string) (*events.Health, error) {
	m, err := s.health.GetLastMsgForSubject(ctx, events.HealthSubject(provider))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("latest health of %s: %w", provider, err)
	}
	h, err := events.DecodeAs[*events.Health](m.Subject, m.Header, m.Data)
	if err != nil || h.Provider != provider {
		return nil, nil // the health consumer dead-letters it
	}
	return h, nil
}

func heartbeatKey(agent, sub string) string { return hbPrefix + part(agent) + "." + part(sub) }

// PutHeartbeat implements recovery.Heartbeats.
func (s *Store) PutHeartbeat(ctx context.Context, h events.Heartbeat) error {
	key := heartbeatKey(h.Agent, h.Subagent)
	for range 64 {
		var old events.Heartbeat
		rev, found, err := getKV(ctx, s.heartbeats, key, &old)
		if err != nil {
			return err
		}
		if found && old.At.After(h.At.Time) {
			return nil
		}
		if !found && s.subagents != nil {
			if err := s.subagents.AdmitNew(ctx, h.Agent, h.Subagent); err != nil {
				return err
			}
		}
		if _, err := putKV(ctx, s.heartbeats, key, &h, rev); errors.Is(err, recovery.ErrConflict) {
			continue
		} else if err != nil {
			return err
		}
		return nil
	}
	return fmt.Errorf("heartbeat %s: %w", key, recovery.ErrConflict)
}

// Heartbeat implements recovery.Heartbeats.
func (s *Store) Heartbeat(ctx context.Context, agent, subagent string) (*events.Heartbeat, error) {
	var h events.Heartbeat
	_, found, err := getKV(ctx, s.heartbeats, heartbeatKey(agent, subagent), &h)
	if err != nil || !found {
		return nil, err
	}
	return &h, nil
}

// LatestHeartbeats implements recovery.Heartbeats: a snapshot of the bucket
// (every current value, streamread.LatestEntries).
func (s *Store) LatestHeartbeats(ctx context.Context) ([]events.Heartbeat, error) {
	var out []events.Heartbeat
	err := s.snapshot(ctx, s.heartbeats, hbPrefix+">", func(v []byte) {
		var h events.Heartbeat
		if msgpack.Unmarshal(v, &h) == nil {
			out = append(out, h)
		}
	})
	return out, err
}

// snapshot calls fn with every current value under filter (one batch read,
// streamread.LatestEntries).
func (s *Store) snapshot(ctx context.Context, kv jetstream.KeyValue, filter string, fn func([]byte)) error {
	es, err := streamread.LatestEntries(ctx, s.js, kv, filter)
	if err != nil {
		return fmt.Errorf("read %s: %w", kv.Bucket(), err)
	}
	for _, e := range es {
		fn(e.Value())
	}
	return nil
}

func cronKey(agent, cron string) string { return cronPrefix + part(agent) + "." + part(cron) }

func (s *Store) updateCron(ctx context.Context, agent, cron string, fn func(*checklist.CronState) bool) error {
	key := cronKey(agent, cron)
	for range 64 {
		var st checklist.CronState
		rev, found, err := getKV(ctx, s.crons, key, &st)
		if err != nil {
			return err
		}
		if !fn(&st) {
			return nil
		}
		if !found && s.cronKeys != nil {
			if err := s.cronKeys.AdmitNew(ctx, agent, cron); err != nil {
				return err
			}
		}
		if _, err := putKV(ctx, s.crons, key, &st, rev); errors.Is(err, recovery.ErrConflict) {
			continue
		} else if err != nil {
			return err
		}
		return nil
	}
	return fmt.Errorf("cron %s: %w", key, recovery.ErrConflict)
}

// PutCronSpec implements recovery.Crons.
func (s *Store) PutCronSpec(ctx context.Context, c events.CronSpec) error {
	return s.updateCron(ctx, c.Agent, c.Cron, func(st *checklist.CronState) bool {
		if !st.Spec.At.IsZero() && st.Spec.At.After(c.At.Time) {
			return false // an older spec arriving late
		}
		st.Spec = c
		return true
	})
}

// NoteCronRun implements recovery.Crons: it keeps the cron's first run (the
// anchor of an @every schedule); the runs themselves are read back from
// FAILBUS_REPORTS.
func (s *Store) NoteCronRun(ctx context.Context, r events.CronRun) error {
	var st checklist.CronState
	if _, _, err := getKV(ctx, s.crons, cronKey(r.Agent, r.Cron), &st); err != nil {
		return err
	}
	if !st.FirstRunAt.IsZero() && !r.ScheduledAt.Before(st.FirstRunAt.Time) {
		return nil
	}
	return s.updateCron(ctx, r.Agent, r.Cron, func(st *checklist.CronState) bool {
		if !st.FirstRunAt.IsZero() && !r.ScheduledAt.Before(st.FirstRunAt.Time) {
			return false
		}
		st.FirstRunAt = r.ScheduledAt
		return true
	})
}

// CronStates implements recovery.Crons.
func (s *Store) CronStates(ctx context.Context) ([]checklist.CronState, error) {
	var out []checklist.CronState
	err := s.snapshot(ctx, s.crons, cronPrefix+">", func(v []byte) {
		var st checklist.CronState
		if msgpack.Unmarshal(v, &st) == nil && st.Spec.Schedule != "" {
			out = append(out, st)
		}
	})
	return out, err
}

// CronRuns implements recovery.Crons: the runs stored in FAILBUS_REPORTS
// since `since`.
func (s *Store) CronRuns(ctx context.Context, since time.Time) ([]events.CronRun, error) {
	var out []events.CronRun
	err := readSince(ctx, s.js, topology.StreamReports, events.CronRunPrefix+".>", since, false, func(m jetstream.Msg) bool {
		if r, err := events.DecodeAs[*events.CronRun](m.Subject(), m.Headers(), m.Data()); err == nil {
			out = append(out, *r)
		}
		return true
	})
	return out, err
}

// NoteWrite implements recovery.Writes: nothing to do, FAILBUS_REPORTS has
// the write.
func (s *Store) NoteWrite(context.Context, events.Write) error { return nil }

// WritesSince implements recovery.Writes.
func (s *Store) WritesSince(ctx context.Context, since time.Time) ([]events.Write, error) {
	var out []events.Write
	err := readSince(ctx, s.js, topology.StreamReports, events.WritePrefix+".>", since, false, func(m jetstream.Msg) bool {
		if w, err := events.DecodeAs[*events.Write](m.Subject(), m.Headers(), m.Data()); err == nil {
			out = append(out, *w)
		}
		return true
	})
	return out, err
}

// readSince calls fn for every message on filter stored at or after since
// and before the read began (only its headers when headersOnly), in stream
// order, with an ephemeral ordered consumer, until fn returns false.
func readSince(ctx context.Context, js jetstream.JetStream, stream, filter string, since time.Time, headersOnly bool, fn func(jetstream.Msg) bool) error {
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, HeadersOnly: headersOnly,
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &since,
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = js.DeleteConsumer(dctx, stream, info.Name)
		}
	}()
	pending := c.CachedInfo().NumPending
	for seen := uint64(0); seen < pending; {
		batch, err := c.Fetch(int(min(pending-seen, 512)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if !fn(m) {
				return nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		if got == 0 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read %s: got %d of %d messages", stream, seen, pending)
		}
		seen += uint64(got)
	}
	return nil
}

// TasksAfter implements recovery.Tasks: direct gets of the next task on the
// provider's subjects, so the held tasks are read where they wait.
func (s *Store) TasksAfter(ctx context.Context, provider string, after, upto uint64, max int) ([]recovery.StoredTask, error) {
	filter := events.TaskPrefix + "." + events.Token(provider) + ".>"
	var out []recovery.StoredTask
	for seq := after + 1; seq <= upto && len(out) < max; {
		m, err := s.tasks.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("held tasks of %s after %d: %w", provider, seq, err)
		}
		if m.Sequence > upto {
			break
		}
		seq = m.Sequence + 1
		t, err := TaskFromMsg(m.Subject, m.Header, m.Data)
		if err != nil || t.Provider != provider {
			continue // dead-lettered by the task consumer; or another provider with the same token
		}
		out = append(out, recovery.StoredTask{Seq: m.Sequence, Task: *t, StoredAt: m.Time})
	}
	return out, nil
}

// TaskAt implements recovery.Tasks.
func (s *Store) TaskAt(ctx context.Context, seq uint64) (*recovery.StoredTask, error) {
	m, err := s.tasks.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("task at %d: %w", seq, err)
	}
	t, err := TaskFromMsg(m.Subject, m.Header, m.Data)
	if err != nil {
		return nil, nil
	}
	return &recovery.StoredTask{Seq: m.Sequence, Task: *t, StoredAt: m.Time}, nil
}

// TaskFromMsg decodes a task as the recovery service reads it: a message
// without a schema header is a Task (the subject carries its type), and an
// empty provider is taken from the subject.
func TaskFromMsg(subject string, h nats.Header, data []byte) (*events.Task, error) {
	t, err := events.DecodeAs[*events.Task](subject, h, data)
	if err != nil {
		return nil, err
	}
	if t.Provider == "" {
		if toks := strings.Split(subject, "."); len(toks) == 4 && toks[3] != "" && toks[2] != "_" {
			t.Provider = toks[2]
		}
	}
	return t, nil
}

func taskKey(id string) string { return taskPrefix + part(id) }

// LoadTaskIndex implements recovery.Tasks.
func (s *Store) LoadTaskIndex(ctx context.Context, id string) (*recovery.TaskIndex, uint64, error) {
	var idx recovery.TaskIndex
	rev, found, err := getKV(ctx, s.state, taskKey(id), &idx)
	if err != nil || !found {
		return nil, 0, err
	}
	return &idx, rev, nil
}

// SaveTaskIndex implements recovery.Tasks.
func (s *Store) SaveTaskIndex(ctx context.Context, idx *recovery.TaskIndex, rev uint64) error {
	_, err := putKV(ctx, s.state, taskKey(idx.ID), idx, rev)
	return err
}

// ledgerEntry is the value of a ledger key.
type ledgerEntry struct {
	ID string      `msgpack:"id"`
	At events.Time `msgpack:"at"`
}

// Sent implements recovery.Ledger.
func (s *Store) Sent(ctx context.Context, id string) (bool, error) {
	_, err := s.state.Get(ctx, LedgerKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("ledger %s: %w", id, err)
	}
	return true, nil
}

// MarkSent implements recovery.Ledger.
func (s *Store) MarkSent(ctx context.Context, id string, at time.Time) error {
	_, err := putKV(ctx, s.state, LedgerKey(id), ledgerEntry{ID: id, At: events.At(at)}, 0)
	if errors.Is(err, recovery.ErrConflict) {
		return nil
	}
	return err
}
