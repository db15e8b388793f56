package events

// The route exchange of the refusal tiers (docs/CONTRACT.md `route`):
// an agent asks, before a call, which of its providers may receive the
// context segment now. The request and its answer travel as JSON on
// RefusalRouteSubject and as `route` records in `failbus simulate`; they are
// wire types, so agents (pkg/agent) use them without the policy.

// RouteRequest asks which of the providers, in order, may receive the
// segment `<session>#<segment>` now.
type RouteRequest struct {
	At        Time     `json:"at"`
	Agent     string   `json:"agent"`
	Session   string   `json:"session"`
	Segment   int      `json:"segment"`
	Providers []string `json:"providers"`
}

// RouteResult answers "which of these providers may receive this segment
// now?": Allowed keeps the caller's order; every provider not allowed is in
// Skipped with the reason the model is told.
type RouteResult struct {
	Allowed []string    `json:"allowed"`
	Skipped []RouteSkip `json:"skipped"`
}

// RouteSkip is one provider the segment must not be sent to now, with the
// reason the refusal tiers worded and either when it may be probed again or
// that it is frozen until a boundary.
type RouteSkip struct {
	Provider    string `json:"provider"`
	Reason      string `json:"reason"`
	NextProbeAt *Time  `json:"next_probe_at,omitempty"`
	Frozen      bool   `json:"frozen,omitempty"`
}

// RouteRecord answers a route request: the request's identity, its time and
// the result.
type RouteRecord struct {
	At      Time   `json:"at"`
	Agent   string `json:"agent"`
	Session string `json:"session"`
	Segment int    `json:"segment"`
	RouteResult
}
