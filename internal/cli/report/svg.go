package report

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Colours of the classes: one hue family per kind of cause (network blues,
// rate and quota oranges, provider-side reds, the request's own faults in
// browns, indigo, teal and olive, content magenta), distinct within a
// family, so a reader tells a rate limit from an outage at a glance. Green
// is ok's alone: a failure drawn green reads as a success
// (TestClassColoursSeparate).
var classColors = map[string]string{
	events.ClassOK:               "#b7dfb0",
	events.ClassTransport:        "#1f77b4",
	events.ClassTimeout:          "#6baed6",
	events.ClassTLS:              "#08306b",
	events.ClassDNS:              "#9ecae1",
	events.ClassRateLimit:        "#ff7f0e",
	events.ClassQuotaExhausted:   "#a63603",
	events.ClassOverloaded:       "#d62728",
	events.ClassServerError:      "#8c1d1d",
	events.ClassEmptyResponse:    "#f4a6a6",
	events.ClassAuth:             "#8c564b",
	events.ClassBadRequest:       "#5254a3",
	events.ClassUnsupportedParam: "#17becf",
	events.ClassModelNotFound:    "#8c6d31",
	events.ClassContextOverflow:  "#bcbd22",
	events.ClassContentRefusal:   "#e377c2",
	events.ClassInvariant:        "#9467bd",
	events.ClassUnknown:          "#7f7f7f",
	unclassified:                 "#d9d9d9",
}

// unclassified is the series of outcomes without a classification.
const unclassified = "unclassified"

// colorOf is the colour of a class; a class this build does not know gets
// a stable grey-blue.
func colorOf(class string) string {
	if c, ok := classColors[class]; ok {
		return c
	}
	return "#5f7a8a"
}

// Colours of the health states.
var stateColors = map[string]string{
	events.HealthHealthy:   "#b7dfb0",
	events.HealthDegraded:  "#f0ad4e",
	events.HealthOutage:    "#d62728",
	events.HealthRecovered: "#6baed6",
}

// chart geometry, in SVG user units (the SVG scales to its box).
const (
	chartW     = 1100.0
	marginL    = 64.0
	marginR    = 16.0
	marginT    = 12.0
	marginB    = 46.0
	plotW      = chartW - marginL - marginR
	barsPlotH  = 150.0
	laneH      = 26.0
	laneGap    = 8.0
	labelFont  = 12
	maxXLabels = 12
)

// niceMax rounds v up to 1, 2, 2.5 or 5 × 10^k, and returns it with the
// tick step that divides it into at most 5 steps.
func niceMax(v int) (top, step int) {
	if v <= 0 {
		return 1, 1
	}
	for mag := 1; ; mag *= 10 {
		for _, m := range []int{1, 2, 5} {
			s := m * mag
			if v <= s*5 {
				top = (v + s - 1) / s * s
				return top, s
			}
		}
	}
}

// bucketLabel says how long one bucket is, for axis titles: "hour",
// "15 min", "day".
func bucketLabel(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d == time.Hour:
		return "hour"
	case d == 24*time.Hour:
		return "day"
	case d == 7*24*time.Hour:
		return "week"
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d.Minutes()))
	}
	return fmt.Sprintf("%d h", int(d.Hours()))
}

// timeAxis draws the x axis under a plot of height h that starts at y0:
// ticks with UTC clock times (and the date where the day changes) at
// bucket boundaries, and the axis title.
func timeAxis(b *strings.Builder, buckets []events.Time, bucketMS int64, y0, h float64) {
	n := len(buckets)
	xOf := func(i int) float64 { return marginL + plotW*float64(i)/float64(n) }
	yAxis := y0 + h
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="axis"/>`, marginL, yAxis, marginL+plotW, yAxis)
	step := max(1, (n+maxXLabels-1)/maxXLabels)
	bucket := time.Duration(bucketMS) * time.Millisecond
	// Ticks on round clock times (every 3 h: 00:00, 03:00, …, so midnight
	// gets one): start at the first bucket aligned to the tick spacing.
	first := 0
	for i := range min(step, n) {
		if since := buckets[i].Sub(buckets[i].Truncate(24 * time.Hour)); since%(bucket*time.Duration(step)) == 0 {
			first = i
			break
		}
	}
	lastDay := ""
	withDate := bucket >= 24*time.Hour
	for i := first; i <= n; i += step {
		var t time.Time
		if i < n {
			t = buckets[i].Time
		} else {
			t = buckets[n-1].Add(bucket)
		}
		x := xOf(i)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="tick"/>`, x, yAxis, x, yAxis+5)
		label := t.UTC().Format("15:04")
		day := t.UTC().Format("Jan 02")
		if withDate {
			label = day
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" class="lbl">%s</text>`, x, yAxis+18, label)
		if !withDate && day != lastDay {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" class="lbl date">%s</text>`, x, yAxis+31, day)
			lastDay = day
		}
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" class="ttl">time (UTC), one bar per %s</text>`, marginL+plotW, yAxis+42, bucketLabel(bucketMS))
}

