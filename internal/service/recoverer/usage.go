package recoverer

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/policy/recovery"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// The probe targets (recovery.Usage) are read back, when a probe is due,
// from what the bus stores anyway: each agent's latest outcome on the
// provider in FAILBUS_OUTCOMES (failbus.outcome.<provider>.<agent>) and
// each candidate's latest decision in FAILBUS_DECISIONS
// (failbus.decision.<agent>), with JetStream's last-per-subject batch
// read. Following every decision with a consumer of its own cost the bus
// a delivery and an acknowledgement per outcome, for a list read once per
// probe interval of an outage.

// usageTail and usageTailWindows: when a provider's agents are more than
// one last-per-subject answer carries (1024), RecentUsers reads the stream
// back from the provider's last outcome in windows of 4096 stream
// messages, at most 8, until it has the agents it wants.
const (
	usageTail        = 4096
	usageTailWindows = 8
)

// NoteOutcome implements recovery.Usage: the outcome is in FAILBUS_OUTCOMES.
func (s *Store) NoteOutcome(context.Context, string, string, time.Time) error { return nil }

// NoteDecision implements recovery.Usage: the decision is in
// FAILBUS_DECISIONS.
func (s *Store) NoteDecision(context.Context, events.Decision) error { return nil }

// RecentUsers implements recovery.Usage from FAILBUS_OUTCOMES: the last
// outcome of every agent on provider, at the time the bus stored it.
// Subjects carry names as tokens (events.Token), so each outcome is decoded
// for its real provider and agent; one that does not decode is skipped.
func (s *Store) RecentUsers(ctx context.Context, provider string, max int) ([]recovery.User, error) {
	filter := events.OutcomePrefix + "." + events.Token(provider) + ".*"
	latest := map[string]time.Time{}
	read := func(m *nats.Msg) error {
		o, err := events.DecodeAs[*events.Outcome](topology.ServerHeader(m, jetstream.SubjectHeader), m.Header, m.Data)
		if err != nil || o.Provider != provider || o.Agent == "" {
			return nil
		}
		at, err := time.Parse(time.RFC3339Nano, topology.ServerHeader(m, jetstream.TimeStampHeaer))
		if err != nil {
			return nil // not what the server stamps: skip it, read the rest
		}
		if t, ok := latest[o.Agent]; !ok || at.After(t) {
			latest[o.Agent] = at
		}
		return nil
	}
	err := topology.LastPerSubject(ctx, s.js, topology.StreamOutcomes, []string{filter}, 0, read)
	if errors.Is(err, topology.ErrBatchUnavailable) {
		// More agents (or bytes) than one answer carries: those of the
		// provider's latest outcomes, read back from the stream's tail.
		clear(latest)
		var end uint64
		if end, err = topology.LastSeq(ctx, s.js, topology.StreamOutcomes, filter); err != nil {
			return nil, err
		}
		for range usageTailWindows {
			if end == 0 || len(latest) >= max {
				break
			}
			from := uint64(1)
			if end > usageTail {
				from = end - usageTail + 1
			}
			if err = topology.ReadFrom(ctx, s.js, topology.StreamOutcomes, filter, from, end, usageTail, read); err != nil {
				if len(latest) > 0 && ctx.Err() != nil {
					// Out of time further back: the newer windows' agents
					// are the ones a probe wants.
					err = nil
					break
				}
				return nil, err
			}
			end = from - 1
		}
	}
	if err != nil {
		return nil, err
	}
	return recovery.LatestUsers(latest, max), nil
}

// LatestDecisions implements recovery.Usage from FAILBUS_DECISIONS: the
// last decision on each agent's subject, when it is the agent's own (two
// names that give the same subject token share one subject).
func (s *Store) LatestDecisions(ctx context.Context, agents []string) (map[string]events.Decision, error) {
	out := map[string]events.Decision{}
	if len(agents) == 0 {
		return out, nil
	}
	want := make(map[string]bool, len(agents))
	filters := make([]string, 0, len(agents))
	for _, a := range agents {
		want[a] = true
		if f := events.DecisionSubject(a); !slices.Contains(filters, f) {
			filters = append(filters, f)
		}
	}
	err := topology.LastPerSubject(ctx, s.js, topology.StreamDecisions, filters, 0, func(m *nats.Msg) error {
		d, err := events.DecodeAs[*events.Decision](topology.ServerHeader(m, jetstream.SubjectHeader), m.Header, m.Data)
		if err == nil && want[d.Agent] {
			out[d.Agent] = *d
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
