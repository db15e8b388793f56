// Package limitstore keeps each agent within its share of the bus's shared
// state, as the policy's `limits:` section bounds it (internal/policy/limits):
// the providers an agent names (Providers, on KV bucket FAILBUS_LIMITS),
// the keys an agent holds in a service's own bucket (Keys: subagents in
// FAILBUS_HEARTBEATS, crons in FAILBUS_CRONS), and the tasks and bytes an
// agent has in FAILBUS_TASKS (Tasks). A refusal is a *limits.Exceeded,
// which the services dead-letter, and Notifier tells a human once per
// agent, limit and day.
//
// Counting is cheap where it matters: a name already admitted is
// remembered in memory, and an agent's names are listed from the store
// only when it admits a new one; an agent at its limit is refused from
// memory for CountFor, so a flood of new names from one agent costs no
// store read per record. The stores stay the truth: every replica reads
// the same keys, and a name counts from its key's creation until its TTL.
package limitstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/jspub"
	"github.com/failbus/failbus/internal/kvkey"
	"github.com/failbus/failbus/internal/policy/limits"
	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// CountFor is how long a count read from the store is trusted: an agent at
// its limit is refused from memory this long before the store is read
// again (names expire, other replicas admit).
const CountFor = 10 * time.Second

// rememberFor is how long an admitted name is known without a store read;
// the key is written again (its TTL renewed) when it is older than this.
const rememberFor = 24 * time.Hour

// maxRemembered bounds the admitted names kept in memory (past it one is
// forgotten: it costs a store read when it comes again).
const maxRemembered = 200_000

// Key prefixes in FAILBUS_LIMITS.
const (
	agentProviderPrefix = "p." // p.<agent>.<provider>: the agent named the provider
	providerPrefix      = "P." // P.<provider>: some agent named the provider
	taskPrefix          = "t." // t.<agent>: the agent's tasks per day (Tasks)
)

// bucket opens FAILBUS_LIMITS once, when first needed (a service starts
// before an admin applied a topology that has it, and logs the error per
// record until it exists).
type bucket struct {
	js jetstream.JetStream
	mu sync.Mutex
	kv jetstream.KeyValue
}

func (b *bucket) get(ctx context.Context) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	kv, err := streamread.KeyValue(ctx, b.js, topology.BucketLimits)
	if err != nil {
		return nil, fmt.Errorf("limits: open %s (apply the topology): %w", topology.BucketLimits, err)
	}
	b.kv = kv
	return kv, nil
}

// set is a count of names read from a store, with the names.
type set struct {
	names map[string]bool
	at    time.Time
}

func (s *set) fresh(now time.Time) bool { return s != nil && now.Sub(s.at) < CountFor }

// Providers admits the providers agents name against
// limits.ProvidersPerAgent and limits.Providers. It is safe for concurrent
// use.
type Providers struct {
	b   bucket
	cfg limits.Config
	now func() time.Time

	// admitting serialises the admission of new names in this process,
	// so concurrent handlers cannot each take the last place.
	admitting sync.Mutex

	mu     sync.Mutex
	known  map[string]time.Time // p.<agent>.<provider> -> when it was last written or read
	agents map[string]*set      // agent -> its providers, as last listed
	all    *set                 // every provider, as last listed
}

// NewProviders returns a Providers on js's FAILBUS_LIMITS under cfg; now
// nil selects time.Now.
func NewProviders(js jetstream.JetStream, cfg limits.Config, now func() time.Time) *Providers {
	if now == nil {
		now = time.Now
	}
	return &Providers{b: bucket{js: js}, cfg: cfg, now: now, known: map[string]time.Time{}, agents: map[string]*set{}}
}

