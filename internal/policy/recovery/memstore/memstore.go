// Package memstore is the recovery checklist's Store in memory: what
// `failbus simulate` and the checklist's tests run the core on. Like KV, a
// loaded record is a copy, a saved record is what a KV round trip would
// give back (record.go), and a save checks the revision.
package memstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/checklist"
	"github.com/failbus/failbus/pkg/events"
)

// Store is recovery.Store in memory, for `failbus simulate` and tests. Like
// KV, a loaded record is a copy and a save checks the revision. Provider
// records, read and written for almost every input, are kept decoded
// (copyRecord makes exactly what a msgpack round trip would); task index
// entries are kept encoded. It is safe for concurrent use.
type Store struct {
	mu         sync.Mutex
	providers  map[string]provEntry
	names      []string // the keys of providers, sorted (ListProviders)
	heartbeats map[[2]string]events.Heartbeat
	crons      map[[2]string]checklist.CronState
	runs       []events.CronRun
	writes     []events.Write
	tasks      []recovery.StoredTask // seq i+1 at index i
	index      map[string]memEntry
	ledger     map[string]time.Time
	// used is the time of each agent's latest outcome per provider;
	// decided each agent's latest decision (Usage).
	used    map[string]map[string]time.Time
	decided map[string]events.Decision
}

type memEntry struct {
	data []byte
	rev  uint64
}

// provEntry is a provider record as saved: rec is never modified (a load
// copies it, a save replaces it), so PeekProvider and Clone share it.
type provEntry struct {
	rec *recovery.ProviderRecord
	rev uint64
}

// New returns an empty store.
func New() *Store {
	return &Store{
		providers:  map[string]provEntry{},
		heartbeats: map[[2]string]events.Heartbeat{},
		crons:      map[[2]string]checklist.CronState{},
		index:      map[string]memEntry{},
		ledger:     map[string]time.Time{},
		used:       map[string]map[string]time.Time{},
		decided:    map[string]events.Decision{},
	}
}

var _ interface {
	recovery.Store
	recovery.TaskAppender
} = (*Store)(nil)

func load[T any](e memEntry, ok bool) (*T, uint64, error) {
	if !ok {
		return nil, 0, nil
	}
	v := new(T)
	if err := msgpack.Unmarshal(e.data, v); err != nil {
		return nil, 0, fmt.Errorf("memstore: decode: %w", err)
	}
	return v, e.rev, nil
}

func save(m map[string]memEntry, key string, v any, rev uint64) (uint64, error) {
	cur, ok := m[key]
	if (!ok && rev != 0) || (ok && cur.rev != rev) {
		return 0, recovery.ErrConflict
	}
	data, err := msgpack.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("memstore: encode: %w", err)
	}
	m[key] = memEntry{data: data, rev: cur.rev + 1}
	return cur.rev + 1, nil
}

// LoadProvider implements Providers.
func (s *Store) LoadProvider(_ context.Context, provider string) (*recovery.ProviderRecord, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.providers[provider]
	if !ok {
		return nil, 0, nil
	}
	r, err := copyRecord(e.rec)
	if err != nil {
		return nil, 0, fmt.Errorf("memstore: decode: %w", err)
	}
	return r, e.rev, nil
}

// SaveProvider implements Providers.
func (s *Store) SaveProvider(_ context.Context, rec *recovery.ProviderRecord, rev uint64) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.providers[rec.Provider]
	if (!ok && rev != 0) || (ok && cur.rev != rev) {
		return 0, recovery.ErrConflict
	}
	saved, err := copyRecord(rec)
	if err != nil {
		return 0, fmt.Errorf("memstore: encode: %w", err)
	}
	if !ok {
		i, _ := slices.BinarySearch(s.names, rec.Provider)
		s.names = slices.Insert(s.names, i, rec.Provider)
	}
	s.providers[rec.Provider] = provEntry{rec: saved, rev: cur.rev + 1}
	return cur.rev + 1, nil
}

// ListProviders implements Providers.
func (s *Store) ListProviders(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.names), nil
}

// LatestHealth implements Providers: in memory every health record is
// applied as it comes, so there is no gap to close.
func (s *Store) LatestHealth(context.Context, string) (*events.Health, error) { return nil, nil }

// CaughtUp implements Store: reports are applied as they come.
func (s *Store) CaughtUp(context.Context) (bool, error) { return true, nil }

// PutHeartbeat implements Heartbeats.
func (s *Store) PutHeartbeat(_ context.Context, h events.Heartbeat) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{h.Agent, h.Subagent}
	if old, ok := s.heartbeats[k]; ok && old.At.After(h.At.Time) {
		return nil
	}
	s.heartbeats[k] = h
	return nil
}

// LatestHeartbeats implements Heartbeats.
func (s *Store) LatestHeartbeats(context.Context) ([]events.Heartbeat, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]events.Heartbeat, 0, len(s.heartbeats))
	for _, h := range s.heartbeats {
		out = append(out, h)
	}
	return out, nil
}

// Heartbeat implements Heartbeats.
func (s *Store) Heartbeat(_ context.Context, agent, subagent string) (*events.Heartbeat, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.heartbeats[[2]string{agent, subagent}]
	if !ok {
		return nil, nil
	}
	return &h, nil
}

// PutCronSpec implements Crons.
func (s *Store) PutCronSpec(_ context.Context, c events.CronSpec) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{c.Agent, c.Cron}
	st := s.crons[k]
	st.Spec = c
	s.crons[k] = st
	return nil
}

