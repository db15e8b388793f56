package notification

// Admission: which
// notification requests reach a human. People stop reading a channel that
// repeats itself and get hurt by one that goes quiet, so:
//
//  1. A dedupe key is sent once per lifetime: a key sent less than
//     DedupeLifetime ago is a duplicate; after that it notifies again.
//  2. At most DailyBudget non-critical (info, normal) notifications go out
//     per UTC day. A request over the budget is held back: not sent, and
//     not counted again when its key comes back the same day. On a later
//     day the key may go out again, within that day's budget.
//  3. The first request held back on a day asks for the day's digest: one
//     notification that bypasses the budget and says how many were held.
//  4. Critical notifications (and the digest) bypass the budget: the one
//     moment a human must act is never swallowed by it.
//
// The rules are split in two halves because the notifier reads the key's
// state and the day's budget at different moments of its delivery protocol
// (claim the key, then take a budget slot): AdmitKey is rules 1 and the
// "held already today" half of 2, AdmitBudget the budget and the digest.
// Admit applies both in order; the notifier (pkg/notify) and the engine
// that simulate runs (internal/engine) both decide with them, so they cannot
// disagree.

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/redact"
)

// DefaultDedupeLifetime is how long a sent dedupe key suppresses the same
// key unless configured otherwise (the notifier's --dedupe-lifetime, the
// dedupe bucket's TTL).
const DefaultDedupeLifetime = 7 * 24 * time.Hour

// Unlimited as Limits.DailyBudget turns the budget off. (The policy's
// daily_budget is always a number: 0 there means no non-critical
// notification at all.)
const Unlimited = -1

// The budget digest: its dedupe key is DigestKeyPrefix followed by the UTC
// day, and it carries the label DigestLabel=DigestLabelValue and the day in
// DigestDayLabel. Only a request with both is the digest, which bypasses
// the budget it reports on.
const (
	DigestKeyPrefix  = "failbus-notifier:budget-digest:"
	DigestLabel      = "failbus_digest"
	DigestLabelValue = "budget"
	DigestDayLabel   = "day"
)

// Limits are the numbers admission runs on.
type Limits struct {
	// DailyBudget caps non-critical notifications per UTC day; 0 sends
	// none, Unlimited turns the cap off.
	DailyBudget int
	// DedupeLifetime is how long a sent key suppresses the same key.
	// Defaults to DefaultDedupeLifetime when not positive.
	DedupeLifetime time.Duration
}

func (l Limits) lifetime() time.Duration {
	if l.DedupeLifetime <= 0 {
		return DefaultDedupeLifetime
	}
	return l.DedupeLifetime
}

// KeyState is what admission knows about a dedupe key's past.
type KeyState struct {
	// SentAt is when the key was last sent; zero when never (in its
	// current lifetime).
	SentAt time.Time
	// HeldDay is the UTC day the key was last held back on; "" when none.
	HeldDay string
}

// Day is one UTC day's budget record.
type Day struct {
	Day string
	// Sent counts budget slots taken that day; Held counts distinct keys
	// held back.
	Sent, Held int
	// DigestRequested is set once the day's digest was asked for.
	DigestRequested bool
}

// Verdict is admission's answer for one request.
type Verdict int

// Verdicts.
const (
	// Send: deliver it.
	Send Verdict = iota
	// Duplicate: the key was sent within its lifetime; nothing to do.
	Duplicate
	// Hold: over the day's budget; not sent.
	Hold
)

