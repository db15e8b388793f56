package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/engine"
	"github.com/failbus/failbus/pkg/events"
)

// seedOutages carries into FAILBUS_SCOPE the outages that health records
// left open for providers the bucket knows nothing about (a scheduler from
// before the bucket, which kept the fault scope in memory, or a bucket
// lost): such a provider stays held until its recovery, instead of
// starting over as healthy. It returns how many it seeded.
func (s *Service) seedOutages(ctx context.Context) (int, error) {
	open, err := s.openOutages(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for p, h := range open {
		seeded := false
		err := s.providers.Update(ctx, p, func(rec *engine.ProviderRecord) (bool, error) {
			st := &rec.State
			if rec.Seq != 0 || !st.Clock.IsZero() || st.Outage || len(st.Profiles) > 0 {
				return false, nil // the bucket knows the provider
			}
			st.Outage, st.OutageSince, st.OutageReason, st.Clock = true, h.At, h.Reason, h.At
			seeded = true
			return true, nil
		})
		if err != nil {
			return n, fmt.Errorf("scheduler: seed the outage of %s: %w", p, err)
		}
		if seeded {
			n++
			s.log.Info().Str("provider", p).Time("since", h.At.Time).Msg("outage still open in FAILBUS_HEALTH: seeded, provider held")
		}
	}
	return n, nil
}

// openOutages folds FAILBUS_HEALTH per provider and returns, for each
// provider still in an outage, the record that started it.
func (s *Service) openOutages(ctx context.Context) (map[string]events.Health, error) {
	open := map[string]events.Health{}
	err := readStream(ctx, s.js, topology.StreamHealth, events.HealthPrefix+".>", nil, false, func(m jetstream.Msg) error {
		h, err := events.DecodeAs[*events.Health](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return nil
		}
		switch h.State {
		case events.HealthOutage:
			if _, ok := open[h.Provider]; !ok {
				open[h.Provider] = *h
			}
		case events.HealthRecovered, events.HealthHealthy:
			delete(open, h.Provider)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("scheduler: read provider health: %w", err)
	}
	return open, nil
}

// readStream calls fn for every message of stream on filter (from start
// when set) that was stored when the read began, in order, with an
// ephemeral ordered consumer.
func readStream(ctx context.Context, js jetstream.JetStream, stream, filter string, start *time.Time, headersOnly bool, fn func(jetstream.Msg) error) error {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, HeadersOnly: headersOnly}
	if start != nil {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, start
	}
	c, err := js.OrderedConsumer(ctx, stream, cfg)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = js.DeleteConsumer(dctx, stream, info.Name)
		}
	}()
	pending := c.CachedInfo().NumPending
	var seen uint64
	for seen < pending {
		batch, err := c.Fetch(int(min(pending-seen, 512)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if err := fn(m); err != nil {
				return err
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		if got == 0 {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("read %s: got %d of %d messages", stream, seen, pending)
		}
		seen += uint64(got)
	}
	return nil
}
