package engine

import (
	"cmp"
	"container/heap"
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/policy/recovery/memstore"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/policy/retry"
)

// Memory implements every store in memory: what `failbus simulate`, shadow
// replays and tests run the engine on. It keeps exactly what the services
// keep durably:
//
//	Providers   ProviderRecord per provider                 KV FAILBUS_SCOPE (scheduler)
//	Ledger      latest retry.Record per budget + history     stream FAILBUS_RETRIES (scheduler)
//	Timers      due queue, one entry per retry id            JetStream message schedules
//	Refusals    refusal.Record per (segment, provider), TTL  KV FAILBUS_REFUSALS (refusal tiers)
//	Admissions  dedupe keys and each UTC day's budget        KV FAILBUS_NOTIFY_DEDUPE, _BUDGET (notifier)
//	Recovery    episodes, held tasks, heartbeats, crons …     KV FAILBUS_RECOVERY and friends (recovery)
//
// It is not safe for concurrent use: one engine, one goroutine, which is
// also what keeps a run reproducible. Updates hand fn the stored value
// itself (there is no other writer to conflict with), so a run of 100k
// outcomes copies nothing.
type Memory struct {
	providers  memProviders
	ledger     memLedger
	refusals   memRefusals
	admissions memAdmissions
	timers     memTimers
	recovery   *memstore.Store
}

type memProviders map[string]*ProviderRecord

type memLedger map[string][]*retry.Record

type memRefusals struct {
	ttl time.Duration
	m   map[refusalKey]*refusalEntry
	// bySegment and bySession index m (segment → its providers, session
	// → its segments `<session>#<n>`), so reading a segment and retiring
	// a session's segments do not scan every entry: with many sessions,
	// one scan per boundary made a replay quadratic.
	bySegment map[string]map[string]struct{}
	bySession map[string]map[string]struct{}
	// expiresFrom is at or before the earliest expiry of any entry (valid
	// when expiresKnown): RetireBefore drops expired entries only once
	// `now` reaches it.
	expiresFrom  time.Time
	expiresKnown bool
}

type memAdmissions struct {
	keys map[string]notification.KeyState
	days map[string]notification.Day
}

type memTimers struct {
	queue     timerQueue
	scheduled map[string]bool
	seq       int
}

type refusalKey struct {
	segment, provider string
}

// refusalEntry remembers when the record was last written, to apply the
// same TTL backstop the KV bucket applies per key.
type refusalEntry struct {
	rec     refusal.Record
	written time.Time
}

// NewMemory returns empty stores. refusalTTL is the refusal state's
// time-to-live (refusal.Config.StateTTL); not positive keeps it forever.
func NewMemory(refusalTTL time.Duration) *Memory {
	return &Memory{
		providers:  memProviders{},
		ledger:     memLedger{},
		refusals:   memRefusals{ttl: refusalTTL, m: map[refusalKey]*refusalEntry{}, bySegment: map[string]map[string]struct{}{}, bySession: map[string]map[string]struct{}{}},
		admissions: memAdmissions{keys: map[string]notification.KeyState{}, days: map[string]notification.Day{}},
		timers:     memTimers{scheduled: map[string]bool{}},
		recovery:   memstore.New(),
	}
}

// Stores returns m as every store.
func (m *Memory) Stores() Stores {
	return Stores{Providers: m.providers, Ledger: m.ledger, Refusals: &m.refusals, Admissions: &m.admissions, Timers: &m.timers, Recovery: m.recovery}
}

// Recovery is the recovery stage's state, for inspection and tests.
func (m *Memory) Recovery() *memstore.Store { return m.recovery }

// Provider returns provider's record (nil when none), for inspection.
func (m *Memory) Provider(provider string) *ProviderRecord { return m.providers[provider] }

// Get implements Providers.
func (m memProviders) Get(_ context.Context, provider string) (*ProviderRecord, error) {
	return m[provider], nil
}

// Update implements Providers.
func (m memProviders) Update(_ context.Context, provider string, fn func(*ProviderRecord) (bool, error)) error {
	rec := m[provider]
	if rec == nil {
		rec = &ProviderRecord{}
		rec.State.Provider = provider
	}
	write, err := fn(rec)
	if err != nil {
		return err
	}
	if write {
		m[provider] = rec
	}
	return nil
}

