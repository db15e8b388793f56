package recoverer

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/tracing"
	"github.com/failbus/failbus/pkg/events"
)

// publisher is recovery.Publisher on JetStream: encode, Nats-Msg-Id, wait
// for the stream to store it.
type publisher struct {
	js      jetstream.JetStream
	timeout time.Duration
	// sent is called after each stored message (metrics).
	sent func(msg events.Message, duplicate bool)
	// probe runs HTTP probes (nil: none configured).
	probe *httpProber
}

// Publish implements recovery.Publisher.
func (p *publisher) Publish(ctx context.Context, id, subject string, msg events.Message, verifySince time.Time) error {
	if !verifySince.IsZero() {
		found, err := p.stored(ctx, subject, id, verifySince)
		if err != nil {
			return err
		}
		if found {
			return nil // published before a crash, longer ago than the dedupe window
		}
	}
	data, hdr, err := events.Encode(msg)
	if err != nil {
		return err
	}
	hdr.Set(events.HeaderMsgID, id)
	// A dispatch made while handling a task goes on in the task's trace.
	tracing.Inject(ctx, hdr)
	pctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	ack, err := p.js.PublishMsg(pctx, &nats.Msg{Subject: subject, Header: hdr, Data: data})
	if err != nil {
		return fmt.Errorf("publish %s to %s: %w", id, subject, err)
	}
	if p.sent != nil {
		p.sent(msg, ack.Duplicate)
	}
	return nil
}

// lookBack widens the look-up for a late command: `since` is read on the
// clock of the replica that planned the command, the stream's times on the
// server's, so the look-up starts this much earlier.
const lookBack = DefaultMaxFutureSkew

// stored looks for a message with Nats-Msg-Id id on subject since `since`
// (headers only), less lookBack.
func (p *publisher) stored(ctx context.Context, subject, id string, since time.Time) (bool, error) {
	since = since.Add(-lookBack)
	stream, err := p.js.StreamNameBySubject(ctx, subject)
	if err != nil {
		return false, fmt.Errorf("find the stream of %s: %w", subject, err)
	}
	found := false
	err = readSince(ctx, p.js, stream, subject, since, true, func(m jetstream.Msg) bool {
		found = m.Headers().Get(events.HeaderMsgID) == id
		return !found
	})
	return found, err
}

// HTTPProbe implements recovery.Prober.
func (p *publisher) HTTPProbe(ctx context.Context, provider, recoveryID string, seq int, at time.Time) {
	if p.probe != nil {
		p.probe.run(ctx, provider, recoveryID, seq, at)
	}
}
