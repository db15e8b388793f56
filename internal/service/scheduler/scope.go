package scheduler

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy/scope"
)

// scopeBook is the fault scope of every provider in memory: exactly what
// scope.Tracker does for `failbus simulate` (ProviderState.Observe, then
// scope.Config.FailoverFor for an outage), with the config passed per call
// so a policy reload keeps the state, and a memory of the observations of
// recent outcomes so a redelivered classification is not observed twice.
type scopeBook struct {
	mu      sync.Mutex
	skew    time.Duration
	seenTTL time.Duration

	clock  time.Time
	states map[string]*scope.ProviderState
	// lru orders the providers by their latest observation (front: most
	// recent), so that past max providers the least recently seen one not
	// in an outage is forgotten: agents name providers.
	lru     *list.List
	lruElem map[string]*list.Element
	max     int
	// evicted is called with what each observation forgot: providers,
	// and profiles and models within a provider.
	evicted func(providers, entries int)

	seen      map[string]seenObs // by outcome id
	newest    time.Time          // latest stored time in seen
	sincePrun int
}

type seenObs struct {
	obs    scope.Observation
	stored time.Time
}

// seenPruneEvery is how many observations pass between prunes of seen.
const seenPruneEvery = 4096

func newScopeBook(skew, seenTTL time.Duration, maxProviders int, evicted func(providers, entries int)) *scopeBook {
	if evicted == nil {
		evicted = func(int, int) {}
	}
	return &scopeBook{skew: skew, seenTTL: seenTTL, states: map[string]*scope.ProviderState{}, seen: map[string]seenObs{},
		lru: list.New(), lruElem: map[string]*list.Element{}, max: maxProviders, evicted: evicted}
}

// touch marks provider as just observed and forgets the least recently
// observed providers not in an outage while more than max are held. It
// returns how many it forgot.
func (b *scopeBook) touch(provider string) (forgot int) {
	if e, ok := b.lruElem[provider]; ok {
		b.lru.MoveToFront(e)
	} else {
		b.lruElem[provider] = b.lru.PushFront(provider)
	}
	for e := b.lru.Back(); e != nil && b.max > 0 && len(b.states) > b.max; {
		prev := e.Prev()
		p := e.Value.(string)
		if st := b.states[p]; p != provider && (st == nil || !st.Outage) {
			delete(b.states, p)
			delete(b.lruElem, p)
			b.lru.Remove(e)
			forgot++
		}
		e = prev
	}
	return forgot
}

// timeOf is the scope time of a classification: its `at` (the outcome's),
// or when the stream stored it when `at` is missing or lies more than skew
// ahead of that.
func (b *scopeBook) timeOf(c events.Classification, stored time.Time) time.Time {
	t := c.At.Time
	if t.IsZero() {
		t = stored
	}
	if !stored.IsZero() && t.After(stored.Add(b.skew)) {
		t = stored.Add(b.skew)
	}
	return t
}

// observe folds c into its provider's state, or returns the observation
// made when its outcome was first seen.
func (b *scopeBook) observe(cfg scope.Config, c events.Classification, stored time.Time) scope.Observation {
	b.mu.Lock()
	defer b.mu.Unlock()
	if o, ok := b.seen[c.OutcomeID]; ok {
		return o.obs
	}
	return b.observeLocked(cfg, c, stored)
}

func (b *scopeBook) observeLocked(cfg scope.Config, c events.Classification, stored time.Time) scope.Observation {
	now := b.timeOf(c, stored)
	if now.Before(b.clock) {
		now = b.clock // the clock never runs backwards (as in simulate)
	}
	b.clock = now
	st := b.states[c.Provider]
	if st == nil {
		st = &scope.ProviderState{Provider: c.Provider}
		b.states[c.Provider] = st
	}
	forgot := b.touch(c.Provider)
	obs := st.Observe(cfg, c, now)
	if forgot > 0 || obs.Evicted > 0 {
		b.evicted(forgot, obs.Evicted)
	}
	if obs.Verdict.Outage {
		obs.Verdict.FailoverProvider = cfg.FailoverFor(c.Provider, b.downLocked)
	}
	b.remember(c.OutcomeID, obs, stored)
	return obs
}

