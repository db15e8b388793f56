// Package status is failbus's live status page: what an operator asks
// first during an outage, read from the bus every few seconds and pushed
// to the browser — each provider's health (since when, why), the tasks
// held for it, its recovery checklist's progress, every durable
// consumer's lag, the dead letters of the last hour by reason, and the
// notifications of the last hour sent and held by the budget.
//
// It only reads, with the `operator` role's rights and fewer: the latest
// record per subject and pages of a stream by direct gets, stream and
// consumer info. It creates no consumer (not even an ordered one) and
// publishes nothing, so any number of pages may watch a bus. `failbus dev`
// serves it on its ops address (/status), each service binary on its own,
// and `failbus status --addr` against any bus.
//
// The page is one HTML document with its style and script inline: no
// build step, no external asset, readable offline. It follows
// /status/events (server-sent events) and falls back to polling
// /status.json.
//
// What is not guaranteed: the window figures count what the streams still
// hold (an expired or purged message is not counted), by store time, to
// the minute; a refresh reads at most pageLimit new messages per stream,
// so after a flood the figures catch up over several refreshes (Behind
// says so).
package status

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/cli/lag"
	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Window is the span of the dead-letter and notification figures.
const Window = time.Hour

// readTimeout bounds one refresh.
const readTimeout = 10 * time.Second

// maxReasons bounds the distinct (service, reason) pairs counted per
// minute; the rest count as "other".
const maxReasons = 200

// Snapshot is the page's content at one moment (/status.json).
type Snapshot struct {
	At        time.Time  `json:"at"`
	Providers []Provider `json:"providers"`
	Consumers []Consumer `json:"consumers"`
	// DeadLetters are those stored over the last WindowSeconds.
	DeadLetters DeadLetters `json:"dead_letters"`
	// Notifications are the notifier's decisions over the last
	// WindowSeconds.
	Notifications Notifications `json:"notifications"`
	// WindowSeconds is the span of DeadLetters and Notifications.
	WindowSeconds int `json:"window_seconds"`
	// Problems are what could not be read, one line each: the rest of
	// the page still shows.
	Problems []string `json:"problems"`
}

// Provider is one provider's state.
type Provider struct {
	Name string `json:"name"`
	// State is healthy, degraded, outage or recovered: the latest health
	// record (healthy when there is none).
	State  string    `json:"state"`
	Since  time.Time `json:"since,omitzero"`
	Reason string    `json:"reason,omitempty"`
	// Down is set while recovery holds the provider as down (an outage,
	// or degraded while recovering from one).
	Down bool `json:"down"`
	// Held counts the tasks held for it.
	Held int `json:"held"`
	// Released counts tasks released since the queue last started
	// holding.
	Released int `json:"released"`
	// Checklist is its latest recovery run (nil: none recorded).
	Checklist *Checklist `json:"checklist,omitempty"`
}

// Checklist is a recovery run's progress through the checklist.
type Checklist struct {
	RecoveryID      string    `json:"recovery_id"`
	OutageStartedAt time.Time `json:"outage_started_at,omitzero"`
	RecoveredAt     time.Time `json:"recovered_at,omitzero"`
	// Steps are every checklist step in order, each with whether it is
	// recorded.
	Steps []Step `json:"steps"`
	// Current is the step in progress ("" when none: waiting for the
	// recovery, or done).
	Current string `json:"current,omitempty"`
	Done    bool   `json:"done"`
	// LastAt is when its latest step was recorded.
	LastAt time.Time `json:"last_at,omitzero"`
}

// Step is one checklist step.
type Step struct {
	Name string `json:"name"`
	Done bool   `json:"done"`
}

// Consumer is one durable consumer's lag.
type Consumer struct {
	Stream      string `json:"stream"`
	Name        string `json:"name"`
	Pending     uint64 `json:"pending"`
	AckPending  int    `json:"ack_pending"`
	Redelivered int    `json:"redelivered"`
	Waiting     int    `json:"waiting"`
	// OldestAgeSeconds is the age of the oldest message it has not
	// processed (0: caught up).
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Paused           bool    `json:"paused,omitempty"`
	Retired          bool    `json:"retired,omitempty"`
}

// DeadLetters are dead letters by service and reason.
type DeadLetters struct {
	Total    int           `json:"total"`
	ByReason []ReasonCount `json:"by_reason"`
	// Behind is set while the count is still catching up.
	Behind bool `json:"behind,omitempty"`
}

// ReasonCount is how many dead letters one service wrote for one reason.
type ReasonCount struct {
	Service string `json:"service"`
	Reason  string `json:"reason"`
	Count   int    `json:"count"`
}

// Notifications count notification requests by severity and the
// notifier's decisions by kind (pkg/notify's audit kinds).
type Notifications struct {
	Requested map[string]int `json:"requested"`
	Sent      int            `json:"sent"`
	Held      int            `json:"held_by_budget"`
	Deduped   int            `json:"deduped"`
	Failed    int            `json:"failed"`
	Unrouted  int            `json:"unrouted"`
	Behind    bool           `json:"behind,omitempty"`
}