// Latest implements Ledger.
func (m memLedger) Latest(_ context.Context, budget string) (*retry.Record, uint64, error) {
	recs := m[budget]
	if len(recs) == 0 {
		return nil, 0, nil
	}
	return recs[len(recs)-1], uint64(len(recs)), nil
}

// Find implements Ledger.
func (m memLedger) Find(_ context.Context, budget, outcomeID string, from uint64) (*retry.Record, error) {
	recs := m[budget]
	for i := len(recs) - 1; i >= int(min(from, uint64(len(recs)))); i-- {
		if recs[i].OutcomeID == outcomeID {
			return recs[i], nil
		}
	}
	return nil, nil
}

// Append implements Ledger.
func (m memLedger) Append(_ context.Context, rec *retry.Record, rev uint64) error {
	budget := rec.Budget().Token()
	if uint64(len(m[budget])) != rev {
		return ErrConflict
	}
	m[budget] = append(m[budget], rec)
	return nil
}

func (m *memRefusals) expired(e *refusalEntry, now time.Time) bool {
	return m.ttl > 0 && !now.Before(e.written.Add(m.ttl))
}

// Update implements Refusals.
func (m *memRefusals) Update(_ context.Context, segment, provider string, now time.Time, fn func(*refusal.Record, bool) (bool, error)) error {
	k := refusalKey{segment, provider}
	e := m.m[k]
	found := e != nil && !m.expired(e, now)
	rec := refusal.Record{}
	if found {
		rec = e.rec
	}
	write, err := fn(&rec, found)
	if err != nil {
		return err
	}
	cfg := refusal.Config{StateTTL: m.ttl}
	switch {
	case write:
		m.put(k, &refusalEntry{rec: rec, written: now})
	case found && refusal.TouchDue(e.written, now, cfg):
		e.written = now // a segment still in use keeps its state
	}
	return nil
}

// put stores e under k and indexes it.
func (m *memRefusals) put(k refusalKey, e *refusalEntry) {
	if _, ok := m.m[k]; !ok {
		addIndex(m.bySegment, k.segment, k.provider)
		if s, _, ok := splitSegment(k.segment); ok {
			addIndex(m.bySession, s, k.segment)
		}
	}
	m.m[k] = e
	if m.ttl > 0 {
		if exp := e.written.Add(m.ttl); !m.expiresKnown || exp.Before(m.expiresFrom) {
			m.expiresFrom, m.expiresKnown = exp, true
		}
	}
}

// drop deletes k and its index entries.
func (m *memRefusals) drop(k refusalKey) {
	delete(m.m, k)
	dropIndex(m.bySegment, k.segment, k.provider)
	if _, ok := m.bySegment[k.segment]; !ok {
		if s, _, ok := splitSegment(k.segment); ok {
			dropIndex(m.bySession, s, k.segment)
		}
	}
}

func addIndex(ix map[string]map[string]struct{}, k, v string) {
	set := ix[k]
	if set == nil {
		set = map[string]struct{}{}
		ix[k] = set
	}
	set[v] = struct{}{}
}

func dropIndex(ix map[string]map[string]struct{}, k, v string) {
	if set := ix[k]; set != nil {
		delete(set, v)
		if len(set) == 0 {
			delete(ix, k)
		}
	}
}

// SegmentStates implements Refusals.
func (m *memRefusals) SegmentStates(_ context.Context, segment string, now time.Time) ([]refusal.State, error) {
	var out []refusal.State
	for p := range m.bySegment[segment] {
		if e := m.m[refusalKey{segment, p}]; !m.expired(e, now) {
			out = append(out, e.rec.State)
		}
	}
	slices.SortFunc(out, func(a, b refusal.State) int { return cmp.Compare(a.Provider, b.Provider) })
	return out, nil
}

// RetireBefore implements Refusals. Like the bucket, it also drops every
// entry that expired by now.
func (m *memRefusals) RetireBefore(_ context.Context, session string, segment int, now time.Time) ([]string, error) {
	var retired []string
	var drop []refusalKey
	for seg := range m.bySession[session] {
		if _, n, ok := splitSegment(seg); ok && n < segment {
			for p := range m.bySegment[seg] {
				drop = append(drop, refusalKey{seg, p})
			}
		}
	}
	for _, k := range drop {
		retired = append(retired, k.segment+"/"+k.provider)
		m.drop(k)
	}
	if !now.IsZero() && m.expiresKnown && !now.Before(m.expiresFrom) {
		m.dropExpired(now)
	}
	slices.Sort(retired)
	return retired, nil
}

