package refusals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/pkg/events"
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
func (s *Service) startMicro(ctx context.Context) (micro.Service, error) {
	nc := s.js.Conn()
	base := context.WithoutCancel(ctx) // in-flight requests finish on shutdown
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     ServiceVersion,
		Description: "failbus refusal tiers: which providers may receive a context segment now",
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
func (s *Service) serveRoute(base context.Context, req micro.Request) {
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
// `<r.Session>#<r.Segment>` now (the service's clock; r.At is ignored), with
// the engine's route stage: a provider in an outage (its fault scope in
// FAILBUS_SCOPE, recovering included) is skipped without claiming a
// re-probe; a due re-probe is claimed for r.Agent with compare-and-set, so
// of agents racing for one re-probe exactly one is allowed. peek answers
// without claiming. It never moves a refusal clock; besides claims, its
// only write is the TTL refresh of a state older than half the TTL
// (refusal.TouchDue).
func (s *Service) Route(ctx context.Context, r events.RouteRequest, peek bool) (events.RouteRecord, error) {
	if s.Store() == nil {
		return events.RouteRecord{}, errNotStarted
	}
	res, err := s.eng.Route(ctx, r, s.now(), engine.RouteOptions{Peek: peek, Lease: s.lease})
	if err != nil {
		return events.RouteRecord{}, err
	}
	for _, v := range res.Verdicts {
		s.m.routes.WithLabelValues(v.String()).Inc()
	}
	return res.RouteRecord, nil
}

// touch rewrites a state unchanged once half the TTL has passed since its
// last write (refusal.TouchDue), so a segment that is still routed
// keeps its state: otherwise a frozen provider would get the refused history
// again a TTL after freezing. The TTL runs on the server's clock, so this
// uses the wall clock, not Config.Now. A lost race means someone else just
// wrote the key, which refreshes it too; other errors are logged, not
// returned, because the answer does not depend on them.
func (s *Service) touch(ctx context.Context, store *Store, cur Entry) {
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
