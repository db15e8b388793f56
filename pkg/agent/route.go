package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/pkg/events"
)

// ErrRouteUnavailable is returned (wrapped) by Route when no refusal route
// service answers on events.RefusalRouteSubject. What to do then is the
// agent's choice; sending a segment that may be frozen for a provider is the
// risk the refusal tiers exist to bound, so the conservative answer is the last route
// answer, or the provider least likely to refuse.
var ErrRouteUnavailable = errors.New("agent: refusal route service not reachable")

// RouteError is an error answer of the route service (a nats micro error):
// Code "400" for a request it cannot use, "500" when it cannot read or write
// the refusal state.
type RouteError struct {
	Code        string
	Description string
}

// Error implements error.
func (e *RouteError) Error() string {
	return fmt.Sprintf("agent: route service error %s: %s", e.Code, e.Description)
}

// Route asks the refusal tiers which of providers, in order, may receive
// the context segment `<session>#<segment>` now; the first of Allowed is the
// one to send to. Ask before every call: a due re-probe is claimed for this
// agent by the answer that allows it, so of several agents on one segment
// only one re-probes, and a provider skipped now says why (the reason to
// hand the model) and when it may be tried again (next_probe_at) or that it
// is frozen until a boundary. Asking never moves a refusal clock.
func (a *Agent) Route(ctx context.Context, session string, segment int, providers []string) (events.RouteResult, error) {
	rec, err := RequestRoute(ctx, a.js.Conn(), events.RouteRequest{
		Agent: a.name, Session: session, Segment: segment, Providers: providers,
	})
	if err != nil {
		return events.RouteResult{}, fmt.Errorf("agent %s: route %s: %w", a.name, events.SegmentKey(session, segment), err)
	}
	return rec.RouteResult, nil
}

// RequestRoute is the route request-reply on nc for any caller (a tool, an
// agent without an Agent): JSON r to events.RefusalRouteSubject, the JSON
// answer decoded. r.Agent and r.Providers are required; r.At is ignored (the
// service's clock decides). ctx must carry a deadline or be cancellable.
func RequestRoute(ctx context.Context, nc *nats.Conn, r events.RouteRequest) (events.RouteRecord, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return events.RouteRecord{}, fmt.Errorf("encode route request: %w", err)
	}
	msg, err := nc.RequestWithContext(ctx, events.RefusalRouteSubject, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return events.RouteRecord{}, fmt.Errorf("%w: %w", ErrRouteUnavailable, err)
	}
	if err != nil {
		return events.RouteRecord{}, fmt.Errorf("request %s: %w", events.RefusalRouteSubject, err)
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		return events.RouteRecord{}, &RouteError{Code: code, Description: msg.Header.Get("Nats-Service-Error")}
	}
	var rec events.RouteRecord
	if err := json.Unmarshal(msg.Data, &rec); err != nil {
		return events.RouteRecord{}, fmt.Errorf("decode route answer: %w", err)
	}
	return rec, nil
}