// Collector reads snapshots from one bus. It keeps where it stopped
// reading the dead letters and notifications, so each refresh reads only
// what is new. Safe for concurrent use; refreshes are serialised.
type Collector struct {
	js  jetstream.JetStream
	now func() time.Time

	mu       sync.Mutex
	dlq      *tail
	dlqWin   *window
	audit    *tail
	notify   *tail
	auditWin *window
	reqWin   *window
	kv       jetstream.KeyValue
}

// NewCollector reads from js; now defaults to time.Now.
func NewCollector(js jetstream.JetStream, now func() time.Time) *Collector {
	if now == nil {
		now = time.Now
	}
	return &Collector{
		js: js, now: now,
		dlq:      &tail{stream: topology.StreamDLQ, filter: events.DLQPrefix + ".>"},
		audit:    &tail{stream: topology.StreamAudit, filter: events.AuditSubject("notifier", "*")},
		notify:   &tail{stream: topology.StreamNotify, filter: events.NotifyPrefix + ".>"},
		dlqWin:   newWindow(Window, maxReasons),
		auditWin: newWindow(Window, 16),
		reqWin:   newWindow(Window, 16),
	}
}

// Collect reads a snapshot. What cannot be read is listed in Problems;
// the error is for a context that ended.
func (c *Collector) Collect(ctx context.Context) (*Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	now := c.now()
	s := &Snapshot{At: now.UTC(), WindowSeconds: int(Window / time.Second), Providers: []Provider{}, Consumers: []Consumer{}, Problems: []string{}}
	problem := func(what string, err error) {
		s.Problems = append(s.Problems, what+": "+err.Error())
	}
	providers := map[string]*Provider{}
	get := func(name string) *Provider {
		p := providers[name]
		if p == nil {
			p = &Provider{Name: name, State: events.HealthHealthy}
			providers[name] = p
		}
		return p
	}
	if err := c.health(ctx, get); err != nil {
		problem("provider health", err)
	}
	if err := c.recoveryState(ctx, get); err != nil {
		problem("held tasks", err)
	}
	if err := c.checklists(ctx, get); err != nil {
		problem("recovery checklist", err)
	}
	for _, p := range providers {
		s.Providers = append(s.Providers, *p)
	}
	slices.SortFunc(s.Providers, func(a, b Provider) int { return strings.Compare(a.Name, b.Name) })

	if lags, err := lag.Read(ctx, c.js, lag.Options{}, now); err != nil {
		problem("consumer lag", err)
	} else {
		for _, l := range lags {
			s.Consumers = append(s.Consumers, Consumer{
				Stream: l.Stream, Name: l.Durable, Pending: l.Pending, AckPending: l.AckPending,
				Redelivered: l.Redelivered, Waiting: l.Waiting, OldestAgeSeconds: float64(l.OldestAgeMS) / 1000,
				Paused: l.Paused, Retired: l.Retired,
			})
		}
	}
	if err := c.deadLetters(ctx, now, &s.DeadLetters); err != nil {
		problem("dead letters", err)
	}
	if err := c.notifications(ctx, now, &s.Notifications); err != nil {
		problem("notifications", err)
	}
	if err := ctx.Err(); err != nil {
		return s, err
	}
	return s, nil
}

// health reads the latest health record of every provider.
func (c *Collector) health(ctx context.Context, get func(string) *Provider) error {
	return streamread.LastPerSubject(ctx, c.js, topology.StreamHealth, []string{events.HealthPrefix + ".>"}, 0, func(m *nats.Msg) error {
		h, err := events.DecodeAs[*events.Health](streamread.ServerHeader(m, jetstream.SubjectHeader), m.Header, m.Data)
		if err != nil {
			return fmt.Errorf("health record %s: %w", streamread.ServerHeader(m, jetstream.SubjectHeader), err)
		}
		p := get(h.Provider)
		p.State, p.Since, p.Reason = h.State, h.At.Time.UTC(), h.Reason
		return nil
	})
}

// recoveryState reads the recovery service's provider records: held
// tasks, down, and the checklist step of a run in progress.
func (c *Collector) recoveryState(ctx context.Context, get func(string) *Provider) error {
	if c.kv == nil {
		kv, err := c.js.KeyValue(ctx, topology.BucketRecovery)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", topology.BucketRecovery, err)
		}
		c.kv = kv
	}
	entries, err := streamread.LatestEntries(ctx, c.js, c.kv, "prov.>")
	if err != nil {
		return err
	}
	for _, e := range entries {
		var r recovery.ProviderRecord
		if err := msgpack.Unmarshal(e.Value(), &r); err != nil {
			return fmt.Errorf("provider record %s: %w", e.Key(), err)
		}
		if r.Provider == "" {
			continue
		}
		p := get(r.Provider)
		p.Down, p.Held, p.Released = r.Down, r.Queue.Held, r.Queue.Released
		if len(r.Episodes) > 0 {
			ep := r.Episodes[0]
			cl := &Checklist{RecoveryID: ep.RecoveryID, OutageStartedAt: ep.OutageStartedAt.Time.UTC()}
			if !ep.RecoveredAt.IsZero() {
				cl.RecoveredAt = ep.RecoveredAt.Time.UTC()
				cl.Steps = steps(ep.Step)
				if ep.Step < len(events.Steps) {
					cl.Current = events.Steps[ep.Step]
				}
			} else {
				cl.Steps = steps(0)
			}
			p.Checklist = cl
		}
	}
	return nil
}

