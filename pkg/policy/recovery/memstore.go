package recovery

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// MemStore is the Store in memory, for `failbus simulate` and tests. Like
// KV, it keeps records encoded, so a loaded record is a copy and a save
// checks the revision. It is safe for concurrent use.
type MemStore struct {
	mu         sync.Mutex
	providers  map[string]memEntry
	heartbeats map[[2]string]events.Heartbeat
	crons      map[[2]string]CronState
	runs       []events.CronRun
	writes     []events.Write
	tasks      []StoredTask // seq i+1 at index i
	index      map[string]memEntry
	ledger     map[string]time.Time
}

type memEntry struct {
	data []byte
	rev  uint64
	// peek is the decoded value for reads that do not modify it
	// (ProviderRecord only), filled on first use.
	peek *ProviderRecord
}

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	return &MemStore{
		providers:  map[string]memEntry{},
		heartbeats: map[[2]string]events.Heartbeat{},
		crons:      map[[2]string]CronState{},
		index:      map[string]memEntry{},
		ledger:     map[string]time.Time{},
	}
}

var _ interface {
	Store
	TaskAppender
} = (*MemStore)(nil)

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
		return 0, ErrConflict
	}
	data, err := msgpack.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("memstore: encode: %w", err)
	}
	m[key] = memEntry{data: data, rev: cur.rev + 1}
	return cur.rev + 1, nil
}

// LoadProvider implements Providers.
func (s *MemStore) LoadProvider(_ context.Context, provider string) (*ProviderRecord, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.providers[provider]
	return load[ProviderRecord](e, ok)
}

// SaveProvider implements Providers.
func (s *MemStore) SaveProvider(_ context.Context, rec *ProviderRecord, rev uint64) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return save(s.providers, rec.Provider, rec, rev)
}

// ListProviders implements Providers.
func (s *MemStore) ListProviders(context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.providers))
	for p := range s.providers {
		out = append(out, p)
	}
	sort.Strings(out)
	return out, nil
}

// LatestHealth implements Providers: in memory every health record is
// applied as it comes, so there is no gap to close.
func (s *MemStore) LatestHealth(context.Context, string) (*events.Health, error) { return nil, nil }

// CaughtUp implements Store: reports are applied as they come.
func (s *MemStore) CaughtUp(context.Context) (bool, error) { return true, nil }

// PutHeartbeat implements Heartbeats.
func (s *MemStore) PutHeartbeat(_ context.Context, h events.Heartbeat) error {
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
func (s *MemStore) LatestHeartbeats(context.Context) ([]events.Heartbeat, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]events.Heartbeat, 0, len(s.heartbeats))
	for _, h := range s.heartbeats {
		out = append(out, h)
	}
	return out, nil
}

// PutCronSpec implements Crons.
func (s *MemStore) PutCronSpec(_ context.Context, c events.CronSpec) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{c.Agent, c.Cron}
	st := s.crons[k]
	st.Spec = c
	s.crons[k] = st
	return nil
}

// NoteCronRun implements Crons.
func (s *MemStore) NoteCronRun(_ context.Context, r events.CronRun) error {
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
func (s *MemStore) CronStates(context.Context) ([]CronState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]CronState, 0, len(s.crons))
	for _, c := range s.crons {
		out = append(out, c)
	}
	return out, nil
}

// CronRuns implements Crons.
func (s *MemStore) CronRuns(_ context.Context, since time.Time) ([]events.CronRun, error) {
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
func (s *MemStore) NoteWrite(_ context.Context, w events.Write) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, w)
	return nil
}

// WritesSince implements Writes.
func (s *MemStore) WritesSince(_ context.Context, since time.Time) ([]events.Write, error) {
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

// AppendTask implements TaskAppender: the task gets the next sequence, as
// a stream would give it.
func (s *MemStore) AppendTask(_ context.Context, t events.Task, at time.Time) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seq := uint64(len(s.tasks) + 1)
	s.tasks = append(s.tasks, StoredTask{Seq: seq, Task: t, StoredAt: at})
	return seq, nil
}

// TasksAfter implements Tasks.
func (s *MemStore) TasksAfter(_ context.Context, provider string, after, upto uint64, max int) ([]StoredTask, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []StoredTask
	for i := after; i < upto && i < uint64(len(s.tasks)) && len(out) < max; i++ {
		if t := s.tasks[i]; t.Task.Provider == provider {
			out = append(out, t)
		}
	}
	return out, nil
}

// TaskAt implements Tasks.
func (s *MemStore) TaskAt(_ context.Context, seq uint64) (*StoredTask, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq == 0 || seq > uint64(len(s.tasks)) {
		return nil, nil
	}
	t := s.tasks[seq-1]
	return &t, nil
}

// LoadTaskIndex implements Tasks.
func (s *MemStore) LoadTaskIndex(_ context.Context, id string) (*TaskIndex, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.index[id]
	return load[TaskIndex](e, ok)
}

// SaveTaskIndex implements Tasks.
func (s *MemStore) SaveTaskIndex(_ context.Context, idx *TaskIndex, rev uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := save(s.index, idx.ID, idx, rev)
	return err
}

// Sent implements Ledger.
func (s *MemStore) Sent(_ context.Context, id string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.ledger[id]
	return ok, nil
}

// MarkSent implements Ledger.
func (s *MemStore) MarkSent(_ context.Context, id string, at time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.ledger[id]; !ok {
		s.ledger[id] = at
	}
	return nil
}

// peekProvider returns the provider's record and revision without
// copying the record: the caller must not modify it.
func (s *MemStore) peekProvider(provider string) (*ProviderRecord, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.providers[provider]
	if !ok {
		return nil, 0, nil
	}
	if e.peek == nil {
		r, _, err := load[ProviderRecord](e, true)
		if err != nil {
			return nil, 0, err
		}
		e.peek = r
		s.providers[provider] = e
	}
	return e.peek, e.rev, nil
}

// Clone returns a copy of the store: what a test forks a run from.
func (s *MemStore) Clone() *MemStore {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := NewMemStore()
	for k, v := range s.providers {
		c.providers[k] = v
	}
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
	return c
}