// dropExpired deletes every entry expired at now and finds the next
// earliest expiry.
func (m *memRefusals) dropExpired(now time.Time) {
	m.expiresKnown = false
	for k, e := range m.m {
		if m.expired(e, now) {
			m.drop(k)
			continue
		}
		if exp := e.written.Add(m.ttl); !m.expiresKnown || exp.Before(m.expiresFrom) {
			m.expiresFrom, m.expiresKnown = exp, true
		}
	}
}

// RefusalStates returns every live refusal state at now, ordered by
// segment and provider, for inspection and tests.
func (m *Memory) RefusalStates(now time.Time) []refusal.State {
	var out []refusal.State
	for _, e := range m.refusals.m {
		if !m.refusals.expired(e, now) {
			out = append(out, e.rec.State)
		}
	}
	slices.SortFunc(out, func(a, b refusal.State) int {
		return cmp.Or(cmp.Compare(a.Segment, b.Segment), cmp.Compare(a.Provider, b.Provider))
	})
	return out
}

// RefusalState returns the live state of provider in segment at now.
func (m *Memory) RefusalState(segment, provider string, now time.Time) (refusal.State, bool) {
	e := m.refusals.m[refusalKey{segment, provider}]
	if e == nil || m.refusals.expired(e, now) {
		return refusal.State{}, false
	}
	return e.rec.State, true
}

// Key implements Admissions.
func (m *memAdmissions) Key(_ context.Context, key string) (notification.KeyState, error) {
	return m.keys[key], nil
}

// Day implements Admissions.
func (m *memAdmissions) Day(_ context.Context, day string) (notification.Day, error) {
	d := m.days[day]
	d.Day = day
	return d, nil
}

// Put implements Admissions.
func (m *memAdmissions) Put(_ context.Context, key string, ks notification.KeyState, day notification.Day) error {
	m.keys[key] = ks
	m.days[day.Day] = day
	return nil
}

// Schedule implements Timers: one entry per retry id, like one JetStream
// schedule per schedule subject.
func (m *memTimers) Schedule(_ context.Context, rec *retry.Record) error {
	if m.scheduled[rec.RetryID] {
		return nil
	}
	m.scheduled[rec.RetryID] = true
	m.seq++
	heap.Push(&m.queue, timerItem{rec: rec, seq: m.seq})
	return nil
}

// Due implements Timers.
func (m *memTimers) Due(_ context.Context, now time.Time) ([]retry.Record, error) {
	var out []retry.Record
	for m.queue.Len() > 0 && !m.queue[0].rec.DueAt.After(now) {
		out = append(out, *heap.Pop(&m.queue).(timerItem).rec)
	}
	return out, nil
}

// Pending returns the retries scheduled and not yet due, in due order.
func (m *Memory) Pending() []retry.Record {
	q := append(timerQueue(nil), m.timers.queue...)
	out := make([]retry.Record, 0, len(q))
	for q.Len() > 0 {
		out = append(out, *heap.Pop(&q).(timerItem).rec)
	}
	return out
}

type timerItem struct {
	rec *retry.Record
	seq int
}

// timerQueue is a min-heap of pending retries by due time, then by
// scheduling order.
type timerQueue []timerItem

func (q timerQueue) Len() int { return len(q) }
func (q timerQueue) Less(i, j int) bool {
	if !q[i].rec.DueAt.Equal(q[j].rec.DueAt.Time) {
		return q[i].rec.DueAt.Before(q[j].rec.DueAt.Time)
	}
	return q[i].seq < q[j].seq
}
func (q timerQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *timerQueue) Push(x any)   { *q = append(*q, x.(timerItem)) }
func (q *timerQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

// splitSegment splits a segment key `<session>#<n>`.
func splitSegment(segment string) (session string, n int, ok bool) {
	i := strings.LastIndexByte(segment, '#')
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(segment[i+1:])
	if err != nil {
		return "", 0, false
	}
	return segment[:i], n, true
}
