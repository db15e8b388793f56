package refusals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy/refusal"
)

// RouteRequest is the JSON body of a route request on
// events.RefusalRouteSubject: events.RouteRequest (agent, session, segment,
// providers; `at` is ignored, the service's clock decides) and Peek.
type RouteRequest struct {
	events.RouteRequest
	// Peek answers without claiming a due re-probe: for operators and
	// dashboards (`nats req failbus.refusal.route '{..., "peek": true}'`),
	// never for an agent that is about to send.
	Peek bool `json:"peek,omitempty"`
}

func routeSubject() string { return events.RefusalRouteSubject }

// startMicro registers the micro service and its route endpoint on the
// JetStream connection. Requests are answered one at a time per instance, in
// the endpoint subscription's goroutine, so stopping the service (which
// drains the subscription) answers every request already received;
// replicas share the load through the micro queue group.
func (s *Server) startMicro(ctx context.Context) (micro.Service, error) {
	nc := s.js.Conn()
	base := context.WithoutCancel(ctx) // in-flight requests finish on shutdown
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     ServiceVersion,
		Description: "failbus refusal tiers: which providers may receive a context segment now (seed 000)",
		Metadata: map[string]string{
			"rule":        refusal.Rule(s.cfg),
			"probe_lease": s.lease.String(),
		},
		ErrorHandler: func(_ micro.Service, e *micro.NATSError) {
			s.log.Error().Str("subject", e.Subject).Str("error", e.Description).Msg("route service error")
		},
	})
	if err != nil {
		return nil, fmt.Errorf("refusals: add micro service %s: %w", ServiceName, err)
	}
	handler := micro.HandlerFunc(func(req micro.Request) { s.serveRoute(base, req) })
	if err := svc.AddEndpoint(RouteEndpoint, handler,
		micro.WithEndpointSubject(routeSubject()),
		micro.WithEndpointMetadata(map[string]string{
			"request":  `{"agent","session","segment","providers":[...],"peek"?} (JSON)`,
			"response": `{"at","agent","session","segment","allowed":[...],"skipped":[{"provider","reason","next_probe_at"|"frozen"}]} (JSON)`,
		})); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("refusals: add endpoint %s on %s: %w", RouteEndpoint, routeSubject(), err)
	}
	return svc, nil
}

// serveRoute answers one request: 400 for a request that cannot be used,
// 500 when the state cannot be read or written.
func (s *Server) serveRoute(base context.Context, req micro.Request) {
	var rq RouteRequest
	if err := json.Unmarshal(req.Data(), &rq); err != nil {
		_ = req.Error("400", "route: request is not JSON {agent, session, segment, providers}: "+err.Error(), nil)
		return
	}
	if rq.Agent == "" || len(rq.Providers) == 0 {
		_ = req.Error("400", "route: agent and at least one provider are required", nil)
		return
	}
	ctx, cancel := context.WithTimeout(base, s.rtout)
	defer cancel()
	rec, err := s.Route(ctx, rq.RouteRequest, rq.Peek)
	if err != nil {
		s.log.Warn().Err(err).Str("agent", rq.Agent).Str("segment", events.SegmentKey(rq.Session, rq.Segment)).Msg("route failed")
		_ = req.Error("500", err.Error(), nil)
		return
	}
	if err := req.RespondJSON(rec); err != nil {
		s.log.Warn().Err(err).Msg("route: respond")
	}
}

// Route answers which of r.Providers, in order, may receive the segment
// `<r.Session>#<r.Segment>` now (the service's clock; r.At is ignored). It
// reads each provider's state and, for a due re-probe, claims it for r.Agent
// with compare-and-set: of agents racing for one re-probe exactly one is
// allowed. peek answers without claiming. It never moves a refusal clock;
// besides claims, its only write is the TTL refresh of a state older than
// half the TTL (refusal.TouchDue).
func (s *Server) Route(ctx context.Context, r events.RouteRequest, peek bool) (events.RouteRecord, error) {
	store := s.Store()
	if store == nil {
		return events.RouteRecord{}, errNotStarted
	}
	now := s.now()
	segment := events.SegmentKey(r.Session, r.Segment)
	res := events.RouteResult{Allowed: []string{}, Skipped: []events.RouteSkip{}}
	var down []events.RouteSkip
	for _, p := range r.Providers {
		if reason, out, err := s.outage(ctx, p); err != nil {
			return events.RouteRecord{}, fmt.Errorf("route %s: health of %s: %w", segment, p, err)
		} else if out {
			// Nothing reaches it now; skipped without claiming a re-probe.
			down = append(down, refusal.OutageSkip(p, reason))
			continue
		}
		ok, skip, err := s.routeOne(ctx, store, now, r.Agent, segment, p, peek)
		if err != nil {
			return events.RouteRecord{}, fmt.Errorf("route %s for %s: %w", segment, p, err)
		}
		if ok {
			res.Allowed = append(res.Allowed, p)
		} else {
			res.Skipped = append(res.Skipped, skip)
		}
	}
	res.Skipped = append(res.Skipped, down...)
	return events.RouteRecord{
		At: events.At(now), Agent: r.Agent, Session: r.Session, Segment: r.Segment, RouteResult: res,
	}, nil
}