// stackOrder is the order series stack in, bottom up: ok, the failure
// classes most frequent first, unclassified on top.
func stackOrder(r *Report) []string {
	var classes []string
	for c := range r.Classes {
		if c != events.ClassOK {
			classes = append(classes, c)
		}
	}
	slices.SortFunc(classes, func(a, b string) int {
		if d := r.Classes[b] - r.Classes[a]; d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	out := []string{events.ClassOK}
	out = append(out, classes...)
	return append(out, unclassified)
}

// barsSVG draws one provider's outcomes per bucket, stacked by class, on
// a y scale of its own (niceMax of its highest bar), labelled on the
// axis: a provider with 21 outcomes beside one with 20,000 would be an
// empty chart on theirs. data-top holds the scale's top.
func barsSVG(r *Report, name string, p *Provider, order []string) string {
	highest := 0
	for _, bk := range p.Series {
		highest = max(highest, bk.Total())
	}
	top, step := niceMax(highest)
	var b strings.Builder
	h := marginT + barsPlotH + marginB
	fmt.Fprintf(&b, `<svg viewBox="0 0 %.0f %.0f" role="img" aria-label="%s: outcomes per %s by class, on its own scale (0 to %d)" class="chart" data-top="%d">`,
		chartW, h, html.EscapeString(name), bucketLabel(r.BucketMS), top, top)
	yOf := func(v int) float64 { return marginT + barsPlotH - barsPlotH*float64(v)/float64(top) }
	for v := 0; v <= top; v += step {
		y := yOf(v)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="grid"/>`, marginL, y, marginL+plotW, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" class="lbl">%d</text>`, marginL-6, y+4, v)
	}
	fmt.Fprintf(&b, `<text transform="translate(14 %.1f) rotate(-90)" text-anchor="middle" class="ttl">%s per %s</text>`,
		marginT+barsPlotH/2, html.EscapeString(name), bucketLabel(r.BucketMS))
	n := len(r.Buckets)
	slot := plotW / float64(n)
	barW := math.Max(1, slot*0.8)
	bucket := time.Duration(r.BucketMS) * time.Millisecond
	for i, bk := range p.Series {
		x := marginL + slot*float64(i) + (slot-barW)/2
		base := 0
		when := r.Buckets[i].UTC().Format("Jan 02 15:04") + "–" + r.Buckets[i].Add(bucket).UTC().Format("15:04")
		for _, class := range order {
			v, key := 0, ""
			switch class {
			case events.ClassOK:
				v, key = bk.OK, k("providers", name, "series", i, "ok")
			case unclassified:
				v, key = bk.Unclassified, k("providers", name, "series", i, "unclassified")
			default:
				v, key = bk.Classes[class], k("providers", name, "series", i, "classes", class)
			}
			if v == 0 {
				continue
			}
			y1, y0 := yOf(base+v), yOf(base)
			fmt.Fprintf(&b, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s" data-k="%s" data-v="%d"><title>%s: %d %s</title></rect>`,
				x, y1, barW, y0-y1, colorOf(class), html.EscapeString(key), v, when, v, class)
			base += v
		}
	}
	timeAxis(&b, r.Buckets, r.BucketMS, marginT, barsPlotH)
	b.WriteString(`</svg>`)
	return b.String()
}

// healthSVG draws one lane per provider, coloured by health state, on the
// period's time axis.
func healthSVG(r *Report, names []string) string {
	var b strings.Builder
	// Each lane has its provider's name above it, whole: the left margin
	// (kept the bar charts' so the time axes line up) holds 9 characters,
	// and "azure-openai-eu" and "azure-openai-us" must not both read
	// "azure-op…".
	const labelRow = 16.0
	lanesH := float64(len(names))*(labelRow+laneH+laneGap) - laneGap
	h := marginT + lanesH + marginB
	fmt.Fprintf(&b, `<svg viewBox="0 0 %.0f %.0f" role="img" aria-label="provider health over the period" class="chart">`, chartW, h)
	from, to := r.From.Time, r.To.Time
	// The axis covers the buckets, which start at a round time at or
	// before From.
	axisFrom := r.Buckets[0].Time
	axisTo := r.Buckets[len(r.Buckets)-1].Add(time.Duration(r.BucketMS) * time.Millisecond)
	xOf := func(t time.Time) float64 {
		return marginL + plotW*float64(t.Sub(axisFrom))/float64(axisTo.Sub(axisFrom))
	}
	for li, name := range names {
		top := marginT + float64(li)*(labelRow+laneH+laneGap)
		y := top + labelRow
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="lbl">%s</text>`, marginL, top+labelFont, html.EscapeString(name))
		if w := xOf(from) - marginL; w > 0 {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" class="nodata"><title>before the period</title></rect>`,
				marginL, y, w, laneH)
		}
		for _, s := range r.Health[name].Spans {
			// The axis spans the records: a span reaching beyond it is
			// drawn to its edge.
			x0 := max(xOf(s.From.Time), marginL)
			x1 := min(xOf(s.To.Time), marginL+plotW)
			if x1 <= x0 && !s.From.Equal(s.To.Time) {
				continue // entirely off the axis
			}
			title := fmt.Sprintf("%s: %s from %s to %s (%s)", name, s.State, s.From.UTC().Format("Jan 02 15:04"), s.To.UTC().Format("Jan 02 15:04"), humanDuration(s.To.Sub(s.From.Time)))
			if s.Reason != "" {
				title += " — " + s.Reason
			}
			fmt.Fprintf(&b, `<rect x="%.2f" y="%.1f" width="%.2f" height="%.1f" fill="%s"><title>%s</title></rect>`,
				x0, y, math.Max(x1-x0, 0.5), laneH, stateColors[s.State], html.EscapeString(title))
		}
		_ = to
	}
	timeAxis(&b, r.Buckets, r.BucketMS, marginT, lanesH)
	b.WriteString(`</svg>`)
	return b.String()
}

