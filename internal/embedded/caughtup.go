package embedded

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// CaughtUp reports whether the durable consumer name has acknowledged every
// message its stream holds on its filter. It compares the consumer's ack
// floor with the stream's last matching sequence rather than trusting
// NumPending alone: the server counts a new message into NumPending
// asynchronously after acknowledging its publish, so right after a publish
// NumPending can still read 0 while nothing was delivered yet. Tests (and
// the demo) that wait for a service to finish use it.
func CaughtUp(ctx context.Context, js jetstream.JetStream, stream, name string) (bool, error) {
	c, err := js.Consumer(ctx, stream, name)
	if err != nil {
		return false, fmt.Errorf("consumer %s/%s: %w", stream, name, err)
	}
	return ConsumerCaughtUp(ctx, js, stream, c)
}

// ConsumerCaughtUp is CaughtUp for a consumer already looked up: one
// request fewer per poll, for callers (failbus bench) that poll often
// while they measure the bus they would otherwise load.
func ConsumerCaughtUp(ctx context.Context, js jetstream.JetStream, stream string, c jetstream.Consumer) (bool, error) {
	name := c.CachedInfo().Name
	info, err := c.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("consumer %s/%s info: %w", stream, name, err)
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		return false, nil
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return false, fmt.Errorf("stream %s: %w", stream, err)
	}
	filters := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var last uint64
	for _, f := range filters {
		m, err := s.GetLastMsgForSubject(ctx, f)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("stream %s last message on %s: %w", stream, f, err)
		}
		last = max(last, m.Sequence)
	}
	return info.AckFloor.Stream >= last, nil
}
