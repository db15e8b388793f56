package recoverer_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/memstore"
	"github.com/failbus/failbus/pkg/events"
)

// holdingOf is which of agents hold on provider by store's latest
// decisions (recovery.Holding, as the core reads them).
func holdingOf(b *bundle, store interface {
	LatestDecisions(context.Context, []string) (map[string]events.Decision, error)
}, provider string, agents []string) (map[string]bool, error) {
	latest, err := store.LatestDecisions(b.ctx, agents)
	if err != nil {
		return nil, err
	}
	return recovery.Holding(latest, provider), nil
}

func usageAgents(us []recovery.User) []string {
	out := make([]string, len(us))
	for i, u := range us {
		out[i] = u.Agent
	}
	return out
}

// TestStoreUsageReadsTheStreams: the probe targets come from the outcomes
// and decisions stored anyway. RecentUsers gives each agent's latest
// outcome on the provider, most recent first, by the payload's names (two
// providers whose subjects share a token stay apart); Holding is true only
// for an agent whose latest decision is its own wait_provider on the
// provider.
func TestStoreUsageReadsTheStreams(t *testing.T) {
	b := setup(t)
	st := svcStore(b)
	n := 0
	outcome := func(provider, agent string) {
		n++
		o := &events.Outcome{ID: fmt.Sprintf("o-%d", n), Agent: agent, Provider: provider, Status: 503}
		b.publish(events.OutcomeSubject(provider, agent), o, o.ID)
	}
	decision := func(agent, action, provider string) {
		n++
		d := &events.Decision{OutcomeID: fmt.Sprintf("o-%d", n), Agent: agent, Action: action, Provider: provider}
		b.publish(events.DecisionSubject(agent), d, "")
	}
	outcome("openai", "a1")
	outcome("openai", "a2")
	outcome("anthropic", "a3")
	outcome("openai", "a3")
	outcome("openai", "a1") // a1 again: now the most recent
	outcome("open.ai", "x") // the same subject token as open_ai
	outcome("open_ai", "y")

	for _, tt := range []struct {
		provider string
		max      int
		want     []string
	}{
		{"openai", 16, []string{"a1", "a3", "a2"}},
		{"openai", 2, []string{"a1", "a3"}},
		{"anthropic", 16, []string{"a3"}},
		{"open_ai", 16, []string{"y"}},
		{"open.ai", 16, []string{"x"}},
		{"nobody", 16, []string{}},
	} {
		got, err := st.RecentUsers(b.ctx, tt.provider, tt.max)
		if err != nil || !slices.Equal(usageAgents(got), tt.want) {
			t.Errorf("RecentUsers(%s, %d) = %v, %v; want %v", tt.provider, tt.max, usageAgents(got), err, tt.want)
		}
		for i := 1; i < len(got); i++ {
			if got[i].At.After(got[i-1].At.Time) {
				t.Errorf("RecentUsers(%s): %v not most recent first", tt.provider, got)
			}
		}
	}

	decision("a1", events.ActionWaitProvider, "openai")
	decision("a2", events.ActionWaitProvider, "anthropic")
	decision("a3", events.ActionWaitProvider, "openai")
	decision("a3", events.ActionRetry, "openai") // no longer holding
	decision("a4", events.ActionWaitProvider, "openai")
	got, err := holdingOf(b, st, "openai", []string{"a1", "a2", "a3", "nobody"})
	if want := map[string]bool{"a1": true}; err != nil || len(got) != len(want) || !got["a1"] {
		t.Errorf("holding on openai = %v, %v; want %v (a4 was not asked)", got, err, want)
	}
	if got, err := holdingOf(b, st, "anthropic", []string{"a1", "a2"}); err != nil || len(got) != 1 || !got["a2"] {
		t.Errorf("holding on anthropic = %v, %v; want a2", got, err)
	}
	// a.5 and a_5 share a subject: the last decision on it is a.5's, and
	// says nothing of a_5.
	decision("a_5", events.ActionWaitProvider, "openai")
	decision("a.5", events.ActionRetry, "openai")
	decision("a.6", events.ActionWaitProvider, "openai")
	if got, err := holdingOf(b, st, "openai", []string{"a_5", "a.5", "a_6", "a.6"}); err != nil || len(got) != 1 || !got["a.6"] {
		t.Errorf("holding on openai, agents sharing subjects = %v, %v; want a.6 only", got, err)
	}
}

