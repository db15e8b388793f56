package events

// RefusalRouteSubject is the request-reply subject of the refusal tiers'
// route service (a nats.go micro service, "failbus-refusals"): an agent asks
// which of its providers may receive a context segment now. Request and
// reply are JSON (CONTRACT.md `route`): {agent, session, segment,
// providers} in, {at, agent, session, segment, allowed, skipped} out.
const RefusalRouteSubject = Prefix + ".refusal.route"
