package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/failbus/failbus/internal/policy/notification"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Names the digest mentions: where held requests and their audit records
// are, as the notifier service (pkg/notify, with its default service name)
// writes them.
const (
	notifierService = "notifier"
	auditHeldKind   = "held_by_budget"
)

// Admitted is what notification admission did with one request.
type Admitted struct {
	notification.Admission
	// Sent is the notification as delivered when the verdict is Send:
	// redacted, as the notifier sends it.
	Sent *events.Notification
	// Digest is the day's budget digest when this request was the first
	// held back that day; it is admitted right after (it bypasses the
	// budget), so Sent of the next Admit call is the digest.
	Digest *events.Notification
}

// Limits are the admission limits of the policy in force, with the dedupe
// lifetime lifetime (notification.DefaultDedupeLifetime when not positive).
func (e *Engine) Limits(lifetime time.Duration) notification.Limits {
	return notification.Limits{DailyBudget: e.Policy().Notify.DailyBudget, DedupeLifetime: lifetime}
}

// Admit is the notification-admission stage for the engine's own runs
// (simulate, shadow): notification.Admit — dedupe within the key's
// lifetime, the daily budget of non-critical notifications, the digest at
// the first hold of a day, critical bypassing the budget — on the
// Admissions store, at now. The notifier service applies the same rules
// inside its delivery protocol (claims and leases across replicas, per-sink
// delivery state), on its KV buckets.
func (e *Engine) Admit(ctx context.Context, n events.Notification, now time.Time, lifetime time.Duration) (Admitted, error) {
	st := e.stores.Admissions
	if st == nil {
		return Admitted{}, fmt.Errorf("engine: admit %s: no admission store", n.DedupeKey)
	}
	if n.At.IsZero() {
		n.At = events.At(now)
	}
	l := e.Limits(lifetime)
	ks, err := st.Key(ctx, n.DedupeKey)
	if err != nil {
		return Admitted{}, fmt.Errorf("engine: admit %s: %w", n.DedupeKey, err)
	}
	today := notification.UTCDay(now)
	day, err := st.Day(ctx, today)
	if err != nil {
		return Admitted{}, fmt.Errorf("engine: admit %s: %w", n.DedupeKey, err)
	}
	day.Day = today
	a := notification.Admit(l, n, ks, day, now)
	out := Admitted{Admission: a}
	switch a.Verdict {
	case notification.Duplicate:
		return out, nil
	case notification.Send:
		if a.NewLifetime {
			ks = notification.KeyState{}
		}
		ks.SentAt, ks.HeldDay = now, ""
		if a.Budgeted {
			day.Sent++
		}
		sent := notification.Redacted(n) // as the notifier sends it
		out.Sent = &sent
	case notification.Hold:
		if !a.HeldAgain {
			ks.HeldDay = today
			day.Held++
		}
		if a.RequestDigest {
			day.DigestRequested = true
			d := notification.Digest(l.DailyBudget, today, day.Held, n.At.Time, topology.StreamNotify,
				events.AuditSubject(notifierService, auditHeldKind))
			out.Digest = &d
		}
	}
	if err := st.Put(ctx, n.DedupeKey, ks, day); err != nil {
		return Admitted{}, fmt.Errorf("engine: admit %s: %w", n.DedupeKey, err)
	}
	return out, nil
}
