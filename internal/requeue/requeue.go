// Package requeue names the headers and ids of a dead letter put back on its
// original subject by `failbus dlq requeue`, which the consumer runner and
// the agent client honour. Only failbus's own services and tools write
// them, so they stay out of the public wire package.
package requeue

import (
	"strconv"
	"strings"
)

// Headers of a dead letter put back on its original subject by `failbus dlq
// requeue`. The copy carries the original bytes and headers, except that
// its Nats-Msg-Id is MsgID (the original id would be dropped as a
// duplicate within the stream's window, and must stay the original's).
const (
	// HeaderFrom names the dead letter the message was requeued
	// from, "<stream>:<seq>" (From), so its history can be traced
	// and a requeue that was interrupted can find what it already
	// published.
	HeaderFrom = "Failbus-Requeued-From"
	// HeaderFor names the service (consumer) that dead-lettered the
	// original. Every other consumer of the subject already processed the
	// original, so pkg/consumer's runner acknowledges the copy without
	// handling it anywhere but in that service: requeued input is
	// processed once, by the one that missed it.
	HeaderFor = "Failbus-Requeue-For"
	// HeaderMsgID keeps the original's Nats-Msg-Id.
	HeaderMsgID = "Failbus-Requeued-Msg-Id"
)

// From is the HeaderFrom value of the dead letter at seq of
// stream.
func From(stream string, seq uint64) string {
	return stream + ":" + strconv.FormatUint(seq, 10)
}

// MsgID is the Nats-Msg-Id of the copy requeued from the dead letter
// at seq of stream: the same for every attempt, so two operators (or one
// finishing an interrupted requeue) publishing it within the target
// stream's duplicate window store it once.
func MsgID(stream string, seq uint64) string {
	return "requeue:" + From(stream, seq)
}

// Elsewhere reports whether a message with headers h is a requeued
// dead letter meant for another service than service: one service's
// consumer missed it, the others had already processed the original.
func Elsewhere(h map[string][]string, service string) bool {
	vs := h[HeaderFor]
	return len(vs) > 0 && strings.TrimSpace(vs[0]) != "" && vs[0] != service
}
