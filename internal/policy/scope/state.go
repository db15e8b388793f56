package scope

import (
	"slices"
	"sort"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Entry is the latest result of one profile or model of a provider.
type Entry struct {
	// LastID is the outcome id of the latest result: seeing it again is a
	// redelivery, which changes nothing.
	LastID string `msgpack:"last_id,omitempty" json:"last_id,omitempty"`
	// LastSeen is the latest result's own time (its `at`); an outcome older
	// than it does not replace it.
	LastSeen    events.Time `msgpack:"last_seen,omitempty" json:"last_seen,omitzero"`
	LastAt      events.Time `msgpack:"last_at" json:"last_at"`
	LastOK      bool        `msgpack:"last_ok" json:"last_ok"`
	LastClass   string      `msgpack:"last_class" json:"last_class"`
	LastNetwork bool        `msgpack:"last_network,omitempty" json:"last_network,omitempty"`
	// FaultSince starts the current fault episode (auth/quota for a
	// profile, unsupported_param/model_not_found for a model); zero when
	// none. A success ends it.
	FaultSince events.Time `msgpack:"fault_since,omitempty" json:"fault_since,omitzero"`
	// FaultClass is the class that started the episode.
	FaultClass string `msgpack:"fault_class,omitempty" json:"fault_class,omitempty"`
	// CooldownUntil (profiles) is when the latest rate-limit hint expires.
	CooldownUntil events.Time `msgpack:"cooldown_until,omitempty" json:"cooldown_until,omitzero"`
	// ErrorAt and ErrorClass (profiles) are the own time and class of the
	// profile's latest failure on the provider's side (overloaded,
	// server_error, network): the degraded rule asks that every profile
	// had one within the window.
	ErrorAt    events.Time `msgpack:"error_at,omitempty" json:"error_at,omitzero"`
	ErrorClass string      `msgpack:"error_class,omitempty" json:"error_class,omitempty"`
	// Agents (profiles) are the agents that reported the profile, as
	// AgentKey hashes, the latest last, at most
	// Config.MaxAgentsPerProfile: switch_profile names the profile only to
	// them.
	Agents Keys `msgpack:"agents,omitempty" json:"agents,omitempty"`
}

// Mark is one outcome counted by a rule: its id, so that a redelivered or
// replayed classification is not counted twice, and its own time (`at`),
// where it counts whenever it was observed.
type Mark struct {
	ID string      `msgpack:"id" json:"id"`
	At events.Time `msgpack:"at" json:"at"`
}

// Call is one of the provider's latest calls, counted by the degraded
// rule: a hash of its outcome id (IDKey), so a redelivered outcome is not
// counted twice, its own time, and whether it failed on the provider's
// side (overloaded, server_error, network).
type Call struct {
	ID   uint64      `msgpack:"id" json:"id"`
	At   events.Time `msgpack:"at" json:"at"`
	Fail bool        `msgpack:"fail,omitempty" json:"fail,omitempty"`
}

// ProviderState is the fault-scope state of one provider. Its zero value
// (with Provider set) is a healthy provider nobody has called yet.
//
// Observe is idempotent per outcome, so the state can be shared by several
// scheduler replicas and survive redelivery: an outcome already applied
// (the latest result of its profile, or one counted among NetFailures or
// the recovery Streak) changes nothing, and one older than what the state
// already knows neither replaces a newer result nor resets a newer count.
type ProviderState struct {
	Provider string `msgpack:"provider" json:"provider"`
	// Clock is the latest own time (`at`) of the provider's outcomes: the
	// provider's clock, which never runs backwards (a late outcome is
	// observed at the clock). Other providers' outcomes do not move it.
	Clock events.Time `msgpack:"clock,omitempty" json:"clock,omitzero"`
	// Outage is true from outage detection until recovery.
	Outage       bool        `msgpack:"outage,omitempty" json:"outage,omitempty"`
	OutageSince  events.Time `msgpack:"outage_since,omitempty" json:"outage_since,omitzero"`
	OutageReason string      `msgpack:"outage_reason,omitempty" json:"outage_reason,omitempty"`
	// RecoveringSince is the first success of the current recovery streak
	// and RecoverySuccesses its length; zero when no streak runs. Streak
	// holds the outcome ids of the streak's successes (at most
	// RecoveryMinSuccesses of them, the latest).
	RecoveringSince   events.Time `msgpack:"recovering_since,omitempty" json:"recovering_since,omitzero"`
	RecoverySuccesses int         `msgpack:"recovery_successes,omitempty" json:"recovery_successes,omitempty"`
	Streak            []string    `msgpack:"streak,omitempty" json:"streak,omitempty"`
	// RateLimited is true while every profile is rate-limited.
	RateLimited bool `msgpack:"rate_limited,omitempty" json:"rate_limited,omitempty"`
	// Erroring is true while a large share of the provider's latest
	// calls fail on its side on every profile (Config.ErrorRatio), since
	// ErroringSince.
	Erroring      bool        `msgpack:"erroring,omitempty" json:"erroring,omitempty"`
	ErroringSince events.Time `msgpack:"erroring_since,omitempty" json:"erroring_since,omitzero"`
	// Calls are the provider's latest calls by own time, oldest first, at
	// most Config.ErrorSample of them: what the degraded rule's share and
	// the outage of nothing succeeding are taken over.
	Calls Calls `msgpack:"calls,omitempty" json:"calls,omitempty"`
	// LastSuccess is the own time of the provider's latest success, any
	// profile or model.
	LastSuccess events.Time `msgpack:"last_success,omitempty" json:"last_success,omitzero"`
	// NetFailures are the network failures since LastSuccess, each at its
	// own time, oldest first, at most OutageMinFailures of them (the
	// latest: all the rule needs).
	NetFailures []Mark            `msgpack:"net_failures,omitempty" json:"net_failures,omitempty"`
	Profiles    map[string]*Entry `msgpack:"profiles,omitempty" json:"profiles,omitempty"`
	Models      map[string]*Entry `msgpack:"models,omitempty" json:"models,omitempty"`
}

// HealthState is the provider's current health as CONTRACT.md names it:
// outage, degraded (recovering from an outage, rate-limited on every
// profile, or failing a large share of its calls) or healthy.
func (s *ProviderState) HealthState() string {
	switch {
	case s.Outage && s.RecoverySuccesses > 0:
		return events.HealthDegraded
	case s.Outage:
		return events.HealthOutage
	case s.RateLimited, s.Erroring:
		return events.HealthDegraded
	}
	return events.HealthHealthy
}

// isNetwork reports whether a classification is a network-layer
// failure: the classifier's scope, else the contract default of the class.
func isNetwork(c events.Classification) bool {
	sc := c.Scope
	if sc == "" {
		if info, ok := events.LookupClass(c.Class); ok {
			sc = info.Scope
		}
	}
	return sc == events.ScopeNetwork && c.Class != events.ClassOK
}

// isProviderSide reports whether a classification is a failure on the
// provider's side: the provider failing (overloaded, server_error: class
// scope provider) or the network path to it failing. A provider-level
// fault is the provider failing, not only its sockets.
func isProviderSide(c events.Classification) bool {
	sc := c.Scope
	if sc == "" {
		if info, ok := events.LookupClass(c.Class); ok {
			sc = info.Scope
		}
	}
	return (sc == events.ScopeNetwork || sc == events.ScopeProvider) && c.Class != events.ClassOK
}

// providerSideClass is isProviderSide for a stored entry's latest class.
func providerSideClass(class string) bool {
	info, ok := events.LookupClass(class)
	return ok && class != events.ClassOK && (info.Scope == events.ScopeNetwork || info.Scope == events.ScopeProvider)
}

// IDKey is the 64-bit FNV-1a hash of an outcome id or an agent name: what
// the state keeps of the many names it only needs to recognise (the
// degraded rule's calls, a profile's agents), 8 bytes each.
func IDKey(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// Observe folds one classified outcome into the state and returns the
// verdict for it (when it is a failure), the health changes and the
// notification requests. It mutates s.
//
// The state runs on the provider's own clock: an outcome happened at its
// own time (`at`; now when it has none, or when `at` lies after now or
// more than events.MaxAtBehind before it: not believed), and
// it is observed at the provider's Clock, the latest own time of the
// provider's outcomes, which it advances. now is the caller's clock (the
// virtual clock in simulate, the replica's on the bus) and only bounds an
// outcome's time from above: another provider's outcomes, which move the
// caller's clock, never make this provider's outcomes late. Network
// failures and the latest success count at their own times, so a failure
// observed after later ones (several agents, a backlog, a redelivery) is
// counted where it happened: old failures arriving late are not three
// failures within scope.window, and a late success clears only the
// failures before it.
//
// It is idempotent per outcome: observing an outcome that was already
// applied returns its verdict and changes nothing, so a KV-backed caller
// can write s back with compare-and-set, retry on conflict from a fresh
// read, and let several replicas and redeliveries observe the same
// classification.
func (s *ProviderState) Observe(cfg Config, c events.Classification, now time.Time) Observation {
	var obs Observation
	if s.Provider == "" {
		s.Provider = c.Provider
	}
	if s.Profiles == nil {
		s.Profiles = map[string]*Entry{}
	}
	if s.Models == nil {
		s.Models = map[string]*Entry{}
	}
	// t is the outcome's own time, which the counts and the replay guards
	// go by: an outcome older than what the state knows is history, not
	// news. An `at` after now, or more than events.MaxAtBehind before it,
	// is not believed (CONTRACT.md, events.EventTime): the outcome counts
	// at now. now becomes the provider's clock.
	now, _ = events.EventTime(c.At, now)
	t := now
	if now.Before(s.Clock.Time) {
		now = s.Clock.Time
	}
	s.Clock = events.At(now)
	if s.applied(c) {
		s.verdict(c, &obs.Verdict)
		return obs
	}
	obs.Evicted = s.forget(cfg, now, c.Profile, c.Model)

	ok := c.Class == events.ClassOK
	net := isNetwork(c)
	side := isProviderSide(c)
	at := events.At(now)

	// Profile and model entries: the latest result, unless this outcome is
	// older than the one they hold.
	pe := s.Profiles[c.Profile]
	if pe == nil {
		pe = &Entry{}
		s.Profiles[c.Profile] = pe
	}
	fresh := !t.Before(pe.LastSeen.Time)
	profileFaultStarted := false
	if fresh {
		pe.LastID, pe.LastSeen = c.OutcomeID, events.At(t)
		pe.LastAt, pe.LastOK, pe.LastClass, pe.LastNetwork = at, ok, c.Class, net
		switch {
		case ok:
			pe.FaultSince, pe.FaultClass, pe.CooldownUntil = events.Time{}, "", events.Time{}
		case c.Class == events.ClassAuth || c.Class == events.ClassQuotaExhausted:
			if pe.FaultSince.IsZero() || pe.FaultClass != c.Class {
				pe.FaultSince, pe.FaultClass = at, c.Class
				profileFaultStarted = true
			}
		case c.Class == events.ClassRateLimit && c.Hints != nil && c.Hints.AfterMS > 0:
			pe.CooldownUntil = events.At(now.Add(time.Duration(c.Hints.AfterMS) * time.Millisecond))
		}
	}
	if side && !t.Before(pe.ErrorAt.Time) {
		pe.ErrorAt, pe.ErrorClass = events.At(t), c.Class
	}
	pe.Agents = remember(pe.Agents, c.Agent, cfg.MaxAgentsPerProfile)
	var me *Entry
	modelFaultStarted := false
	if c.Model != "" {
		me = s.Models[c.Model]
		if me == nil {
			me = &Entry{}
			s.Models[c.Model] = me
		}
		if !t.Before(me.LastSeen.Time) {
			me.LastID, me.LastSeen = c.OutcomeID, events.At(t)
			me.LastAt, me.LastOK, me.LastClass, me.LastNetwork = at, ok, c.Class, net
			switch {
			case ok:
				me.FaultSince, me.FaultClass = events.Time{}, ""
			case ModelFault(c.Class):
				if me.FaultSince.IsZero() {
					me.FaultSince, me.FaultClass = at, c.Class
					modelFaultStarted = true
				}
			}
		}
	}

	// Provider-wide counters, by own time: a success clears the network
	// failures that came before it (not the ones after it that were
	// observed first), a network failure counts unless a later success is
	// already known. In time order t is now, and the failures are
	// appended.
	if ok && !t.Before(s.LastSuccess.Time) {
		s.LastSuccess = events.At(t)
		keep := 0
		for keep < len(s.NetFailures) && !s.NetFailures[keep].At.After(t) {
			keep++
		}
		if keep == len(s.NetFailures) {
			s.NetFailures = nil
		} else {
			s.NetFailures = slices.Clone(s.NetFailures[keep:])
		}
	}
	if net && !t.Before(s.LastSuccess.Time) {
		i := len(s.NetFailures)
		for i > 0 && s.NetFailures[i-1].At.After(t) {
			i--
		}
		s.NetFailures = slices.Insert(s.NetFailures, i, Mark{ID: c.OutcomeID, At: events.At(t)})
		// The latest n by own time: a redelivered failure older than all
		// of them is dropped again, never counted as new.
		if n := cfg.OutageMinFailures; n > 0 && len(s.NetFailures) > n {
			s.NetFailures = append([]Mark(nil), s.NetFailures[len(s.NetFailures)-n:]...)
		}
	}

	s.count(cfg, c, t, side)

	s.outageTransitions(cfg, c, now, t, ok, net, side, &obs)
	s.rateLimitEnd(cfg, c, now, ok && fresh, &obs)
	if fresh {
		s.rateLimitStart(cfg, c, now, &obs)
	}
	s.errorTransitions(cfg, now, &obs)

	if ok {
		return obs
	}
	v := &obs.Verdict
	s.verdict(c, v)
	if profileFaultStarted {
		obs.Notify = append(obs.Notify, s.profileFaultNotice(c, pe, working(s.Profiles, c.Profile, ""), now))
	}
	if modelFaultStarted {
		obs.Notify = append(obs.Notify, s.modelFaultNotice(c, me, v.SwitchModel, now))
		if n, ok := s.modelEscalation(c, now); ok {
			obs.Notify = append(obs.Notify, n)
		}
	}
	return obs
}

// applied reports whether c's outcome was applied already: it is the
// latest result of its profile, or counted among the network failures or
// the recovery streak.
func (s *ProviderState) applied(c events.Classification) bool {
	id := c.OutcomeID
	if id == "" {
		return false
	}
	if e := s.Profiles[c.Profile]; e != nil && e.LastID == id {
		return true
	}
	for _, m := range s.NetFailures {
		if m.ID == id {
			return true
		}
	}
	return slices.Contains(s.Streak, id)
}

// count adds the outcome to the provider's latest calls (Calls) at its
// own time t: once per outcome id, and only when it is among the latest
// Config.ErrorSample by own time, so a redelivery or an old outcome
// arriving late never counts twice nor pushes a newer one out.
func (s *ProviderState) count(cfg Config, c events.Classification, t time.Time, fail bool) {
	n := cfg.ErrorSample
	if n <= 0 {
		return
	}
	key := IDKey(c.OutcomeID)
	if c.OutcomeID != "" {
		for _, k := range s.Calls {
			if k.ID == key {
				return
			}
		}
	}
	if len(s.Calls) >= n && !t.After(s.Calls[0].At.Time) {
		return // older than every call kept
	}
	i := len(s.Calls)
	for i > 0 && s.Calls[i-1].At.After(t) {
		i--
	}
	s.Calls = slices.Insert(s.Calls, i, Call{ID: key, At: events.At(t), Fail: fail})
	if len(s.Calls) > n {
		s.Calls = slices.Delete(s.Calls, 0, len(s.Calls)-n)
	}
}

// remember puts agent's key last in keys, dropping the oldest beyond
// limit (0: no limit).
func remember(keys Keys, agent string, limit int) Keys {
	if agent == "" {
		return keys
	}
	k := IDKey(agent)
	if n := len(keys); n > 0 && keys[n-1] == k {
		return keys // the common case: the same agent again
	}
	if i := slices.Index(keys, k); i >= 0 {
		keys = slices.Delete(keys, i, i+1)
	}
	keys = append(keys, k)
	if limit > 0 && len(keys) > limit {
		keys = slices.Delete(keys, 0, len(keys)-limit)
	}
	return keys
}

// verdict fills v for failure c from the current state (nothing for a
// success).
func (s *ProviderState) verdict(c events.Classification, v *Verdict) {
	if c.Class == events.ClassOK {
		return
	}
	if s.Outage {
		v.Outage = true
		v.OutageSince = s.OutageSince.Time
		v.Reason = s.OutageReason
	}
	switch c.Class {
	case events.ClassRateLimit, events.ClassAuth, events.ClassQuotaExhausted:
		// Only a profile this agent reported: another agent's credential
		// is not one it can call with (CONTRACT.md).
		v.SwitchProfile = working(s.Profiles, c.Profile, c.Agent)
	}
	if ModelFault(c.Class) {
		v.SwitchModel = working(s.Models, c.Model, "")
	}
	if s.RateLimited {
		v.ProviderRateLimited = true
		for _, e := range s.Profiles {
			if e.CooldownUntil.After(v.CooldownUntil) {
				v.CooldownUntil = e.CooldownUntil.Time
			}
		}
	}
}

// forget drops profiles and models without a result for ForgetAfter, then
// makes room for profile and model (the names about to be observed) within
// MaxProfiles and MaxModels by dropping the least recently seen: agents
// name profiles and models, and 20,000 names must not make one provider's
// state (a KV value, an in-memory record) grow without bound. It returns
// how many entries the caps dropped.
func (s *ProviderState) forget(cfg Config, now time.Time, profile, model string) (evicted int) {
	if cfg.ForgetAfter > 0 {
		cutoff := now.Add(-cfg.ForgetAfter)
		for k, e := range s.Profiles {
			if e.LastAt.Before(cutoff) {
				delete(s.Profiles, k)
			}
		}
		for k, e := range s.Models {
			if e.LastAt.Before(cutoff) {
				delete(s.Models, k)
			}
		}
	}
	evicted += evictOldest(s.Profiles, profile, cfg.MaxProfiles)
	if model != "" {
		evicted += evictOldest(s.Models, model, cfg.MaxModels)
	}
	return evicted
}

// evictOldest drops the least recently seen entries of m until adding name
// keeps it within limit (0: no limit).
func evictOldest(m map[string]*Entry, name string, limit int) (evicted int) {
	if limit <= 0 {
		return 0
	}
	if _, ok := m[name]; ok {
		return 0
	}
	for len(m) >= limit {
		oldest, first := "", true
		for k, e := range m {
			if first || e.LastAt.Before(m[oldest].LastAt.Time) || e.LastAt.Equal(m[oldest].LastAt.Time) && k < oldest {
				oldest, first = k, false
			}
		}
		delete(m, oldest)
		evicted++
	}
	return evicted
}

// active returns the names of profiles with a result within the window,
// sorted.
func (s *ProviderState) active(cfg Config, now time.Time) []string {
	cutoff := now.Add(-cfg.Window)
	var out []string
	for k, e := range s.Profiles {
		if !e.LastAt.Before(cutoff) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// working picks another named entry whose latest result is a success,
// among those agent reported when agent is not empty: the most recent
// one, by name on a tie; "" when none.
func working(entries map[string]*Entry, except, agent string) string {
	best := ""
	var bestAt time.Time
	var key uint64
	if agent != "" {
		key = IDKey(agent)
	}
	for name, e := range entries {
		if name == except || name == "" || !e.LastOK {
			continue
		}
		if agent != "" && !slices.Contains(e.Agents, key) {
			continue
		}
		if best == "" || e.LastAt.After(bestAt) || e.LastAt.Equal(bestAt) && name < best {
			best, bestAt = name, e.LastAt.Time
		}
	}
	return best
}
