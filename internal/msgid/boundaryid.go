package msgid

import "github.com/failbus/failbus/pkg/events"

// Boundary is the Nats-Msg-Id of a boundary,
// "boundary:<agent>:<session>#<segment>": one segment starts once, however
// often (or by whom: agent, `failbus publish`) it is reported.
func Boundary(b events.Boundary) string {
	return "boundary:" + b.Agent + ":" + events.SegmentKey(b.Session, b.Segment)
}
