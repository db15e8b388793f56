package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/engine"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// seedOutages carries into FAILBUS_SCOPE the outages that health records
// left open for providers the bucket knows nothing about (a scheduler from
// before the bucket, which kept the fault scope in memory, or a bucket
// lost): such a provider stays held until its recovery, instead of
// starting over as healthy. It returns how many it seeded. (A provider's
// record found missing later is rebuilt the same way when it is next
// observed: rebuild.)
func (s *Service) seedOutages(ctx context.Context) (int, error) {
	open, err := s.openOutages(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for p := range open {
		seeded, err := s.providers.Seed(ctx, p)
		if err != nil {
			return n, fmt.Errorf("scheduler: seed the outage of %s: %w", p, err)
		}
		if seeded {
			n++
		}
	}
	return n, nil
}

// rebuild is the record a provider's fault scope starts from when its key
// is missing (scopestore.Options.Missing): a provider whose latest health
// record on the bus is an outage, or degraded while recovering from one,
// starts in that outage, so losing FAILBUS_SCOPE neither ends an outage
// nor strands the tasks recovery holds for it: the provider recovers on
// sustained successes as usual. A provider new to the bus (no health
// record) costs one direct get.
func (s *Service) rebuild(ctx context.Context, provider string) (*engine.ProviderRecord, error) {
	last, err := s.health.GetLastMsgForSubject(ctx, events.HealthSubject(provider))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the latest health of %s: %w", provider, err)
	}
	h, err := events.DecodeAs[*events.Health](last.Subject, last.Header, last.Data)
	if err != nil || h.Provider != provider {
		return nil, nil // not a record of this provider's: nothing to rebuild from
	}
	switch h.State {
	case events.HealthOutage:
	case events.HealthDegraded:
		// Degraded may be the way back from an outage: the outage that
		// began it is earlier on the subject.
		open, err := s.openOutagesOn(ctx, events.HealthSubject(provider))
		if err != nil {
			return nil, err
		}
		o, ok := open[provider]
		if !ok {
			return nil, nil
		}
		h = &o
	default:
		return nil, nil
	}
	rec := &engine.ProviderRecord{}
	st := &rec.State
	st.Provider = provider
	st.Outage, st.OutageSince, st.OutageReason, st.Clock = true, h.At, h.Reason, h.At
	s.m.seeded.Inc()
	s.log.Warn().Str("provider", provider).Time("since", h.At.Time).
		Msg("no fault scope for a provider whose health records show an outage (a scheduler from before FAILBUS_SCOPE, or the bucket lost): rebuilt from them, provider held")
	return rec, nil
}

// openOutages folds FAILBUS_HEALTH per provider and returns, for each
// provider still in an outage, the record that started it.
func (s *Service) openOutages(ctx context.Context) (map[string]events.Health, error) {
	return s.openOutagesOn(ctx, events.HealthPrefix+".>")
}

// openOutagesOn is openOutages over the health subjects filter matches.
func (s *Service) openOutagesOn(ctx context.Context, filter string) (map[string]events.Health, error) {
	open := map[string]events.Health{}
	err := readStream(ctx, s.js, topology.StreamHealth, filter, nil, false, func(m jetstream.Msg) error {
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