// Admit reports nil when agent may name provider: it named it before, or
// it and all agents together are below their limits (then the name is
// recorded). Otherwise it returns a *limits.Exceeded. An empty provider
// (a record for every provider) is always admitted.
func (p *Providers) Admit(ctx context.Context, agent, provider string) error {
	if provider == "" {
		return nil
	}
	now := p.now()
	ea, ep := kvkey.Escape(agent), kvkey.Escape(provider)
	key := agentProviderPrefix + ea + "." + ep
	p.mu.Lock()
	if at, ok := p.known[key]; ok && now.Sub(at) < rememberFor {
		p.mu.Unlock()
		return nil
	}
	if s := p.agents[agent]; s.fresh(now) && len(s.names) >= p.cfg.ProvidersPerAgent && !s.names[ep] {
		p.mu.Unlock()
		return limits.Admit(limits.ProvidersPerAgent, int64(p.cfg.ProvidersPerAgent), int64(len(s.names)), agent, "provider", provider)
	}
	p.mu.Unlock()

	p.admitting.Lock()
	defer p.admitting.Unlock()
	kv, err := p.b.get(ctx)
	if err != nil {
		return err
	}
	e, err := kv.Get(ctx, key)
	switch {
	case err == nil:
		if now.Sub(e.Created()) >= rememberFor {
			if _, err := kv.Put(ctx, key, nil); err != nil {
				return fmt.Errorf("limits: renew %s: %w", key, err)
			}
		}
		p.remember(key, now)
		return nil
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("limits: read %s: %w", key, err)
	}
	mine, err := p.list(ctx, kv, agent, agentProviderPrefix+ea+".", now)
	if err != nil {
		return err
	}
	if !mine.names[ep] {
		if err := limits.Admit(limits.ProvidersPerAgent, int64(p.cfg.ProvidersPerAgent), int64(len(mine.names)), agent, "provider", provider); err != nil {
			return err
		}
	}
	if err := p.admitProvider(ctx, kv, agent, provider, ep, now); err != nil {
		return err
	}
	if _, err := kv.Create(ctx, key, nil); err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !streamread.IsWrongLastSeq(err) {
		return fmt.Errorf("limits: record %s: %w", key, err)
	}
	p.mu.Lock()
	if s := p.agents[agent]; s != nil {
		s.names[ep] = true
	}
	p.mu.Unlock()
	p.remember(key, now)
	return nil
}

// admitProvider records provider among all agents' providers, or refuses
// it past limits.Providers.
func (p *Providers) admitProvider(ctx context.Context, kv jetstream.KeyValue, agent, provider, ep string, now time.Time) error {
	key := providerPrefix + ep
	_, err := kv.Get(ctx, key)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("limits: read %s: %w", key, err)
	}
	all, err := p.list(ctx, kv, "", providerPrefix, now)
	if err != nil {
		return err
	}
	if !all.names[ep] {
		if err := limits.Admit(limits.Providers, int64(p.cfg.Providers), int64(len(all.names)), agent, "provider", provider); err != nil {
			return err
		}
	}
	if _, err := kv.Create(ctx, key, nil); err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !streamread.IsWrongLastSeq(err) {
		return fmt.Errorf("limits: record %s: %w", key, err)
	}
	p.mu.Lock()
	if p.all != nil {
		p.all.names[ep] = true
	}
	p.mu.Unlock()
	return nil
}

// list returns the names under prefix (the last key token), from memory
// when listed within CountFor, else from the store. agent "" is the set of
// all providers.
func (p *Providers) list(ctx context.Context, kv jetstream.KeyValue, agent, prefix string, now time.Time) (*set, error) {
	p.mu.Lock()
	s := p.all
	if agent != "" {
		s = p.agents[agent]
	}
	p.mu.Unlock()
	if s.fresh(now) {
		return s, nil
	}
	names, err := listNames(ctx, p.b.js, kv, prefix)
	if err != nil {
		return nil, err
	}
	s = &set{names: names, at: now}
	p.mu.Lock()
	if agent == "" {
		p.all = s
	} else {
		if len(p.agents) >= maxRemembered/16 {
			clear(p.agents)
		}
		p.agents[agent] = s
	}
	p.mu.Unlock()
	return s, nil
}

func (p *Providers) remember(key string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.known) >= maxRemembered {
		for k := range p.known {
			delete(p.known, k)
			break
		}
	}
	p.known[key] = at
}

// listNames reads the keys under prefix (one batched read of the latest
// values, streamread.LatestEntries) and returns their remainders.
func listNames(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, prefix string) (map[string]bool, error) {
	es, err := streamread.LatestEntries(ctx, js, kv, prefix+">")
	if err != nil {
		return nil, fmt.Errorf("limits: list %s%s: %w", kv.Bucket(), "/"+prefix, err)
	}
	names := make(map[string]bool, len(es))
	for _, e := range es {
		if len(e.Key()) > len(prefix) {
			names[e.Key()[len(prefix):]] = true
		}
	}
	return names, nil
}

// Keys admits an agent's new keys in a bucket the service keeps them in
// (a subagent's heartbeat in FAILBUS_HEARTBEATS, a cron in FAILBUS_CRONS)
// against a per-agent and a total limit. The caller asks only for a key
// that does not exist yet. It is safe for concurrent use.
type Keys struct {
	js                jetstream.JetStream
	kv                jetstream.KeyValue
	kind              string
	perAgent, total   int
	limitAgent, limit string
	prefix            func(agent string) string
	token             func(name string) string
	now               func() time.Time

	admitting sync.Mutex
	mu        sync.Mutex
	agents    map[string]*set
	count     struct {
		n  int64
		at time.Time
	}
}

