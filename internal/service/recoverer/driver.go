package recoverer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/streamread"
	"github.com/failbus/failbus/pkg/consumer"
)

// lagWait is how long the driver waits before asking again whether the
// reports were applied (recovery.ErrLagging).
const lagWait = 100 * time.Millisecond

// lagWarnAfter is how long a checklist may wait for the reports before a
// warning says so (and again every as long).
const lagWarnAfter = 30 * time.Second

func natsMsg(subject string, h nats.Header, data []byte) *nats.Msg {
	return &nats.Msg{Subject: subject, Header: h, Data: data}
}

// drive advances the providers that are due, sleeping until the next one
// is (or until a record changes). It watches the provider records in KV to
// know who is due when; the records stay the truth (Advance reads them
// again).
func (s *Service) drive(ctx context.Context) error {
	w, err := s.store.state.WatchFiltered(ctx, []string{provPrefix + ">"})
	if err != nil {
		return err
	}
	defer w.Stop()
	go func() {
		for e := range w.Updates() {
			if e == nil {
				s.nudge() // initial values delivered
				continue
			}
			s.guard(ctx, e.Key(), e, func() { s.observe(e) })
		}
	}()
	resync := time.NewTicker(DefaultResync)
	defer resync.Stop()
	var backoff time.Duration
	lagSince := map[string]time.Time{} // provider → when its checklist began waiting for reports
	lagWarned := map[string]time.Time{}
	for {
		now := s.opts.Now()
		next := now.Add(DefaultResync)
		for p, due := range s.dueNow() {
			if due.After(now) {
				if due.Before(next) {
					next = due
				}
				continue
			}
			// Each provider is advanced at a fresh clock reading, not the
			// one this round began with: the advances before it may have
			// taken a while, and a release or probe claimed at a stale time
			// leaves the next one due early for the other replicas.
			var err error
			if !s.guard(ctx, ProviderKey(p), nil, func() { err = s.core.Advance(ctx, p, s.opts.Now()) }) {
				continue
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if errors.Is(err, recovery.ErrLagging) {
					if lagSince[p].IsZero() {
						lagSince[p] = now
					}
					if waited := now.Sub(lagSince[p]); waited > lagWarnAfter && now.Sub(lagWarned[p]) > lagWarnAfter {
						lagWarned[p] = now
						s.log.Warn().Str("provider", p).Int64("waited_ms", waited.Milliseconds()).
							Msg("checklist waits for the heartbeat and report consumers to catch up (see failbus lag: a message in redelivery holds it)")
					}
					next = earlier(next, now.Add(lagWait))
					continue
				}
				s.m.advanceErrors.Inc()
				s.setDriveErr(err)
				s.log.Warn().Err(err).Str("provider", p).Msg("recovery step failed; retried")
				backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
				next = earlier(next, now.Add(backoff))
				continue
			}
			backoff = 0
			delete(lagSince, p)
			s.setDriveErr(nil)
		}
		t := time.NewTimer(max(time.Until(next), time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-s.wake:
		case <-t.C:
		case <-resync.C:
		}
		t.Stop()
	}
}

// guard runs fn, which reads or advances the provider record under key
// (e, when the watch delivered it; else the record is read now). A panic
// in fn must not crash-loop the service on a record it replays at every
// start, so the record is quarantined instead: dead-lettered on
// failbus.dlq.recovery with the panic as the reason and its bytes, and
// removed from the bucket (only that revision: a newer record is left).
// The provider's tasks and checklist start over from its next health
// record; the dead letter keeps what the record held. guard reports
// whether fn returned.
func (s *Service) guard(ctx context.Context, key string, e jetstream.KeyValueEntry, fn func()) (ok bool) {
	defer func() {
		p := recover()
		if p == nil {
			return
		}
		ok = false
		reason := fmt.Sprintf("panic: %v", p)
		s.log.Error().Str("key", key).Str("reason", reason).Str("stack", string(debug.Stack())).
			Msg("provider record made the service panic: quarantined")
		if err := s.quarantine(ctx, key, e, reason); err != nil {
			s.log.Error().Err(err).Str("key", key).Msg("quarantine failed; the record is skipped until the service restarts")
		}
		if name, err := unpart(strings.TrimPrefix(key, provPrefix)); err == nil {
			s.mu.Lock()
			delete(s.due, name)
			s.mu.Unlock()
		}
	}()
	fn()
	return true
}

// quarantine moves the record under key (revision e's, or the current one)
// to the dead-letter stream and deletes it.
func (s *Service) quarantine(ctx context.Context, key string, e jetstream.KeyValueEntry, reason string) error {
	kv := s.store.state
	if e == nil {
		var err error
		if e, err = kv.Get(ctx, key); err != nil {
			return fmt.Errorf("read %s: %w", key, err)
		}
	}
	m := &consumer.Msg{
		Subject: "$KV." + kv.Bucket() + "." + key, Data: e.Value(),
		Stream: "KV_" + kv.Bucket(), Seq: e.Revision(), Timestamp: e.Created(),
	}
	if err := consumer.Quarantine(ctx, s.js, Name, m, reason); err != nil {
		return err
	}
	s.m.quarantined.Inc()
	if err := kv.Delete(ctx, key, jetstream.LastRevision(e.Revision())); err != nil && !streamread.IsWrongLastSeq(err) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

func (s *Service) setDriveErr(err error) {
	s.mu.Lock()
	s.driveErr = err
	s.mu.Unlock()
}

// dueNow copies the due map.
func (s *Service) dueNow() map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]time.Time, len(s.due))
	for p, t := range s.due {
		out[p] = t
	}
	return out
}

// observe notes when a changed provider record is next due, and updates
// the gauges.
func (s *Service) observe(e jetstream.KeyValueEntry) {
	name, err := unpart(strings.TrimPrefix(e.Key(), provPrefix))
	if err != nil {
		return
	}
	var r recovery.ProviderRecord
	if e.Operation() != jetstream.KeyValuePut || msgpack.Unmarshal(e.Value(), &r) != nil {
		s.mu.Lock()
		delete(s.due, name)
		s.mu.Unlock()
		return
	}
	now := s.opts.Now()
	due := r.NextDue(now)
	if !due.IsZero() && r.Lease.Owner != s.opts.Owner && r.Lease.Until.After(due) {
		due = r.Lease.Until.Time // another replica drives it until then
	}
	s.m.held.WithLabelValues(s.m.providers.Use(name)).Set(float64(r.Queue.Held))
	s.m.down.WithLabelValues(s.m.providers.Use(name)).Set(boolGauge(r.Down))
	step := 0
	if len(r.Episodes) > 0 && !r.Episodes[0].RecoveredAt.IsZero() {
		step = r.Episodes[0].Step + 1
	}
	s.m.step.WithLabelValues(s.m.providers.Use(name)).Set(float64(step))
	s.mu.Lock()
	if due.IsZero() {
		delete(s.due, name)
	} else {
		s.due[name] = due
	}
	s.mu.Unlock()
	s.nudge()
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
