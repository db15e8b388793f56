// Package jspub writes failbus records to JetStream the one way failbus
// writes them: msgpack with the schema header and a Nats-Msg-Id that makes
// a second store within the duplicate window a no-op.
package jspub

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/pkg/events"
)

// NewMsg is m encoded for subject the one way failbus writes records:
// msgpack with Content-Type and Failbus-Schema (events.Encode), the extra
// headers of hdr (may be nil), and Nats-Msg-Id msgID, the identity that
// makes storing it again within the stream's duplicate window a no-op. Its
// error is events.Encode's, for the caller to put in context.
func NewMsg(subject string, m events.Message, msgID string, hdr nats.Header) (*nats.Msg, error) {
	data, h, err := events.Encode(m)
	if err != nil {
		return nil, err
	}
	for k, vs := range hdr {
		h[k] = vs
	}
	h.Set(events.HeaderMsgID, msgID)
	return &nats.Msg{Subject: subject, Header: h, Data: data}, nil
}

// Publish stores m on subject with Nats-Msg-Id msgID (NewMsg) and waits
// for the stream's acknowledgement; opts go to PublishMsg (expected last
// sequence and so on). A handler's outputs go through Outputs instead,
// which the runner publishes before acknowledging the input; Publish is
// for what a service writes outside that (ledger entries, schedules,
// records of a store's outbox, audit records).
func Publish(ctx context.Context, js jetstream.Publisher, subject string, m events.Message, msgID string, hdr nats.Header, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	msg, err := NewMsg(subject, m, msgID, hdr)
	if err != nil {
		return nil, fmt.Errorf("%s to %s: %w", m.SchemaName(), subject, err)
	}
	ack, err := js.PublishMsg(ctx, msg, opts...)
	if err != nil {
		return nil, fmt.Errorf("publish %s to %s (%s): %w", m.SchemaName(), subject, msgID, err)
	}
	return ack, nil
}

// AwaitPub waits until the async publish f is stored, fails, or ctx ends:
// for a handler that stores something outside its Outputs (a schedule
// beside its decision) and must not go on before it is stored.
func AwaitPub(ctx context.Context, f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return fmt.Errorf("publish %s: %w", f.Msg().Subject, err)
	case <-ctx.Done():
		return fmt.Errorf("publish %s: no acknowledgement: %w", f.Msg().Subject, ctx.Err())
	}
}