// KeysConfig configures a Keys.
type KeysConfig struct {
	// Kind names what a key is ("subagent", "cron") in a refusal.
	Kind string
	// PerAgent and Total are the limits; LimitAgent and Limit their policy
	// keys (limits.SubagentsPerAgent, limits.Subagents).
	PerAgent, Total   int
	LimitAgent, Limit string
	// Prefix is the key prefix of an agent's keys, ending with '.', and
	// Token the rest of the key of one name: an agent's key for name is
	// Prefix(agent) + Token(name).
	Prefix func(agent string) string
	Token  func(name string) string
	// Now is the clock; nil selects time.Now.
	Now func() time.Time
}

// NewKeys returns a Keys over kv.
func NewKeys(js jetstream.JetStream, kv jetstream.KeyValue, c KeysConfig) *Keys {
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Keys{js: js, kv: kv, kind: c.Kind, perAgent: c.PerAgent, total: c.Total, limitAgent: c.LimitAgent, limit: c.Limit,
		prefix: c.Prefix, token: c.Token, now: c.Now, agents: map[string]*set{}}
}

// AdmitNew reports nil when agent may create its key for name (which does
// not exist yet), and counts it from then on, else a *limits.Exceeded.
// Admissions in this process are serialised, so concurrent handlers cannot
// each take the last place; a name admitted but never written is counted
// until the agent's keys are listed again (CountFor).
func (k *Keys) AdmitNew(ctx context.Context, agent, name string) error {
	k.admitting.Lock()
	defer k.admitting.Unlock()
	now := k.now()
	k.mu.Lock()
	s := k.agents[agent]
	total, totalAt := k.count.n, k.count.at
	k.mu.Unlock()
	if !s.fresh(now) {
		names, err := listNames(ctx, k.js, k.kv, k.prefix(agent))
		if err != nil {
			return err
		}
		s = &set{names: names, at: now}
		k.mu.Lock()
		if len(k.agents) >= maxRemembered/16 {
			clear(k.agents)
		}
		k.agents[agent] = s
		k.mu.Unlock()
	}
	if err := limits.Admit(k.limitAgent, int64(k.perAgent), int64(len(s.names)), agent, k.kind, name); err != nil {
		return err
	}
	if now.Sub(totalAt) >= CountFor {
		st, err := k.kv.Status(ctx)
		if err != nil {
			return fmt.Errorf("limits: %s status: %w", k.kv.Bucket(), err)
		}
		total = int64(st.Values())
		k.mu.Lock()
		k.count.n, k.count.at = total, now
		k.mu.Unlock()
	}
	if err := limits.Admit(k.limit, int64(k.total), total, agent, k.kind, name); err != nil {
		return err
	}
	k.mu.Lock()
	s.names[k.token(name)] = true
	k.count.n++
	k.mu.Unlock()
	return nil
}

// Tasks counts each agent's tasks and their bytes in FAILBUS_TASKS, per
// UTC day of storage, in FAILBUS_LIMITS key t.<agent>, so that the tasks
// the stream still keeps (DefaultMaxAgeTasks) are bounded per agent by
// limits.TasksPerAgent and limits.TaskBytesPerAgent. The recovery service
// reads FAILBUS_TASKS one message at a time, in order, across replicas:
// each agent's record also keeps the sequence of the last task counted, so
// a redelivered task is not counted twice. It is safe for concurrent use.
type Tasks struct {
	b      bucket
	cfg    limits.Config
	maxAge time.Duration
}

// NewTasks returns a Tasks on js's FAILBUS_LIMITS; maxAge is how long
// FAILBUS_TASKS keeps a task (days older no longer count).
func NewTasks(js jetstream.JetStream, cfg limits.Config, maxAge time.Duration) *Tasks {
	if maxAge <= 0 {
		maxAge = topology.DefaultMaxAgeTasks
	}
	return &Tasks{b: bucket{js: js}, cfg: cfg, maxAge: maxAge}
}

// taskDays is an agent's record: per UTC day (yyyymmdd), its tasks and
// bytes, and the stream sequence of the last task counted.
type taskDays struct {
	LastSeq uint64              `msgpack:"last_seq"`
	Days    map[string][2]int64 `msgpack:"days"`
}