// NoteCronRun implements Crons.
func (s *Store) NoteCronRun(_ context.Context, r events.CronRun) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs = append(s.runs, r)
	k := [2]string{r.Agent, r.Cron}
	if st, ok := s.crons[k]; ok && (st.FirstRunAt.IsZero() || r.ScheduledAt.Before(st.FirstRunAt.Time)) {
		st.FirstRunAt = r.ScheduledAt
		s.crons[k] = st
	}
	return nil
}

// CronStates implements Crons.
func (s *Store) CronStates(context.Context) ([]checklist.CronState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]checklist.CronState, 0, len(s.crons))
	for _, c := range s.crons {
		out = append(out, c)
	}
	return out, nil
}

// CronRuns implements Crons.
func (s *Store) CronRuns(_ context.Context, since time.Time) ([]events.CronRun, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []events.CronRun
	for _, r := range s.runs {
		if !r.At.Before(since) {
			out = append(out, r)
		}
	}
	return out, nil
}

// NoteWrite implements Writes.
func (s *Store) NoteWrite(_ context.Context, w events.Write) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, w)
	return nil
}

// WritesSince implements Writes.
func (s *Store) WritesSince(_ context.Context, since time.Time) ([]events.Write, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []events.Write
	for _, w := range s.writes {
		if !w.At.Before(since) {
			out = append(out, w)
		}
	}
	return out, nil
}

// AppendTask implements recovery.TaskAppender: the task gets the next sequence, as
// a stream would give it.
func (s *Store) AppendTask(_ context.Context, t events.Task, at time.Time) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq := uint64(len(s.tasks) + 1)
	s.tasks = append(s.tasks, recovery.StoredTask{Seq: seq, Task: t, StoredAt: at})
	return seq, nil
}

// TasksAfter implements Tasks.
func (s *Store) TasksAfter(_ context.Context, provider string, after, upto uint64, max int) ([]recovery.StoredTask, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []recovery.StoredTask
	for i := after; i < upto && i < uint64(len(s.tasks)) && len(out) < max; i++ {
		if t := s.tasks[i]; t.Task.Provider == provider {
			out = append(out, t)
		}
	}
	return out, nil
}

// TaskAt implements Tasks.
func (s *Store) TaskAt(_ context.Context, seq uint64) (*recovery.StoredTask, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq == 0 || seq > uint64(len(s.tasks)) {
		return nil, nil
	}
	t := s.tasks[seq-1]
	return &t, nil
}

// LoadTaskIndex implements Tasks.
func (s *Store) LoadTaskIndex(_ context.Context, id string) (*recovery.TaskIndex, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.index[id]
	return load[recovery.TaskIndex](e, ok)
}

// SaveTaskIndex implements Tasks.
func (s *Store) SaveTaskIndex(_ context.Context, idx *recovery.TaskIndex, rev uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := save(s.index, idx.ID, idx, rev)
	return err
}

// Sent implements Ledger.
func (s *Store) Sent(_ context.Context, id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ledger[id]
	return ok, nil
}

// MarkSent implements Ledger.
func (s *Store) MarkSent(_ context.Context, id string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ledger[id]; !ok {
		s.ledger[id] = at
	}
	return nil
}

// PeekProvider returns the provider's record and revision without
// copying the record (a virtual clock reads every record after every
// step): the caller must not modify it.
func (s *Store) PeekProvider(provider string) (*recovery.ProviderRecord, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.providers[provider]
	if !ok {
		return nil, 0, nil
	}
	return e.rec, e.rev, nil
}

// Clone returns a copy of the store: what a test forks a run from.
func (s *Store) Clone() *Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := New()
	for k, v := range s.providers {
		c.providers[k] = v
	}
	c.names = slices.Clone(s.names)
	for k, v := range s.heartbeats {
		c.heartbeats[k] = v
	}
	for k, v := range s.crons {
		c.crons[k] = v
	}
	c.runs = append(c.runs, s.runs...)
	c.writes = append(c.writes, s.writes...)
	c.tasks = append(c.tasks, s.tasks...)
	for k, v := range s.index {
		c.index[k] = v
	}
	for k, v := range s.ledger {
		c.ledger[k] = v
	}
	for p, m := range s.used {
		c.used[p] = maps.Clone(m)
	}
	maps.Copy(c.decided, s.decided)
	return c
}

// NoteOutcome implements Usage: the latest noted is the latest, as in a
// stream.
func (s *Store) NoteOutcome(_ context.Context, provider, agent string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.used[provider]
	if m == nil {
		m = map[string]time.Time{}
		s.used[provider] = m
	}
	m[agent] = at
	return nil
}

// NoteDecision implements Usage.
func (s *Store) NoteDecision(_ context.Context, d events.Decision) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decided[d.Agent] = d
	return nil
}

// RecentUsers implements Usage.
func (s *Store) RecentUsers(_ context.Context, provider string, max int) ([]recovery.User, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return recovery.LatestUsers(s.used[provider], max), nil
}

// LatestDecisions implements Usage.
func (s *Store) LatestDecisions(_ context.Context, agents []string) (map[string]events.Decision, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]events.Decision{}
	for _, a := range agents {
		if d, ok := s.decided[a]; ok {
			out[a] = d
		}
	}
	return out, nil
}