func (b *scopeBook) remember(id string, obs scope.Observation, stored time.Time) {
	b.seen[id] = seenObs{obs: obs, stored: stored}
	if stored.After(b.newest) {
		b.newest = stored
	}
	if b.sincePrun++; b.sincePrun < seenPruneEvery {
		return
	}
	b.sincePrun = 0
	cutoff := b.newest.Add(-b.seenTTL)
	for k, v := range b.seen {
		if v.stored.Before(cutoff) {
			delete(b.seen, k)
		}
	}
}

// down reports whether provider is in an outage (recovering included).
func (b *scopeBook) down(provider string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.downLocked(provider)
}

func (b *scopeBook) downLocked(provider string) bool {
	st := b.states[provider]
	return st != nil && st.Outage
}

// seedOutage starts a provider in the outage a health record reported.
func (b *scopeBook) seedOutage(h events.Health) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.states[h.Provider] = &scope.ProviderState{Provider: h.Provider, Outage: true, OutageSince: h.At, OutageReason: h.Reason}
	b.touch(h.Provider)
}

// rebuildScope restores the fault scope after a start: outages still open
// according to FAILBUS_HEALTH, then every classification stored within the
// last scope.window, in stream order, through the same Observe. For a
// provider whose outage was seeded, classifications up to the outage's
// start are already summed up by it and skipped. It returns how many
// classifications were replayed.
func (s *Scheduler) rebuildScope(ctx context.Context) (int, error) {
	open, err := s.openOutages(ctx)
	if err != nil {
		return 0, err
	}
	for _, h := range open {
		s.scope.seedOutage(h)
		s.m.outage.WithLabelValues(s.m.providers.Use(h.Provider)).Set(1)
		s.log.Info().Str("provider", h.Provider).Time("since", h.At.Time).Msg("outage still open: provider held")
	}
	cfg := s.Policy().Scope
	start := s.now().Add(-cfg.Window)
	n := 0
	err = readStream(ctx, s.js, topology.StreamClassified, events.ClassifiedPrefix+".>", &start, false, func(m jetstream.Msg) error {
		c, err := events.DecodeAs[*events.Classification](m.Subject(), m.Headers(), m.Data())
		if err != nil || c.Agent == "" || c.Provider == "" {
			return nil // the live consumer dead-letters it
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if h, ok := open[c.Provider]; ok && !s.scope.timeOf(*c, md.Timestamp).After(h.At.Time) {
			return nil
		}
		s.scope.mu.Lock()
		if _, dup := s.scope.seen[c.OutcomeID]; !dup {
			s.scope.observeLocked(cfg, *c, md.Timestamp)
			n++
		}
		s.scope.mu.Unlock()
		return nil
	})
	s.m.replayed.Add(float64(n))
	if err != nil {
		return n, fmt.Errorf("scheduler: rebuild fault scope: %w", err)
	}
	s.scope.mu.Lock()
	for p, st := range s.scope.states {
		s.m.outage.WithLabelValues(s.m.providers.Use(p)).Set(boolGauge(st.Outage))
	}
	s.scope.mu.Unlock()
	return n, nil
}

// openOutages folds FAILBUS_HEALTH per provider and returns, for each
// provider still in an outage, the record that started it.
func (s *Scheduler) openOutages(ctx context.Context) (map[string]events.Health, error) {
	open := map[string]events.Health{}
	err := readStream(ctx, s.js, topology.StreamHealth, events.HealthPrefix+".>", nil, false, func(m jetstream.Msg) error {
		h, err := events.DecodeAs[*events.Health](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return nil
		}
		switch h.State {
		case events.HealthOutage:
			if _, ok := open[h.Provider]; !ok {
				open[h.Provider] = *h
			}
		case events.HealthRecovered, events.HealthHealthy:
			delete(open, h.Provider)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scheduler: read provider health: %w", err)
	}
	return open, nil
}

// readStream calls fn for every message of stream on filter (from start
// when set) that was stored when the read began, in order, with an
// ephemeral ordered consumer.
func readStream(ctx context.Context, js jetstream.JetStream, stream, filter string, start *time.Time, headersOnly bool, fn func(jetstream.Msg) error) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, HeadersOnly: headersOnly}
	if start != nil {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, start
	}
	c, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = js.DeleteConsumer(dctx, stream, info.Name)
		}
	}()
	pending := c.CachedInfo().NumPending
	var seen uint64
	for seen < pending {
		batch, err := c.Fetch(int(min(pending-seen, 512)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if err := fn(m); err != nil {
				return err
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