// String names the verdict for logs and tests.
func (v Verdict) String() string {
	switch v {
	case Send:
		return "send"
	case Duplicate:
		return "duplicate"
	case Hold:
		return "hold"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// Admission is the verdict with what the caller must record.
type Admission struct {
	Verdict Verdict
	// Budgeted: the request counts against the day's budget (a
	// non-critical request that is not the digest, with a budget in
	// force). A Send of a budgeted request takes one slot (Day.Sent+1).
	Budgeted bool
	// NewLifetime: the key was sent before, longer ago than its lifetime;
	// this send starts a new lifetime (a new idempotency key).
	NewLifetime bool
	// HeldAgain: a Hold of a key already held back today, which is not
	// counted again (Day.Held stays).
	HeldAgain bool
	// RequestDigest: the day's digest must be asked for now (the first
	// hold of the day, or a hold while it was not yet asked for).
	RequestDigest bool
	// Reason says why, for audit records and logs.
	Reason string
}

// Budgeted reports whether n counts against the daily budget under l.
func Budgeted(l Limits, n events.Notification) bool {
	return n.Severity != events.SeverityCritical && !IsDigest(n) && l.DailyBudget != Unlimited
}

// UTCDay is the budget day of t.
func UTCDay(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// AdmitKey applies the key's half of admission at now: a duplicate within
// the lifetime, a budgeted key already held back today (HeldAgain), or on
// to AdmitBudget (Verdict Send with NewLifetime when a lifetime ended).
func AdmitKey(l Limits, n events.Notification, key KeyState, now time.Time) Admission {
	a := Admission{Verdict: Send, Budgeted: Budgeted(l, n)}
	if !key.SentAt.IsZero() {
		if now.Sub(key.SentAt) < l.lifetime() {
			a.Verdict = Duplicate
			a.Reason = "already sent at " + key.SentAt.UTC().Format(time.RFC3339)
			return a
		}
		a.NewLifetime = true
	}
	if a.Budgeted && key.HeldDay != "" && key.HeldDay == UTCDay(now) {
		a.Verdict, a.HeldAgain = Hold, true
		a.Reason = "already held back today"
	}
	return a
}

// AdmitBudget applies the budget's half to an admission AdmitKey let
// through: a budgeted request takes one of the day's slots or is held
// back, and the first hold of the day asks for the digest.
func AdmitBudget(l Limits, a Admission, day Day) Admission {
	if a.Verdict == Hold && a.HeldAgain {
		a.RequestDigest = !day.DigestRequested
		return a
	}
	if a.Verdict != Send || !a.Budgeted {
		return a
	}
	if day.Sent < l.DailyBudget {
		return a
	}
	a.Verdict = Hold
	a.RequestDigest = !day.DigestRequested
	a.Reason = fmt.Sprintf("daily budget of %d non-critical notifications for %s (UTC) is used up", l.DailyBudget, day.Day)
	return a
}

// Admit is the whole admission of n at now: AdmitKey, then AdmitBudget on
// the day's record.
func Admit(l Limits, n events.Notification, key KeyState, day Day, now time.Time) Admission {
	return AdmitBudget(l, AdmitKey(l, n, key, now), day)
}

// IsDigest reports whether n is the budget digest, which the budget does
// not apply to.
func IsDigest(n events.Notification) bool {
	return strings.HasPrefix(n.DedupeKey, DigestKeyPrefix) && n.Labels[DigestLabel] == DigestLabelValue
}

// Digest is the request that tells a human the day's budget is used up,
// counting held requests held back by then and exhausted the time of the
// first. stream and heldAudit say where the held requests and their audit
// records are (the notifier's FAILBUS_NOTIFY and
// failbus.audit.<service>.held_by_budget). Its dedupe key makes it once per
// day; it bypasses the budget.
func Digest(limit int, day string, held int, exhausted time.Time, stream, heldAudit string) events.Notification {
	n := events.Notification{
		DedupeKey: DigestKeyPrefix + day,
		Severity:  events.SeverityNormal,
		Labels:    map[string]string{DigestLabel: DigestLabelValue, DigestDayLabel: day},
		At:        events.At(exhausted),
	}
	n.Title, n.Text = DigestText(limit, day, held, stream, heldAudit)
	return n
}

// DigestText words the digest: how many were held back and why.
func DigestText(limit int, day string, held int, stream, heldAudit string) (title, text string) {
	title = "Notification budget used up for " + day + " (UTC)"
	count := strconv.Itoa(held) + " non-critical notifications have"
	if held == 1 {
		count = "1 non-critical notification has"
	}
	text = fmt.Sprintf("The daily budget of %d non-critical notifications for %s (UTC) is used up, "+
		"so %s been held back so far, and more will be until 00:00 UTC. Critical notifications still go out. "+
		"Each held-back request stays on the %s stream with an audit record on %s. "+
		"Raise notify.daily_budget in the policy to let more through.",
		limit, day, count, stream, heldAudit)
	return title, text
}

// Redacted is n as it may leave the process (secrets in error bodies
// are redacted before a notification leaves): its dedupe key,
// title, text and label values through redact.String. The notifier sends
// this copy; simulate writes it.
func Redacted(n events.Notification) events.Notification {
	out := n
	out.DedupeKey = redact.String(n.DedupeKey)
	out.Title = redact.String(n.Title)
	out.Text = redact.String(n.Text)
	if len(n.Labels) > 0 {
		out.Labels = make(map[string]string, len(n.Labels))
		for k, v := range n.Labels {
			out.Labels[k] = redact.String(v)
		}
	}
	return out
}