// outage reads the provider's latest health record (the scheduler writes
// one on every change): a provider whose last word is "outage" cannot
// receive the segment now, as in simulate.
func (s *Server) outage(ctx context.Context, provider string) (reason string, down bool, err error) {
	s.mu.Lock()
	health := s.health
	s.mu.Unlock()
	if health == nil {
		return "", false, nil
	}
	m, err := health.GetLastMsgForSubject(ctx, events.HealthSubject(provider))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	h, err := events.DecodeAs[*events.Health](m.Subject, m.Header, m.Data)
	if err != nil {
		// An unreadable record says nothing about the provider.
		return "", false, nil
	}
	return h.Reason, h.State == events.HealthOutage, nil
}

// routeOne decides one provider, claiming a due re-probe for agent.
func (s *Server) routeOne(ctx context.Context, store *Store, now time.Time, agent, segment, provider string, peek bool) (bool, events.RouteSkip, error) {
	key := Key(segment, provider)
	conflicts := 0
	defer func() {
		if conflicts > 0 {
			s.m.conflicts.WithLabelValues("claim").Add(float64(conflicts))
		}
	}()
	for range MaxAttempts {
		cur, found, err := store.Get(ctx, key)
		if err != nil {
			return false, events.RouteSkip{}, err
		}
		if !found {
			s.m.routes.WithLabelValues(refusal.ProbeFree.String()).Inc()
			return true, events.RouteSkip{}, nil
		}
		if cur.DecodeErr != nil {
			s.m.unreadable.Inc()
			s.log.Warn().Err(cur.DecodeErr).Str("key", key).Msg("unreadable refusal state: read conservatively")
		}
		rec := cur.Record
		if rec.State.Provider == "" {
			rec.State.Provider = provider
		}
		if rec.State.Segment == "" {
			rec.State.Segment = segment
		}
		next, verdict := rec.Probe(now, s.cfg, agent, s.lease)
		if verdict == refusal.ProbeClaimed && peek {
			verdict = refusal.ProbeFree
		}
		switch verdict {
		case refusal.ProbeClaimed:
			_, ok, err := store.Put(ctx, key, next, cur.Revision)
			if err != nil {
				return false, events.RouteSkip{}, err
			}
			if !ok {
				conflicts++
				continue // someone else wrote first: decide again on what they wrote
			}
			s.m.routes.WithLabelValues(verdict.String()).Inc()
			return true, events.RouteSkip{}, nil
		case refusal.ProbeFree:
			s.touch(ctx, store, cur)
			s.m.routes.WithLabelValues(verdict.String()).Inc()
			return true, events.RouteSkip{}, nil
		default:
			s.touch(ctx, store, cur)
			s.m.routes.WithLabelValues(verdict.String()).Inc()
			return false, rec.Skip(now, s.cfg, provider), nil
		}
	}
	return false, events.RouteSkip{}, fmt.Errorf("%w: key %s, %d attempts", ErrTooManyConflicts, key, MaxAttempts)
}

// touch rewrites a state unchanged once half the TTL has passed since its
// last write (refusal.TouchDue), so a segment that is still routed
// keeps its state: otherwise a frozen provider would get the refused history
// again a TTL after freezing. The TTL runs on the server's clock, so this
// uses the wall clock, not Options.Now. A lost race means someone else just
// wrote the key, which refreshes it too; other errors are logged, not
// returned, because the answer does not depend on them.
func (s *Server) touch(ctx context.Context, store *Store, cur Entry) {
	s.mu.Lock()
	cfg := s.touchAt
	s.mu.Unlock()
	if !refusal.TouchDue(cur.Written, time.Now(), cfg) {
		return
	}
	_, ok, err := store.PutRaw(ctx, cur.Key, cur.Raw, cur.Revision)
	switch {
	case err != nil && !errors.Is(err, context.Canceled):
		s.log.Warn().Err(err).Str("key", cur.Key).Msg("refresh refusal state TTL")
	case ok:
		s.m.touched.Inc()
	default:
		s.m.conflicts.WithLabelValues("touch").Inc()
	}
}