// Admit counts the task at seq of size bytes, stored at stored, for agent,
// or returns a *limits.Exceeded (and counts nothing) when it would take
// the agent past a limit. A task at or before the last one counted is
// admitted again without counting.
func (t *Tasks) Admit(ctx context.Context, agent, id string, seq uint64, size int, stored time.Time) error {
	kv, err := t.b.get(ctx)
	if err != nil {
		return err
	}
	key := taskPrefix + kvkey.Escape(agent)
	for range 32 {
		var rec taskDays
		rev := uint64(0)
		e, err := kv.Get(ctx, key)
		switch {
		case err == nil:
			if err := unmarshalDays(e.Value(), &rec); err != nil {
				return fmt.Errorf("limits: read %s: %w", key, err)
			}
			rev = e.Revision()
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return fmt.Errorf("limits: read %s: %w", key, err)
		}
		if seq <= rec.LastSeq {
			return nil
		}
		var n, bytes int64
		oldest := stored.Add(-t.maxAge).UTC().Format("20060102")
		for day, v := range rec.Days {
			if day < oldest {
				delete(rec.Days, day)
				continue
			}
			n, bytes = n+v[0], bytes+v[1]
		}
		if err := limits.Admit(limits.TasksPerAgent, int64(t.cfg.TasksPerAgent), n, agent, "task", id); err != nil {
			return err
		}
		if bytes+int64(size) > t.cfg.TaskBytesPerAgent {
			return &limits.Exceeded{Limit: limits.TaskBytesPerAgent, Max: t.cfg.TaskBytesPerAgent, Held: bytes, Agent: agent, Kind: "task", Name: id}
		}
		if rec.Days == nil {
			rec.Days = map[string][2]int64{}
		}
		day := stored.UTC().Format("20060102")
		v := rec.Days[day]
		rec.Days[day] = [2]int64{v[0] + 1, v[1] + int64(size)}
		rec.LastSeq = seq
		data, err := marshalDays(&rec)
		if err != nil {
			return err
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key, data)
		} else {
			_, err = kv.Update(ctx, key, data, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || streamread.IsWrongLastSeq(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("limits: write %s: %w", key, err)
		}
		return nil
	}
	return fmt.Errorf("limits: %s: too many conflicting writes", key)
}

// Notifier asks for the one normal notification an agent's reaching a
// limit sends (dedupe key limits.NotifyKey: per agent, limit and UTC day),
// published once per key by this process and with the key as Nats-Msg-Id,
// so replicas and restarts within the stream's duplicate window store it
// once, and the notifier delivers it once. It is safe for concurrent use.
type Notifier struct {
	js      jetstream.JetStream
	service string
	now     func() time.Time

	mu   sync.Mutex
	day  string
	told map[string]bool
}

// NewNotifier returns a Notifier publishing on js for service (named in the
// notification's labels); now nil selects time.Now.
func NewNotifier(js jetstream.JetStream, service string, now func() time.Time) *Notifier {
	if now == nil {
		now = time.Now
	}
	return &Notifier{js: js, service: service, now: now, told: map[string]bool{}}
}

// Tell asks for e's notification unless this process already did today.
// A failed publish is returned, and asked again at the next refusal.
func (n *Notifier) Tell(ctx context.Context, e *limits.Exceeded) error {
	day := n.now().UTC().Format("2006-01-02")
	key := limits.NotifyKey(e.Limit, e.Agent, day)
	n.mu.Lock()
	if n.day != day {
		n.day, n.told = day, map[string]bool{}
	}
	if n.told[key] {
		n.mu.Unlock()
		return nil
	}
	n.told[key] = true
	n.mu.Unlock()
	msg := &events.Notification{
		DedupeKey: key, Severity: events.SeverityNormal, At: events.At(n.now()),
		Title: fmt.Sprintf("agent %s reached limits.%s (%d)", e.Agent, e.Limit, e.Max),
		Text: fmt.Sprintf("Agent %s holds %d of limits.%s (%d): its records naming a new %s are dead letters (failbus dlq ls) until old ones expire or the limit is raised in the policy; every other agent is decided as before. First refused: %s %q.",
			e.Agent, e.Held, e.Limit, e.Max, e.Kind, e.Kind, e.Name),
		Labels: map[string]string{"agent": e.Agent, "limit": e.Limit, "service": n.service},
	}
	if _, err := jspub.Publish(ctx, n.js, events.NotifySubject(events.SeverityNormal), msg, key, nil); err != nil {
		n.mu.Lock()
		delete(n.told, key)
		n.mu.Unlock()
		return fmt.Errorf("limits: notify %s: %w", key, err)
	}
	return nil
}
