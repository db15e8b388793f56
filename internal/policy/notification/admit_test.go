package notification

import (
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

func TestAdmit(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	today, yesterday := "2026-05-04", "2026-05-03"
	normal := events.Notification{DedupeKey: "k", Severity: events.SeverityNormal}
	critical := events.Notification{DedupeKey: "k", Severity: events.SeverityCritical}
	digest := Digest(2, today, 1, now, "S", "A")
	l := Limits{DailyBudget: 2, DedupeLifetime: time.Hour}
	tests := []struct {
		name  string
		lim   Limits
		n     events.Notification
		key   KeyState
		day   Day
		want  Verdict
		check func(t *testing.T, a Admission)
	}{
		{"a new key within the budget is sent and takes a slot", l, normal, KeyState{}, Day{Day: today, Sent: 1}, Send,
			func(t *testing.T, a Admission) {
				if !a.Budgeted || a.NewLifetime {
					t.Errorf("%+v: want budgeted, same lifetime", a)
				}
			}},
		{"a key sent within its lifetime is a duplicate", l, normal, KeyState{SentAt: now.Add(-59 * time.Minute)}, Day{Day: today}, Duplicate, nil},
		{"a critical key sent within its lifetime is a duplicate too", l, critical, KeyState{SentAt: now.Add(-time.Minute)}, Day{Day: today}, Duplicate, nil},
		{"a key sent longer ago than its lifetime notifies again", l, normal, KeyState{SentAt: now.Add(-time.Hour)}, Day{Day: today}, Send,
			func(t *testing.T, a Admission) {
				if !a.NewLifetime {
					t.Errorf("%+v: want a new lifetime", a)
				}
			}},
		{"over the budget: held, and the first hold asks for the digest", l, normal, KeyState{}, Day{Day: today, Sent: 2}, Hold,
			func(t *testing.T, a Admission) {
				if !a.RequestDigest || a.HeldAgain {
					t.Errorf("%+v: want the digest asked for, a new hold", a)
				}
			}},
		{"a later hold of the day does not ask again", l, normal, KeyState{}, Day{Day: today, Sent: 2, Held: 1, DigestRequested: true}, Hold,
			func(t *testing.T, a Admission) {
				if a.RequestDigest {
					t.Errorf("%+v: the digest was asked for already", a)
				}
			}},
		{"a key held today is held again, not counted again", l, normal, KeyState{HeldDay: today}, Day{Day: today, Sent: 0, Held: 1, DigestRequested: true}, Hold,
			func(t *testing.T, a Admission) {
				if !a.HeldAgain {
					t.Errorf("%+v: want held again", a)
				}
			}},
		{"a key held yesterday goes out today within the budget", l, normal, KeyState{HeldDay: yesterday}, Day{Day: today}, Send, nil},
		{"critical bypasses a used-up budget", l, critical, KeyState{}, Day{Day: today, Sent: 2}, Send,
			func(t *testing.T, a Admission) {
				if a.Budgeted {
					t.Errorf("%+v: critical is not budgeted", a)
				}
			}},
		{"the digest bypasses the budget it reports on", l, digest, KeyState{}, Day{Day: today, Sent: 2}, Send, nil},
		{"a budget of 0 holds every non-critical request", Limits{DailyBudget: 0}, normal, KeyState{}, Day{Day: today}, Hold, nil},
		{"Unlimited never holds", Limits{DailyBudget: Unlimited}, normal, KeyState{}, Day{Day: today, Sent: 1000}, Send, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			a := Admit(tt.lim, tt.n, tt.key, tt.day, now)
			if a.Verdict != tt.want {
				t.Fatalf("verdict %s (%+v), want %s", a.Verdict, a, tt.want)
			}
			if tt.check != nil {
				tt.check(t, a)
			}
		})
	}
}

func TestDigestIsRecognisedOnlyWithItsLabel(t *testing.T) {
	t.Parallel()
	d := Digest(20, "2026-05-04", 3, time.Time{}, "FAILBUS_NOTIFY", "failbus.audit.notifier.held_by_budget")
	if !IsDigest(d) || d.Severity != events.SeverityNormal {
		t.Fatalf("%+v is not a normal digest", d)
	}
	forged := events.Notification{DedupeKey: d.DedupeKey, Severity: events.SeverityNormal}
	if IsDigest(forged) {
		t.Fatal("a request with the digest's key but not its label bypassed the budget")
	}
}
