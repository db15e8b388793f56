package report

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// chartReport folds outcomes of two providers, classified ok, into a
// report of the period [from, to): n of big at each time of bigAt, one of
// small at each time of smallAt.
func chartReport(t *testing.T, from, to time.Time, big int, bigAt, smallAt []time.Time) *Report {
	t.Helper()
	a := newAggregator(from, to)
	id := 0
	add := func(provider string, at time.Time) {
		id++
		c := &events.Classification{OutcomeID: "c" + strconv.Itoa(id), At: events.At(at), Provider: provider, Class: events.ClassOK}
		a.outcome(&events.Outcome{ID: c.OutcomeID, At: c.At, Provider: provider}, at)
		a.classification(c, at)
	}
	for _, at := range bigAt {
		for range big {
			add("openai", at)
		}
	}
	for _, at := range smallAt {
		add("tiny-gw", at)
	}
	return a.finish(to)
}

// svgOf returns the bar chart of provider on the page.
func svgOf(t *testing.T, page, provider string) string {
	t.Helper()
	i := strings.Index(page, `aria-label="`+provider+`: outcomes per`)
	if i < 0 {
		t.Fatalf("no bar chart for %s", provider)
	}
	start := strings.LastIndex(page[:i], "<svg")
	return page[start : i+strings.Index(page[i:], "</svg>")]
}

// TestEachProviderHasItsOwnScale: a provider with 21 outcomes beside one
// with 20,000 is drawn on a scale of its own, named on its axis, not as an
// empty chart on the big one's.
func TestEachProviderHasItsOwnScale(t *testing.T) {
	t.Parallel()
	to := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	from := to.Add(-time.Hour)
	var bigAt, smallAt []time.Time
	for m := range 60 {
		bigAt = append(bigAt, from.Add(time.Duration(m)*time.Minute))
		if m%3 == 0 {
			smallAt = append(smallAt, from.Add(time.Duration(m)*time.Minute))
		}
	}
	r := chartReport(t, from, to, 333, bigAt, smallAt[:20])
	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	topRe := regexp.MustCompile(`data-top="(\d+)"`)
	big, small := svgOf(t, page.String(), "openai"), svgOf(t, page.String(), "tiny-gw")
	bigTop, smallTop := topRe.FindStringSubmatch(big), topRe.FindStringSubmatch(small)
	if bigTop == nil || smallTop == nil || bigTop[1] != "2000" || smallTop[1] != "2" {
		t.Errorf("scales: openai %v, tiny-gw %v; want 2000 (333 × 5 a bar) and 2 (its own busiest bar)", bigTop, smallTop)
	}
	if !strings.Contains(small, ">tiny-gw per 5 min</text>") {
		t.Error("the small provider's axis does not say whose scale it is")
	}
	if strings.Contains(page.String(), "share one scale") {
		t.Error("the page still says every provider shares one scale")
	}
}

// TestTheTimeAxisSpansTheRecords: a day asked for whose records fill its
// last two minutes is drawn over those minutes, and the page says so.
func TestTheTimeAxisSpansTheRecords(t *testing.T) {
	t.Parallel()
	to := time.Date(2026, 3, 1, 12, 0, 30, 0, time.UTC)
	from := to.Add(-24 * time.Hour)
	at := []time.Time{to.Add(-110 * time.Second), to.Add(-50 * time.Second), to.Add(-5 * time.Second)}
	r := chartReport(t, from, to, 10, at, at)
	if r.BucketMS != time.Minute.Milliseconds() || len(r.Buckets) != 3 || !r.Buckets[0].Equal(time.Date(2026, 3, 1, 11, 58, 0, 0, time.UTC)) {
		t.Fatalf("axis: %d buckets of %d ms from %s; want 3 of a minute from 11:58", len(r.Buckets), r.BucketMS, r.Buckets[0])
	}
	if got := r.Providers["openai"].Series; got[0].OK != 10 || got[1].OK != 10 || got[2].OK != 10 {
		t.Errorf("series %+v, want 10 a minute", got)
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "the charts span the records, 11:58 – 12:01") {
		t.Error("the page does not say the axis spans the records")
	}
	// The whole period still counts: nothing is left out.
	if r.Totals.Outcomes != 33 || !r.From.Equal(from) || !r.To.Equal(to) {
		t.Errorf("totals %+v over %s–%s", r.Totals, r.From, r.To)
	}
}

// TestAnOutageLastsUntilItsRecovery: an outage whose recovery streak
// (degraded) took 2m30s of its 3m30s lasted 3m30s in the summary and the
// table, as the recovered record's reason says, rounded, not cut.
func TestAnOutageLastsUntilItsRecovery(t *testing.T) {
	t.Parallel()
	from := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	to := from.Add(time.Hour)
	a := newAggregator(from, to)
	down := from.Add(10 * time.Minute)
	for _, h := range []events.Health{
		{At: events.At(down), Provider: "anthropic", State: events.HealthOutage},
		{At: events.At(down.Add(time.Minute)), Provider: "anthropic", State: events.HealthDegraded, Reason: "recovering: first success"},
		{At: events.At(down.Add(3*time.Minute + 30*time.Second)), Provider: "anthropic", State: events.HealthRecovered, Reason: "3 successes over 2m30s; the outage lasted 3m30s"},
		{At: events.At(down.Add(20 * time.Minute)), Provider: "anthropic", State: events.HealthDegraded, Reason: "rate-limited on every profile"},
		{At: events.At(down.Add(21 * time.Minute)), Provider: "anthropic", State: events.HealthHealthy},
	} {
		a.healthRecord(&h, h.At.Time)
	}
	a.outcome(&events.Outcome{ID: "o1", At: events.At(down), Provider: "anthropic"}, down)
	r := a.finish(to)
	h := r.Health["anthropic"]
	if h.Outages != 1 || h.OutageMS != (3*time.Minute+30*time.Second).Milliseconds() || h.DegradedMS != time.Minute.Milliseconds() {
		t.Fatalf("health %+v: want one outage of 3m30s (its recovering included) and 1m degraded otherwise", h)
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), "anthropic was down once, 3m 30s in all") {
		t.Errorf("the summary does not give the outage's 3m 30s: %q", summary(r, nil))
	}
}

// TestDurationsAreRounded: to their last unit, never cut.
func TestDurationsAreRounded(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{44*time.Second + 600*time.Millisecond, "45s"},
		{59*time.Second + 700*time.Millisecond, "1m"},
		{3*time.Minute + 30*time.Second, "3m 30s"},
		{3*time.Minute + 59*time.Second + 600*time.Millisecond, "4m"},
		{12*time.Minute + 40*time.Second, "13m"},
		{59*time.Minute + 45*time.Second, "1h 00m"},
		{2*time.Hour + 4*time.Minute + 31*time.Second, "2h 05m"},
		{3*24*time.Hour + 4*time.Hour + 40*time.Minute, "3d 5h"},
	} {
		if got := humanDuration(c.d); got != c.want {
			t.Errorf("humanDuration(%s) = %q, want %q", c.d, got, c.want)
		}
	}
}
