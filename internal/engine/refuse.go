package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/pkg/events"
)

// Refused is what the refusal stage decided for one content refusal.
type Refused struct {
	// Decision is rerender or skip_provider, worded by refusal.Notice.
	Decision events.Decision
	// Notification is set at the first refusal (normal) and when the
	// provider freezes (critical) only.
	Notification *events.Notification
	// Event is the refusal-state change.
	Event refusal.Event
	// Replayed: the refusal was applied before (a redelivery); Decision
	// and Notification repeat what it produced then, nothing changed.
	Replayed bool
}

// Refuse is the refusal stage: it applies one content_refusal
// classification at now to the (segment, provider) record in Refusals and
// returns the decision for the agent and the notification to request. A
// refusal already applied to the record (its outcome id is remembered) is
// answered exactly as the first time and counted once.
func (e *Engine) Refuse(ctx context.Context, c events.Classification, now time.Time) (Refused, error) {
	if c.Class != events.ClassContentRefusal {
		return Refused{}, nil
	}
	if e.stores.Refusals == nil {
		return Refused{}, fmt.Errorf("engine: refuse %s: no refusal store", c.OutcomeID)
	}
	cfg := e.Policy().Refusal
	segment := events.SegmentKey(c.Session, c.Segment)
	increment := refusal.Increment(c.Turn, c.Step)
	var (
		ev     refusal.Event
		peers  []string
		replay bool
	)
	err := e.stores.Refusals.Update(ctx, segment, c.Provider, now, func(rec *refusal.Record, found bool) (bool, error) {
		if a, ok := rec.AppliedRefusal(c.OutcomeID); ok && found {
			ev, peers, replay = a.Event, a.Peers, true
			return false, nil
		}
		replay = false
		next := *rec
		if !found {
			next = refusal.Record{State: refusal.State{Segment: segment, Provider: c.Provider}}
		}
		if next.State.Segment == "" || next.State.Provider == "" {
			next.State.Segment, next.State.Provider = segment, c.Provider
		}
		next, ev = next.Refused(c.Agent, c.RefusalScope, increment, now, cfg)
		peers = nil
		if ev.Notify {
			states, err := e.stores.Refusals.SegmentStates(ctx, segment, now)
			if err != nil {
				return false, err
			}
			peers = refusal.Peers(cfg, ev, append(states, next.State))
		}
		*rec = next.Remember(c.OutcomeID, ev, peers)
		return true, nil
	})
	if err != nil {
		return Refused{}, fmt.Errorf("engine: refuse %s: %w", c.OutcomeID, err)
	}
	t := refusal.Notice(cfg, ev, peers)
	out := Refused{Decision: refusal.Decision(c, ev, t, now), Event: ev, Replayed: replay}
	if ev.Notify {
		n := t.Notification(ev, now)
		out.Notification = &n
	}
	return out, nil
}

// Boundary is the segment-boundary stage: bd names a new
// context segment, so the refused bytes left the request and every earlier
// segment of bd.Session loses its refusal state, whichever agent reported
// it. Later segments and other sessions are kept: a boundary delivered late
// cannot wipe newer state, and a new session id does not say which old one
// it replaced (the state's time-to-live retires those). It returns the
// retired keys.
func (e *Engine) Boundary(ctx context.Context, bd events.Boundary, now time.Time) ([]string, error) {
	if e.stores.Refusals == nil {
		return nil, fmt.Errorf("engine: boundary: no refusal store")
	}
	retired, err := e.stores.Refusals.RetireBefore(ctx, bd.Session, bd.Segment, now)
	if err != nil {
		return retired, fmt.Errorf("engine: boundary %s#%d: %w", bd.Session, bd.Segment, err)
	}
	return retired, nil
}

// RouteOptions change how Route answers.
type RouteOptions struct {
	// Peek answers without claiming a due re-probe: for operators and
	// dashboards, never for an agent about to send.
	Peek bool
	// Lease is how long a claimed re-probe keeps other agents off.
	// Defaults to refusal.DefaultProbeLease.
	Lease time.Duration
}

// Routed is Route's answer with what it decided per provider.
type Routed struct {
	events.RouteRecord
	// Verdicts is the re-probe verdict of each provider not in an outage,
	// for metrics.
	Verdicts map[string]refusal.ProbeVerdict
}

// Route answers which of r.Providers, in order, may receive the segment
// `<r.Session>#<r.Segment>` at now (CONTRACT.md `route`). A provider in an
// outage is skipped first, without claiming a re-probe: nothing reaches it
// now. Each other provider's refusal record decides (refusal.Record.Probe):
// never refused, or re-rendering, is allowed; waiting for its next probe or
// frozen is skipped with its reason; a due re-probe is claimed for r.Agent
// with compare-and-set, so of agents racing for one re-probe exactly one
// is allowed. Route never moves a refusal clock.
func (e *Engine) Route(ctx context.Context, r events.RouteRequest, now time.Time, opts RouteOptions) (Routed, error) {
	if e.stores.Refusals == nil {
		return Routed{}, fmt.Errorf("engine: route: no refusal store")
	}
	cfg := e.Policy().Refusal
	segment := events.SegmentKey(r.Session, r.Segment)
	res := events.RouteResult{Allowed: []string{}, Skipped: []events.RouteSkip{}}
	verdicts := map[string]refusal.ProbeVerdict{}
	var down []events.RouteSkip
	for _, p := range r.Providers {
		out, reason, err := e.Down(ctx, p)
		if err != nil {
			return Routed{}, fmt.Errorf("engine: route %s: health of %s: %w", segment, p, err)
		}
		if out {
			down = append(down, refusal.OutageSkip(p, reason))
			continue
		}
		var (
			verdict refusal.ProbeVerdict
			skip    events.RouteSkip
		)
		err = e.stores.Refusals.Update(ctx, segment, p, now, func(rec *refusal.Record, found bool) (bool, error) {
			if !found {
				verdict = refusal.ProbeFree
				return false, nil
			}
			cur := *rec
			if cur.State.Provider == "" {
				cur.State.Provider = p
			}
			if cur.State.Segment == "" {
				cur.State.Segment = segment
			}
			next, v := cur.Probe(now, cfg, r.Agent, opts.Lease)
			if v == refusal.ProbeClaimed && opts.Peek {
				v = refusal.ProbeFree
			}
			verdict = v
			switch v {
			case refusal.ProbeClaimed:
				*rec = next
				return true, nil
			case refusal.ProbeFree:
				return false, nil
			}
			skip = cur.Skip(now, cfg, p)
			return false, nil
		})
		if err != nil {
			return Routed{}, fmt.Errorf("engine: route %s for %s: %w", segment, p, err)
		}
		verdicts[p] = verdict
		switch verdict {
		case refusal.ProbeFree, refusal.ProbeClaimed:
			res.Allowed = append(res.Allowed, p)
		default:
			res.Skipped = append(res.Skipped, skip)
		}
	}
	res.Skipped = append(res.Skipped, down...)
	return Routed{
		RouteRecord: events.RouteRecord{At: events.At(now), Agent: r.Agent, Session: r.Session, Segment: r.Segment, RouteResult: res},
		Verdicts:    verdicts,
	}, nil
}
