package delivery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/policy/notification"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// The daily budget lives in the budget bucket, one record per UTC day,
// changed only by compare-and-set: replicas share it and a restart resumes
// the count.

// budgetCache remembers this replica's last view of a day's record and its
// revision, so a reservation is usually one compare-and-set write, with a
// read only after another replica changed the record.
type budgetCache struct {
	day string
	rec BudgetRecord
	rev uint64
}

// updateBudget applies change to the day's record (a new one when absent)
// with compare-and-set and returns what was stored. change returns false
// to leave the record unchanged. fresh forces a read instead of trusting
// the cache. Calls are serialised within the replica: concurrent handlers
// of one replica would only defeat each other's compare-and-set.
func (n *Notifier) updateBudget(ctx context.Context, day string, fresh bool, change func(*BudgetRecord) bool) (*BudgetRecord, error) {
	n.budgetMu.Lock()
	defer n.budgetMu.Unlock()
	key := BudgetKey(day)
	for range maxCAS * 4 {
		var (
			b   *BudgetRecord
			rev uint64
		)
		if c := n.budgetCache; !fresh && c != nil && c.day == day {
			rec := c.rec
			b, rev = &rec, c.rev
		} else {
			kve, err := n.budget.Get(ctx, key)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				b = &BudgetRecord{Day: day}
			case err != nil:
				return nil, fmt.Errorf("notify: read budget %s: %w", key, err)
			default:
				if b, err = decodeBudget(kve.Value()); err != nil {
					// A record that cannot be read is not trusted to hold
					// slots: start the day's count again, loudly.
					n.cfg.Log.Error().Err(err).Str("key", key).Msg("unreadable budget record replaced")
					b = &BudgetRecord{Day: day}
				}
				rev = kve.Revision()
			}
			n.budgetCache = &budgetCache{day: day, rec: *b, rev: rev}
			fresh = false
		}
		b.Limit = n.cfg.DailyBudget
		// Counts only grow within a day, so "no change needed" on a stale
		// copy (full budget, digest already requested) is still true.
		if !change(b) {
			return b, nil
		}
		var err error
		if rev == 0 {
			rev, err = n.budget.Create(ctx, key, encodeBudget(b))
			if errors.Is(err, jetstream.ErrKeyExists) {
				n.budgetCache = nil
				continue
			}
		} else {
			rev, err = n.budget.Update(ctx, key, encodeBudget(b), rev)
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				n.budgetCache = nil
				continue
			}
		}
		if err != nil {
			n.budgetCache = nil
			return nil, fmt.Errorf("notify: write budget %s: %w", key, err)
		}
		n.budgetCache = &budgetCache{day: day, rec: *b, rev: rev}
		return b, nil
	}
	return nil, fmt.Errorf("notify: budget %s: too many concurrent updates", key)
}

// reserve takes one of the day's slots; ok is false when they are used up
// (notification.AdmitBudget decides).
func (n *Notifier) reserve(ctx context.Context, day string, a notification.Admission) (ok bool, b *BudgetRecord, err error) {
	b, err = n.updateBudget(ctx, day, false, func(b *BudgetRecord) bool {
		ok = notification.AdmitBudget(n.limits(), a, b.day()).Verdict == notification.Send
		if ok {
			b.Sent++
		}
		return ok
	})
	return ok, b, err
}

// countHeld counts one more dedupe key held back today, the request of at;
// the first such request's time is when the budget ran out (the digest's
// `at`, as simulate dates it).
func (n *Notifier) countHeld(ctx context.Context, day string, at time.Time) (*BudgetRecord, error) {
	return n.updateBudget(ctx, day, false, func(b *BudgetRecord) bool {
		b.Held++
		if b.ExhaustedAt.IsZero() {
			b.ExhaustedAt = at
		}
		return true
	})
}

// markDigest records that the day's digest request is on the bus.
func (n *Notifier) markDigest(ctx context.Context, day string) error {
	_, err := n.updateBudget(ctx, day, false, func(b *BudgetRecord) bool {
		if b.DigestRequested {
			return false
		}
		b.DigestRequested = true
		return true
	})
	return err
}

// readBudget reads the day's record from the bucket (zero counts when
// absent).
func (n *Notifier) readBudget(ctx context.Context, day string) (*BudgetRecord, error) {
	return n.updateBudget(ctx, day, true, func(*BudgetRecord) bool { return false })
}

// Budget returns the stored budget record of a UTC day, for operators and
// tests.
func (n *Notifier) Budget(ctx context.Context, day string) (*BudgetRecord, error) {
	return n.readBudget(ctx, day)
}

// digestRequest is the request that tells a human the day's budget is used
// up. It goes through the bus like any request (failbus.notify.normal),
// so it is deduplicated, retried and audited like the others; its dedupe
// key makes it once per day, and it bypasses the budget.
func digestRequest(b *BudgetRecord, service string) *events.Notification {
	n := notification.Digest(b.Limit, b.Day, b.Held, b.ExhaustedAt, topology.StreamNotify, events.AuditSubject(service, AuditHeld))
	return &n
}

// renderDigestText writes the digest's title and text from the budget
// record: how many were held back and why (notification.DigestText).
func renderDigestText(n *events.Notification, b *BudgetRecord, service string) {
	n.Title, n.Text = notification.DigestText(b.Limit, b.Day, b.Held, topology.StreamNotify, events.AuditSubject(service, AuditHeld))
}

// renderDigest refreshes a digest's count from the budget record just
// before it is sent, so it reports every request held until then. If the
// record cannot be read, the count from when the digest was requested
// stands.
func (n *Notifier) renderDigest(ctx context.Context, note *events.Notification) {
	day := note.Labels[digestDayLabel]
	if day == "" {
		return
	}
	b, err := n.readBudget(ctx, day)
	if err != nil || b.Held == 0 {
		return
	}
	renderDigestText(note, b, n.cfg.Service)
}

// publishDigest puts the day's digest request on the bus. Its Nats-Msg-Id
// is per day, and its dedupe key too, so replicas racing to publish it
// still deliver one.
func (n *Notifier) publishDigest(ctx context.Context, b *BudgetRecord) error {
	req := digestRequest(b, n.cfg.Service)
	if req.At.IsZero() {
		req.At = events.At(n.cfg.Now())
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return n.publish(ctx, events.NotifySubject(req.Severity), req, n.cfg.Service+":budget-digest:"+b.Day)
}
