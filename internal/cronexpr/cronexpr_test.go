package cronexpr_test

import (
	"testing"
	"time"

	"github.com/failbus/failbus/internal/cronexpr"
)

func TestCronScheduleNext(t *testing.T) {
	berlin, err := cronexpr.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v.UTC()
	}
	cases := []struct {
		name     string
		schedule string
		loc      *time.Location
		after    string
		anchor   string
		want     string
	}{
		{"every 5 minutes", "*/5 * * * *", nil, "2026-03-01T10:02:00Z", "", "2026-03-01T10:05:00Z"},
		{"strictly after a scheduled time", "*/5 * * * *", nil, "2026-03-01T10:05:00Z", "", "2026-03-01T10:10:00Z"},
		{"09:00 Berlin in winter is 08:00 UTC", "0 9 * * *", berlin, "2026-03-01T00:00:00Z", "", "2026-03-01T08:00:00Z"},
		{"09:00 Berlin in summer is 07:00 UTC", "0 9 * * *", berlin, "2026-07-01T00:00:00Z", "", "2026-07-01T07:00:00Z"},
		{"weekdays only", "0 9 * * 1-5", nil, "2026-02-28T10:00:00Z", "", "2026-03-02T09:00:00Z"}, // Sat → Mon
		{"descriptor", "@hourly", nil, "2026-03-01T10:02:00Z", "", "2026-03-01T11:00:00Z"},
		{"@every counts from its anchor", "@every 90m", nil, "2026-03-01T10:02:00Z", "2026-03-01T07:15:00Z", "2026-03-01T10:15:00Z"},
		{"@every before its anchor is the anchor", "@every 90m", nil, "2026-03-01T05:00:00Z", "2026-03-01T07:15:00Z", "2026-03-01T07:15:00Z"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := cronexpr.Parse(c.schedule)
			if err != nil {
				t.Fatal(err)
			}
			var anchor time.Time
			if c.anchor != "" {
				anchor = utc(c.anchor)
			}
			if got := s.Next(utc(c.after), c.loc, anchor); !got.Equal(utc(c.want)) {
				t.Fatalf("Next = %s, want %s", got, c.want)
			}
		})
	}
}

// FuzzCronSchedule: no schedule string may panic the parser (it is run on
// agent input inside every service), and what parses has a next time that
// lies after its start.
func FuzzCronSchedule(f *testing.F) {
	for _, s := range []string{"* * * * *", "*/5 1-3 * jan mon", "@every 1h", "TZ=", "CRON_TZ=x", "@", "0 0 31 2 *", "1-70/0 * * * *", "@every -1s", "- * * * *", "0/ * * * *"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		s, err := cronexpr.Parse(expr)
		if err != nil {
			return
		}
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		if n := s.Next(start, nil, start); !n.IsZero() && !n.After(start) {
			t.Fatalf("Next(%s) = %s, not after", expr, n)
		}
	})
}
