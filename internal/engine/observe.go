package engine

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/pkg/events"
)

// Observed is what the fault-scope stage says about one classification.
type Observed struct {
	// Observation is the verdict (for a failure), the health changes and
	// the notification requests the classification caused.
	scope.Observation
	// Publish is every record to publish now, with its message id: the
	// Observation's health records and notification requests, preceded by
	// any an earlier writer stored and may not have published (it died
	// between its write and its publish). Publish them in order, then call
	// Settle with Seq.
	Publish []Effect
	// Seq is the provider record's change number after this observation;
	// 0 when nothing needs settling.
	Seq uint64
	// Now is the time the retry stage decides at: the caller's now, or
	// the provider's clock when that is later. The fault scope itself runs
	// on the provider's clock (scope.ProviderState.Observe), which other
	// providers' outcomes do not move; a decision is never made before
	// the caller's clock, so a late outcome's retry is not due in its past.
	Now time.Time
	// Down reports that the provider is in an outage (recovering
	// included) after this observation.
	Down bool
}

// SessionLane is the order the services keep: a session's outcomes of a
// provider are classified, observed and decided one at a time, in the
// order simulate reads them; other sessions go in parallel. The
// classifier and the scheduler both key their runners by it.
func SessionLane(agent, session, provider string) string {
	return agent + "\x00" + session + "\x00" + provider
}

// EffectID is the Nats-Msg-Id of the i-th record of change seq of
// provider's fault scope: deterministic, so the publish after a crash
// repeats the ids of the publish that may have happened before it.
func EffectID(provider string, seq uint64, i int) string {
	return "scope:" + provider + ":" + strconv.FormatUint(seq, 10) + ":" + strconv.Itoa(i)
}

// Observe is the fault-scope stage: it folds one classification
// at now into its provider's state in Providers and returns the verdict,
// the health changes and the notification requests. For an outage it picks
// a failover provider from scope.failover that is not itself down. It is
// idempotent per outcome (scope.ProviderState.Observe), so a redelivered
// classification, or the same one seen by two scheduler replicas, changes
// nothing twice.
func (e *Engine) Observe(ctx context.Context, c events.Classification, now time.Time) (Observed, error) {
	out, err := e.ObserveBatch(ctx, c.Provider, []events.Classification{c}, []time.Time{now})
	if err != nil {
		return Observed{}, err
	}
	return out[0], nil
}

// ObserveBatch folds classifications of one provider, in order, each at
// its time in nows, with a single write of the provider's record: the lane
// a pipelined runner keeps per provider. The records to publish of the
// whole batch are on the last Observed; each Observed carries its own
// Observation.
func (e *Engine) ObserveBatch(ctx context.Context, provider string, cs []events.Classification, nows []time.Time) ([]Observed, error) {
	if e.stores.Providers == nil {
		return nil, fmt.Errorf("engine: observe %s: no provider store", provider)
	}
	if len(cs) != len(nows) {
		return nil, fmt.Errorf("engine: observe %s: %d classifications, %d times", provider, len(cs), len(nows))
	}
	out := make([]Observed, len(cs))
	err := e.stores.Providers.Update(ctx, provider, func(rec *ProviderRecord) (bool, error) {
		for i, c := range cs {
			out[i] = e.Fold(rec, provider, c, nows[i])
			if out[i].Verdict.Outage {
				alt, err := e.Failover(ctx, provider)
				if err != nil {
					return false, err
				}
				out[i].Verdict.FailoverProvider = alt
			}
		}
		if len(rec.Outbox) > 0 {
			last := &out[len(out)-1]
			last.Publish, last.Seq = slices.Clone(rec.Outbox), rec.Seq
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("engine: observe %s: %w", provider, err)
	}
	return out, nil
}

// Fold folds one classification of provider at now into rec, the
// provider's record held in memory by a writer that stores it later (the
// scheduler's lanes; ObserveBatch folds with it inside one write). The
// records it produces are appended to rec's outbox under a new change
// Seq, after any still there, so an outbox stored holds every record not
// yet known to be published; the returned Observed's Publish and Seq are
// empty (the writer publishes the outbox of what it stored, and clears
// it once published). Verdict.FailoverProvider is left empty: Failover
// reads other providers.
func (e *Engine) Fold(rec *ProviderRecord, provider string, c events.Classification, now time.Time) Observed {
	obs := rec.State.Observe(e.Policy().Scope, c, now)
	if now.Before(rec.State.Clock.Time) {
		now = rec.State.Clock.Time
	}
	if n := len(obs.Health) + len(obs.Notify); n > 0 {
		rec.Seq++
		fresh := make([]Effect, 0, n)
		for j := range obs.Health {
			fresh = append(fresh, Effect{Health: &obs.Health[j]})
		}
		for j := range obs.Notify {
			fresh = append(fresh, Effect{Notification: &obs.Notify[j]})
		}
		for i := range fresh {
			fresh[i].MsgID = EffectID(provider, rec.Seq, i)
		}
		rec.Outbox = append(rec.Outbox, fresh...)
	}
	return Observed{Observation: obs, Now: now, Down: rec.State.Outage}
}

// Failover is the provider to switch to during provider's outage under
// the current policy ("" for none): what ObserveBatch puts in an outage's
// Verdict.FailoverProvider.
func (e *Engine) Failover(ctx context.Context, provider string) (string, error) {
	alt, err := e.failover(ctx, e.Policy().Scope, provider)
	if err != nil {
		return "", fmt.Errorf("engine: failover for %s: %w", provider, err)
	}
	return alt, nil
}

// failover picks the provider to switch to during provider's outage: the
// first configured alternative whose state is not an outage.
func (e *Engine) failover(ctx context.Context, cfg scope.Config, provider string) (string, error) {
	var ferr error
	alt := cfg.FailoverFor(provider, func(p string) bool {
		down, _, err := e.Down(ctx, p)
		if err != nil && ferr == nil {
			ferr = err
		}
		return down
	})
	return alt, ferr
}

// Down reports whether provider is in an outage (recovering included) and
// why, from its fault-scope state.
func (e *Engine) Down(ctx context.Context, provider string) (bool, string, error) {
	if e.stores.Providers == nil {
		return false, "", nil
	}
	rec, err := e.stores.Providers.Get(ctx, provider)
	if err != nil || rec == nil {
		return false, "", err
	}
	return rec.State.Outage, rec.State.OutageReason, nil
}

// Settle records that the records of change seq of provider were
// published, clearing them from the provider's outbox; it writes nothing
// when another change came since (that writer published them again).
func (e *Engine) Settle(ctx context.Context, provider string, seq uint64) error {
	if seq == 0 || e.stores.Providers == nil {
		return nil
	}
	err := e.stores.Providers.Update(ctx, provider, func(rec *ProviderRecord) (bool, error) {
		if rec.Seq != seq || len(rec.Outbox) == 0 {
			return false, nil
		}
		rec.Outbox = nil
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("engine: settle %s: %w", provider, err)
	}
	return nil
}
