package drill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/delivery"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// The bus's clocks for a run of a few minutes, in timeline time (scaled
// like the timeline when the bus runs in process). The defaults are for
// production (a probe every 30 s, a recovery confirmed over 2 minutes);
// the drill's outage lasts 40 s.
const (
	busRetryInitial   = time.Second
	busRetryMax       = time.Minute
	busScopeWindow    = 5 * time.Minute
	busRecoveryMin    = 6 * time.Second
	busProbeInterval  = 2 * time.Second
	busDrainPerSecond = 20.0
)

// BusPolicy is the policy of the bus the drill starts in process, its
// clocks multiplied by scale: the retry delays, the fault scope's window
// and recovery time, the probe interval and the drain rate. Everything
// else is the default policy.
func BusPolicy(scale float64) (*policy.Policy, error) {
	d := func(v time.Duration) string { return max(time.Duration(float64(v)*scale), time.Millisecond).String() }
	text := fmt.Sprintf(`retry:
  initial_delay: %s
  max_delay: %s
scope:
  window: %s
  recovery_min_successes: 3
  recovery_min_time: %s
recovery:
  probe_interval: %s
  drain_rate: %g
`, d(busRetryInitial), d(busRetryMax), d(busScopeWindow), d(busRecoveryMin),
		max(time.Duration(float64(busProbeInterval)*scale), 100*time.Millisecond), busDrainPerSecond/scale)
	pol, err := policy.Parse([]byte(text))
	if err != nil {
		return nil, fmt.Errorf("drill: the bus's policy: %w", err)
	}
	return pol, nil
}

// busFigures are what the bus recorded during a run.
type busFigures struct {
	// NotifyRequests are the notifications the services asked for;
	// NotifySent those the notifier delivered (the log sink of `failbus
	// dev`, or the configured sinks); NotifyHeld those the daily budget
	// held back.
	NotifyRequests, NotifySent, NotifyHeld int
	// OutageAt and RecoveredAt are when the bus declared the drill's
	// outage provider down and recovered (the health records' times in
	// their stream; zero when it did not).
	OutageAt, RecoveredAt time.Time
	// Health is every change of the providers' health, in order.
	Health []healthChange
	// Redispatched counts the tasks dispatched again after a kill.
	Redispatched int
	// AgentErrors are errors the agents' readers reported.
	AgentErrors    int
	LastAgentError string
}

// countBus reads what the bus recorded since start: notifications asked
// for, sent and held, and the outage provider's health.
func countBus(ctx context.Context, nc *nats.Conn, start time.Time) (*busFigures, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	bf := &busFigures{}
	if err := each(ctx, js, topology.StreamNotify, events.NotifyPrefix+".>", start, func(jetstream.Msg) { bf.NotifyRequests++ }); err != nil {
		return nil, err
	}
	audit := events.AuditPrefix + "." + delivery.DefaultService + "."
	err = each(ctx, js, topology.StreamAudit, audit+">", start, func(m jetstream.Msg) {
		switch strings.TrimPrefix(m.Subject(), audit) {
		case delivery.AuditSent:
			bf.NotifySent++
		case delivery.AuditHeld:
			bf.NotifyHeld++
		}
	})
	if err != nil {
		return nil, err
	}
	err = each(ctx, js, topology.StreamHealth, events.HealthPrefix+".>", start, func(m jetstream.Msg) {
		h, err := events.DecodeAs[*events.Health](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return
		}
		// When the bus knew: the record's time in the stream (its `at`
		// is the failure's own time, which may be earlier).
		md, err := m.Metadata()
		if err != nil {
			return
		}
		bf.Health = append(bf.Health, healthChange{Provider: h.Provider, State: h.State, At: md.Timestamp})
		if h.Provider != ProviderOpenAI {
			return
		}
		switch {
		case h.State == events.HealthOutage && bf.OutageAt.IsZero():
			bf.OutageAt = md.Timestamp
		case h.State == events.HealthRecovered && !bf.OutageAt.IsZero() && bf.RecoveredAt.IsZero():
			bf.RecoveredAt = md.Timestamp
		}
	})
	return bf, err
}

// each hands fn every message on stream matching subject stored since
// start, and returns once it read up to the stream's end.
func each(ctx context.Context, js jetstream.JetStream, stream, subject string, start time.Time, fn func(jetstream.Msg)) error {
	c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start,
	})
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return fmt.Errorf("read %s: %w", stream, err)
	}
	pending := info.NumPending
	for pending > 0 {
		batch, err := c.FetchNoWait(int(min(pending, 1000)))
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		n := 0
		for m := range batch.Messages() {
			fn(m)
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		if n == 0 {
			// FetchNoWait may come back before the server sent the
			// batch; wait for the rest with a bounded fetch.
			b, err := c.Fetch(int(min(pending, 1000)), jetstream.FetchMaxWait(2*time.Second))
			if err != nil {
				return fmt.Errorf("read %s: %w", stream, err)
			}
			for m := range b.Messages() {
				fn(m)
				n++
			}
			if n == 0 {
				return nil
			}
		}
		pending -= uint64(n)
	}
	return nil
}

// healthChange is one health record: a provider's state from At (when
// the bus stored it).
type healthChange struct {
	Provider, State string
	At              time.Time
}