// steps lists the checklist with the first done of them done.
func steps(done int) []Step {
	out := make([]Step, len(events.Steps))
	for i, name := range events.Steps {
		out[i] = Step{Name: name, Done: i < done}
	}
	return out
}

// checklists reads the latest recovery record of each provider: the
// progress of a run the provider record no longer holds (finished), or
// confirms one in progress.
func (c *Collector) checklists(ctx context.Context, get func(string) *Provider) error {
	return streamread.LastPerSubject(ctx, c.js, topology.StreamRecoveries, []string{events.RecoveryPrefix + ".>"}, 0, func(m *nats.Msg) error {
		r, err := events.DecodeAs[*events.Recovery](streamread.ServerHeader(m, jetstream.SubjectHeader), m.Header, m.Data)
		if err != nil {
			return fmt.Errorf("recovery record %s: %w", streamread.ServerHeader(m, jetstream.SubjectHeader), err)
		}
		p := get(r.Provider)
		if p.Checklist != nil {
			// A run the recovery service still holds: its record says
			// which step is in progress; this one says when the last
			// was recorded.
			if p.Checklist.RecoveryID == r.RecoveryID {
				p.Checklist.LastAt = r.At.Time.UTC()
			}
			return nil
		}
		// A finished run (or one whose record is gone): its last step.
		cl := &Checklist{RecoveryID: r.RecoveryID, OutageStartedAt: r.OutageStartedAt.Time.UTC(), RecoveredAt: r.RecoveredAt.Time.UTC(), LastAt: r.At.Time.UTC(), Done: r.Done}
		i := slices.Index(events.Steps, r.Step)
		switch {
		case r.Done:
			cl.Steps = steps(len(events.Steps))
		case i >= 0:
			cl.Steps = steps(i + 1)
			if i+1 < len(events.Steps) {
				cl.Current = events.Steps[i+1]
			}
		default:
			cl.Steps = steps(0)
		}
		p.Checklist = cl
		return nil
	})
}

// deadLetters counts the dead letters of the window by service and
// reason.
func (c *Collector) deadLetters(ctx context.Context, now time.Time, out *DeadLetters) error {
	err := c.dlq.read(ctx, c.js, now.Add(-Window), func(m *nats.Msg, stored time.Time) {
		subject := streamread.ServerHeader(m, jetstream.SubjectHeader)
		service := strings.TrimPrefix(subject, events.DLQPrefix+".")
		reason := "(undecodable dead letter)"
		if dl, err := events.DecodeAs[*events.DeadLetter](subject, m.Header, m.Data); err == nil {
			service, reason = dl.Service, dl.Reason
		}
		c.dlqWin.add(stored, service+"\x00"+reason)
	})
	out.Behind = c.dlq.behind
	out.ByReason = []ReasonCount{}
	for k, n := range c.dlqWin.totals(now) {
		service, reason, _ := strings.Cut(k, "\x00")
		if k == otherKey {
			service, reason = "", "(other reasons)"
		}
		out.Total += n
		out.ByReason = append(out.ByReason, ReasonCount{Service: service, Reason: reason, Count: n})
	}
	slices.SortFunc(out.ByReason, func(a, b ReasonCount) int {
		if a.Count != b.Count {
			return b.Count - a.Count
		}
		if a.Service != b.Service {
			return strings.Compare(a.Service, b.Service)
		}
		return strings.Compare(a.Reason, b.Reason)
	})
	return err
}

// notifications counts the window's notification requests by severity
// and the notifier's decisions by kind (the last token of its audit
// subjects).
func (c *Collector) notifications(ctx context.Context, now time.Time, out *Notifications) error {
	var errs []error
	if err := c.notify.read(ctx, c.js, now.Add(-Window), func(m *nats.Msg, stored time.Time) {
		subject := streamread.ServerHeader(m, jetstream.SubjectHeader)
		c.reqWin.add(stored, strings.TrimPrefix(subject, events.NotifyPrefix+"."))
	}); err != nil {
		errs = append(errs, err)
	}
	if err := c.audit.read(ctx, c.js, now.Add(-Window), func(m *nats.Msg, stored time.Time) {
		subject := streamread.ServerHeader(m, jetstream.SubjectHeader)
		c.auditWin.add(stored, subject[strings.LastIndexByte(subject, '.')+1:])
	}); err != nil {
		errs = append(errs, err)
	}
	out.Behind = c.notify.behind || c.audit.behind
	out.Requested = c.reqWin.totals(now)
	delete(out.Requested, otherKey)
	kinds := c.auditWin.totals(now)
	out.Sent, out.Held, out.Deduped = kinds[delivery.AuditSent], kinds[delivery.AuditHeld], kinds[delivery.AuditDeduped]
	out.Failed, out.Unrouted = kinds[delivery.AuditFailed], kinds[delivery.AuditUnrouted]
	return errors.Join(errs...)
}