// TestStoreRecentUsersOfAManyAgentProvider: more agents than one
// last-per-subject answer carries (1024), their outcomes between five
// times as many of another provider's: the most recent are read back from
// the stream's tail, window by window (4096 stream messages each), as far
// as it takes.
func TestStoreRecentUsersOfAManyAgentProvider(t *testing.T) {
	b := setup(t)
	st := svcStore(b)
	const agents = 1100
	var acks []jetstream.PubAckFuture
	publish := func(o *events.Outcome) {
		data, h, err := events.Encode(o)
		if err != nil {
			t.Fatal(err)
		}
		f, err := b.bus.JS.PublishMsgAsync(&nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: h, Data: data})
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, f)
	}
	for i := range agents {
		publish(&events.Outcome{ID: fmt.Sprintf("o-%d", i), Agent: fmt.Sprintf("a%04d", i), Provider: "openai", Status: 503})
		for j := range 5 {
			publish(&events.Outcome{ID: fmt.Sprintf("x-%d-%d", i, j), Agent: fmt.Sprintf("b%d", j), Provider: "anthropic", Status: 200})
		}
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-b.bus.Ctx.Done():
			t.Fatal(b.bus.Ctx.Err())
		}
	}
	// The latest window (4096 messages) holds ~683 of the agents: 5 take
	// one window, 900 two.
	for _, want := range []int{5, 900} {
		got, err := st.RecentUsers(b.ctx, "openai", want)
		if err != nil {
			t.Fatal(err)
		}
		names := usageAgents(got)
		var latest []string
		for i := agents - want; i < agents; i++ {
			latest = append(latest, fmt.Sprintf("a%04d", i))
		}
		slices.Sort(names)
		if !slices.Equal(names, latest) {
			t.Errorf("RecentUsers(openai, %d) of %d agents: %d, from %v to %v; want the %d latest", want, agents, len(names), names[:min(len(names), 1)], names[max(len(names)-1, 0):], want)
		}
	}
}

// TestStoreUsageAgreesWithMemstore: the bus's store (reading the streams)
// and simulate's (memstore, noted as the engine feeds it) name the same
// probe targets for the same outcomes and decisions, in the same order:
// random agents on three providers, random decisions, read after each
// batch.
func TestStoreUsageAgreesWithMemstore(t *testing.T) {
	b := setup(t)
	st := svcStore(b)
	mem := memstore.New()
	rng := rand.New(rand.NewPCG(11, 12))
	providers := []string{"openai", "anthropic", "groq"}
	actions := []string{events.ActionWaitProvider, events.ActionRetry, events.ActionSwitchProvider, events.ActionGiveUp}
	at := time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)
	var agents []string
	for i := range 40 {
		agents = append(agents, fmt.Sprintf("agent-%02d", i))
	}
	n := 0
	for batch := range 6 {
		for range 60 {
			n++
			a, p := agents[rng.IntN(len(agents))], providers[rng.IntN(len(providers))]
			at = at.Add(time.Millisecond)
			if rng.IntN(3) == 0 {
				d := events.Decision{OutcomeID: fmt.Sprintf("d-%d", n), Agent: a, Action: actions[rng.IntN(len(actions))], Provider: p}
				b.publish(events.DecisionSubject(a), &d, "")
				if err := mem.NoteDecision(b.ctx, d); err != nil {
					t.Fatal(err)
				}
				continue
			}
			o := events.Outcome{ID: fmt.Sprintf("o-%d", n), Agent: a, Provider: p, Status: 503}
			b.publish(events.OutcomeSubject(p, a), &o, o.ID)
			if err := mem.NoteOutcome(b.ctx, p, a, at); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range providers {
			busUsers, err := st.RecentUsers(b.ctx, p, recovery.MaxUsers)
			if err != nil {
				t.Fatal(err)
			}
			memUsers, _ := mem.RecentUsers(b.ctx, p, recovery.MaxUsers)
			if got, want := usageAgents(busUsers), usageAgents(memUsers); !slices.Equal(got, want) {
				t.Errorf("batch %d, %s: the bus's users %v, memstore's %v", batch, p, got, want)
			}
			busHeld, err := holdingOf(b, st, p, agents)
			if err != nil {
				t.Fatal(err)
			}
			memHeld, _ := holdingOf(b, mem, p, agents)
			if !maps.Equal(busHeld, memHeld) {
				t.Errorf("batch %d, %s: the bus holds %v, memstore %v", batch, p, busHeld, memHeld)
			}
		}
	}
}
