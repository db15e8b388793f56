package bench

// The fleet's outcomes: what a fleet of agents reports, built one at a
// time as the load is published (a 30 s hold at 20k/s is too many to build
// ahead), each a pure function of its index, so a load is the same on
// every run and no generator state is shared between goroutines.

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/pkg/events"
)

// fleetKind is what the bus does with an outcome: a success, a failure
// the default policy retries (its first, so a retry is scheduled), one it
// does not, or a content refusal (the refusal tiers decide it, not the
// scheduler).
type fleetKind uint8

const (
	kindOK fleetKind = iota
	kindRetry
	kindNoRetry
	kindRefusal
)

// Loads of the fleet. mix and storm are searched for the highest rate
// held; success, retry and noretry are the CPU-per-kind loads.
const (
	loadMix     = "mix"
	loadStorm   = "storm"
	loadSuccess = "success"
	loadRetry   = "retry"
	loadNoRetry = "noretry"
)

// fleetStormDelay is the storm's retry-after (fleetStormRetryAfter in
// seconds): within the default policy's
// max_delay (60 s), so every storm outcome gets a retry scheduled.
var fleetStormDelay = strconv.Itoa(int(fleetStormRetryAfter / time.Second))

// fleetSessions is how many sessions each agent's outcomes are spread
// over.
const fleetSessions = 8

// fleetTemplate is one outcome shape and what the bus does with it.
type fleetTemplate struct {
	o    events.Outcome
	kind fleetKind
}

// fleetGen builds the fleet's outcomes.
type fleetGen struct {
	agents    []string
	providers []string
	profiles  int
	ok        float64
	// fails are the mix's failures: the corpus's failure rows of the
	// fleet's providers, each keeping its provider (the classifier has
	// rules of its own for some).
	fails []fleetTemplate
	// success, storm and noRetry are shapes for any provider.
	success, storm, noRetry events.Outcome
}

// newFleetGen picks the fleet's providers (the corpus's providers with
// the most failure rows, up to providers; named fleet-pN past those) and
// checks that every shape classifies as its kind claims under the
// default policy for every provider.
func newFleetGen(corpus []events.Outcome, agents, providers, profiles int, ok float64) (*fleetGen, error) {
	g := &fleetGen{profiles: profiles, ok: ok}
	for i := range agents {
		g.agents = append(g.agents, "fleet-a"+strconv.Itoa(i+1))
	}
	pol := retry.Default()
	kindOf := func(o events.Outcome) fleetKind {
		c := classify.Classify(&o)
		switch {
		case c.Class == events.ClassOK:
			return kindOK
		case c.Class == events.ClassContentRefusal:
			return kindRefusal
		case pol.Resolve(o.Provider).IsRetryable(c.Class):
			return kindRetry
		}
		return kindNoRetry
	}
	byProvider := map[string][]fleetTemplate{}
	for _, o := range corpus {
		if k := kindOf(o); k != kindOK {
			byProvider[o.Provider] = append(byProvider[o.Provider], fleetTemplate{o: o, kind: k})
		}
	}
	names := slices.SortedFunc(maps.Keys(byProvider), func(a, b string) int {
		return cmp.Or(cmp.Compare(len(byProvider[b]), len(byProvider[a])), cmp.Compare(a, b))
	})
	for i := range providers {
		if i < len(names) {
			g.providers = append(g.providers, names[i])
			g.fails = append(g.fails, byProvider[names[i]]...)
		} else {
			g.providers = append(g.providers, "fleet-p"+strconv.Itoa(i+1))
		}
	}
	if len(g.fails) == 0 && ok < 1 {
		return nil, fmt.Errorf("the corpus has no failures for the mix")
	}
	g.success = events.Outcome{Model: "fleet-model", OK: true, Status: 200, Body: `{"choices":[{"message":{"content":"Done."}}]}`}
	g.storm = events.Outcome{Model: "fleet-model", Status: 429, Headers: map[string]string{"retry-after": fleetStormDelay},
		Body: `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`}
	g.noRetry = events.Outcome{Model: "fleet-model", Status: 400,
		Body: `{"error":{"message":"Unrecognized request argument supplied: temperatur","type":"invalid_request_error","param":null,"code":null}}`}
	for _, p := range g.providers {
		for _, s := range []struct {
			o    events.Outcome
			want fleetKind
			name string
		}{{g.success, kindOK, "success"}, {g.storm, kindRetry, "storm 429"}, {g.noRetry, kindNoRetry, "non-retryable 400"}} {
			o := s.o
			o.Provider = p
			if k := kindOf(o); k != s.want {
				return nil, fmt.Errorf("the fleet's %s classifies as kind %d, not %d, for provider %s", s.name, k, s.want, p)
			}
		}
	}
	return g, nil
}

// mix64 is splitmix64's finalizer: a well-spread hash of an index, the
// generator's only randomness.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// outcome is outcome i of load under tag (unique per run and step, so
// ids, sessions and budgets are fresh): every one the first outcome of
// its own step, agents in turn, a provider and profile drawn from i.
func (g *fleetGen) outcome(load, tag string, i int) (events.Outcome, fleetKind) {
	h := mix64(uint64(i))
	agent := g.agents[i%len(g.agents)]
	provider := g.providers[h%uint64(len(g.providers))]
	var o events.Outcome
	kind := kindOK
	switch load {
	case loadStorm, loadRetry:
		o, kind = g.storm, kindRetry
		o.Provider = provider
	case loadNoRetry:
		o, kind = g.noRetry, kindNoRetry
		o.Provider = provider
	case loadSuccess:
		o = g.success
		o.Provider = provider
	default: // mix
		if float64(h>>11)/(1<<53) < g.ok {
			o = g.success
			o.Provider = provider
		} else {
			t := g.fails[(h>>16)%uint64(len(g.fails))]
			o, kind = t.o, t.kind
		}
	}
	o.ID = tag + "-" + strconv.Itoa(i)
	o.Agent = agent
	o.Session = agent + "-" + tag + "-" + strconv.Itoa((i/len(g.agents))%fleetSessions)
	o.Profile = "key-" + strconv.Itoa(int((h>>40)%uint64(g.profiles))+1)

	o.Turn, o.Step = i+1, 1
	return o, kind
}

// msg encodes outcome i as pkg/agent's Report sends it.
func (g *fleetGen) msg(load, tag string, i int, at events.Time) (*nats.Msg, string, fleetKind, error) {
	o, kind := g.outcome(load, tag, i)
	o.At = at
	data, hdr, err := events.Encode(&o)
	if err != nil {
		return nil, "", kind, fmt.Errorf("encode fleet outcome %s: %w", o.ID, err)
	}
	hdr.Set(events.HeaderMsgID, o.ID)
	return &nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: hdr, Data: data}, o.ID, kind, nil
}