// hbarsSVG draws labelled horizontal bars for a few figures (retries,
// notifications), each tagged with its JSON path.
type hbar struct {
	label, key, color string
	v                 int
}

func hbarsSVG(aria string, bars []hbar) string {
	var b strings.Builder
	const rowH, gap, labelW, valueW = 22.0, 6.0, 150.0, 60.0
	w := 700.0
	h := float64(len(bars))*(rowH+gap) + 4
	fmt.Fprintf(&b, `<svg viewBox="0 0 %.0f %.0f" role="img" aria-label="%s" class="chart small">`, w, h, html.EscapeString(aria))
	top := 1
	for _, bar := range bars {
		top = max(top, bar.v)
	}
	span := w - labelW - valueW - 10
	for i, bar := range bars {
		y := float64(i) * (rowH + gap)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" class="lbl">%s</text>`, labelW-8, y+rowH/2+4, html.EscapeString(bar.label))
		bw := span * float64(bar.v) / float64(top)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.2f" height="%.1f" fill="%s" data-k="%s" data-v="%d"><title>%s: %d</title></rect>`,
			labelW, y, bw, rowH, bar.color, html.EscapeString(bar.key), bar.v, html.EscapeString(bar.label), bar.v)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="val" data-k="%s">%d</text>`, labelW+bw+6, y+rowH/2+4, html.EscapeString(bar.key), bar.v)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// humanDuration is "45s", "3m 30s", "12m", "2h 05m", "3d 4h": rounded to
// its last unit, never cut (3m 59s is not "3m"), to the second below ten
// minutes, so it reads like the durations health reasons give.
func humanDuration(d time.Duration) string {
	switch {
	case d < time.Minute-time.Second/2:
		return strconv.Itoa(int(d.Round(time.Second).Seconds())) + "s"
	case d < 10*time.Minute-time.Second/2:
		d = d.Round(time.Second)
		if s := int(d.Seconds()) % 60; s != 0 {
			return fmt.Sprintf("%dm %02ds", int(d.Minutes()), s)
		}
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < time.Hour-time.Minute/2:
		return strconv.Itoa(int(d.Round(time.Minute).Minutes())) + "m"
	case d < 48*time.Hour-time.Minute/2:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	d = d.Round(time.Hour)
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}
