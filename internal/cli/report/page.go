package report

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// WriteHTML writes the report as one self-contained page: inline CSS and
// SVG, no script, no font or image from elsewhere, readable offline. Every
// number on it carries data-k, the JSON path (an array of keys) of the
// figure it shows in --json, so a test (or a reader) can check one against
// the other.
func WriteHTML(w io.Writer, r *Report) error {
	names := slices.Sorted(maps.Keys(r.Providers))
	healthNames := slices.Sorted(maps.Keys(r.Health))
	order := stackOrder(r)
	present := map[string]bool{}
	for _, p := range r.Providers {
		for _, b := range p.Series {
			if b.OK > 0 {
				present[events.ClassOK] = true
			}
			if b.Unclassified > 0 {
				present[unclassified] = true
			}
			for c, n := range b.Classes {
				if n > 0 {
					present[c] = true
				}
			}
		}
	}
	var legend []string
	for _, c := range order {
		if present[c] {
			legend = append(legend, c)
		}
	}
	var steady []string // providers with outcomes and no health change
	for _, n := range names {
		if r.Health[n] == nil {
			steady = append(steady, n)
		}
	}
	d := pageData{
		R: r, Names: names, HealthNames: healthNames, Steady: steady, Legend: legend,
		Period: periodText(r), Bucket: bucketLabel(r.BucketMS), Summary: summary(r, names), Axis: axisText(r),
	}
	for _, n := range names {
		d.Bars = append(d.Bars, template.HTML(barsSVG(r, n, r.Providers[n], order)))
	}
	if len(healthNames) > 0 {
		d.HealthChart = template.HTML(healthSVG(r, healthNames))
	}
	d.RetryChart = template.HTML(hbarsSVG("retries", []hbar{
		{"scheduled", k("retries", "scheduled"), "#ff7f0e", r.Retries.Scheduled},
		{"came due", k("retries", "due"), "#6baed6", r.Retries.Due},
		{"started by agents", k("retries", "started"), "#2ca02c", r.Retries.Started},
		{"cancelled by agents", k("retries", "cancelled"), "#bdbdbd", r.Retries.Cancelled},
		{"given up", k("retries", "given_up"), "#d62728", r.Retries.GivenUp},
	}))
	n := r.Notifications
	d.NotifyChart = template.HTML(hbarsSVG("notifications", []hbar{
		{"requested", k("totals", "notification_requests"), "#9ecae1", r.Totals.Notifications},
		{"sent (deliveries)", k("notifications", "sent"), "#2ca02c", n.Sent},
		{"held by the budget", k("notifications", "held"), "#f0ad4e", n.Held},
		{"deduplicated", k("notifications", "deduped"), "#bdbdbd", n.Deduped},
		{"failed attempts", k("notifications", "failed"), "#d62728", n.Failed},
		{"no sink takes it", k("notifications", "unrouted"), "#7f7f7f", n.Unrouted},
	}))
	return page.Execute(w, d)
}

type pageData struct {
	R           *Report
	Names       []string
	HealthNames []string
	// Steady are the providers with outcomes and no health record in or
	// before the period: healthy throughout (the classifier publishes a
	// state when it changes).
	Steady []string
	Legend []string
	Period string
	// Axis says what the time axis spans when it is less than the period.
	Axis        string
	Bucket      string
	Summary     []string
	Bars        []template.HTML
	HealthChart template.HTML
	RetryChart  template.HTML
	NotifyChart template.HTML
}

// k is the data-k of a figure: its JSON path as a JSON array of keys.
func k(path ...any) string {
	b, _ := json.Marshal(path)
	return string(b)
}

// decisionText is a decision in a few words: "retry 2 after 2.3s",
// "give_up", "–" for none.
func decisionText(d *events.Decision) string {
	if d == nil {
		return "–"
	}
	if d.Action == events.ActionRetry {
		delay := time.Duration(d.DelayMS) * time.Millisecond
		text := humanDuration(delay)
		if delay < time.Minute {
			text = delay.Round(100 * time.Millisecond).String()
		}
		return fmt.Sprintf("retry %d after %s", d.Retry, text)
	}
	return d.Action
}

// num formats a count for people: 12345 → "12,345".
func num(n int) string {
	s := strconv.Itoa(n)
	if n < 0 {
		return "-" + num(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func periodText(r *Report) string {
	from, to := r.From.UTC(), r.To.UTC()
	return fmt.Sprintf("%s – %s UTC (%s)", from.Format("2006-01-02 15:04"), to.Format("2006-01-02 15:04"), humanDuration(to.Sub(from)))
}

// axisText says what the charts' time axis spans when the records cover
// less than the period ("" when it is the period).
func axisText(r *Report) string {
	if len(r.Buckets) == 0 {
		return ""
	}
	from := r.Buckets[0].Time
	to := r.Buckets[len(r.Buckets)-1].Add(time.Duration(r.BucketMS) * time.Millisecond)
	if !from.After(r.From.Time) && !to.Before(r.To.Time) {
		return ""
	}
	layout := "15:04"
	if to.Sub(from) >= 24*time.Hour || from.UTC().YearDay() != to.UTC().YearDay() {
		layout = "Jan 02 15:04"
	}
	return fmt.Sprintf("the charts span the records, %s – %s", from.UTC().Format(layout), to.UTC().Format(layout))
}

// summary is the period in a few sentences.
func summary(r *Report, names []string) []string {
	var out []string
	t := r.Totals
	if t.Outcomes == 0 && t.Classifications == 0 {
		return []string{"No LLM call outcomes were recorded in this period."}
	}
	failPct := ""
	if c := t.OK + t.Failures; c > 0 {
		failPct = fmt.Sprintf(" (%.1f%% of the classified)", 100*float64(t.Failures)/float64(c))
	}
	out = append(out, fmt.Sprintf("%s outcomes from %d provider(s); %s failed%s.", num(t.Outcomes), len(names), num(t.Failures), failPct))
	for _, p := range slices.Sorted(maps.Keys(r.Health)) {
		h := r.Health[p]
		if h.Outages > 0 {
			times := "once"
			if h.Outages > 1 {
				times = strconv.Itoa(h.Outages) + " times"
			}
			out = append(out, fmt.Sprintf("%s was down %s, %s in all (from each outage to its recovery, the recovering included).", p, times, humanDuration(time.Duration(h.OutageMS)*time.Millisecond)))
		}
	}
	rt := r.Retries
	out = append(out, fmt.Sprintf("%s retries scheduled, %s came due, %s given up.", num(rt.Scheduled), num(rt.Due), num(rt.GivenUp)))
	if len(r.Overruled) > 0 {
		n := 0
		for _, o := range r.Overruled {
			n += o.Count
		}
		out = append(out, fmt.Sprintf("%s classification(s) overruled a heuristic's claim.", num(n)))
	}
	if r.Refusals.Refused > 0 {
		out = append(out, fmt.Sprintf("%s content refusal(s) in %s segment(s); %s skipped a provider, %s frozen.",
			num(r.Refusals.Refused), num(r.Refusals.Segments), num(r.Refusals.Skipped), num(r.Refusals.Frozen)))
	}
	nf := r.Notifications
	out = append(out, fmt.Sprintf("%s notification(s) sent, %s held by the daily budget, %s deduplicated.", num(nf.Sent), num(nf.Held), num(nf.Deduped)))
	if r.DeadLetters.Total > 0 {
		out = append(out, fmt.Sprintf("%s dead letter(s).", num(r.DeadLetters.Total)))
	}
	if len(r.Recoveries) > 0 {
		out = append(out, fmt.Sprintf("%d recovery run(s).", len(r.Recoveries)))
	}
	return out
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"k":     k,
	"num":   num,
	"color": colorOf,
	"state": func(s string) string { return stateColors[s] },
	"when":  func(t events.Time) string { return t.UTC().Format("Jan 02 15:04:05") },
	"dur": func(a, b events.Time) string {
		if a.IsZero() || b.IsZero() {
			return "–"
		}
		return humanDuration(b.Sub(a.Time))
	},
	"ms":   func(v int64) string { return humanDuration(time.Duration(v) * time.Millisecond) },
	"join": strings.Join,
	"list": func(s ...string) []string { return s },
	"sortedKeys": func(m map[string]int) []string {
		return slices.Sorted(maps.Keys(m))
	},
	"byCount": func(m map[string]int) []string {
		keys := slices.Sorted(maps.Keys(m))
		slices.SortStableFunc(keys, func(a, b string) int { return m[b] - m[a] })
		return keys
	},
	"shadowProviders": func(s *Shadow) []string { return slices.Sorted(maps.Keys(s.ByProvider)) },
	"decision":        decisionText,
	"nonHealthy": func(h *Health) []Span {
		var out []Span
		for _, s := range h.Spans {
			if s.State != events.HealthHealthy {
				out = append(out, s)
			}
		}
		return out
	},
}).Parse(pageTemplate))

const pageTemplate = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>failbus report · {{.Period}}</title>
<style>
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: #1d232a; background: #f6f7f9; margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 24px; margin: 0 0 2px; }
h2 { font-size: 18px; margin: 34px 0 6px; padding-top: 10px; border-top: 1px solid #dde1e6; }
h3 { font-size: 14px; margin: 16px 0 2px; }
p.sub, p.note { color: #56606b; margin: 2px 0 10px; }
nav { margin: 10px 0 0; font-size: 13px; }
nav a { color: #245ea8; margin-right: 12px; text-decoration: none; }
ul.summary { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; padding: 12px 12px 12px 30px; margin: 14px 0; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 10px 0; }
.card { background: #fff; border: 1px solid #dde1e6; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card .v { font-size: 22px; font-weight: 600; }
.card .l { color: #56606b; font-size: 12px; }
table { border-collapse: collapse; background: #fff; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #dde1e6; padding: 4px 9px; text-align: left; vertical-align: top; white-space: nowrap; }
td.wrap { white-space: normal; min-width: 220px; }
th { background: #eef1f4; font-weight: 600; white-space: normal; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 16px; margin: 6px 0 4px; font-size: 13px; }
.sw { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 5px; vertical-align: -1px; border: 1px solid rgba(0,0,0,.15); }
svg.chart { width: 100%; height: auto; background: #fff; border: 1px solid #dde1e6; border-radius: 6px; display: block; margin: 4px 0 2px; }
svg.small { max-width: 700px; border: none; background: transparent; }
svg .axis { stroke: #3c4650; stroke-width: 1; }
svg .tick { stroke: #3c4650; }
svg .grid { stroke: #e3e7eb; stroke-width: 1; }
svg .lbl { font-size: 12px; fill: #3c4650; }
svg .lbl.date { fill: #7a848e; font-size: 11px; }
svg .ttl { font-size: 12px; fill: #56606b; }
svg .val { font-size: 12px; fill: #1d232a; }
svg .nodata { fill: #f0f0f0; }
.empty { color: #56606b; font-style: italic; background: #fff; border: 1px dashed #c9ced4; border-radius: 6px; padding: 10px 14px; margin: 8px 0; }
code { font-size: 12px; background: #eef1f4; padding: 0 3px; border-radius: 3px; }
.prov { margin-top: 14px; }
</style>
</head>
<body>
<main>
<h1>failbus report</h1>
<p class="sub">{{.Period}} · generated {{when .R.GeneratedAt}} UTC · one bar per {{.Bucket}}{{with .Axis}} · {{.}}{{end}}</p>
<nav><a href="#outcomes">Outcomes</a><a href="#health">Health</a><a href="#retries">Retries</a><a href="#overruled">Overruled</a><a href="#refusals">Refusals</a><a href="#notifications">Notifications</a><a href="#deadletters">Dead letters</a><a href="#recoveries">Recoveries</a><a href="#policy">Policy</a>{{if .R.Shadow}}<a href="#shadow">Under another policy</a>{{end}}</nav>
<ul class="summary">{{range .Summary}}<li>{{.}}</li>{{end}}</ul>
{{with .R.Notes}}<p class="note">{{range .}}{{.}}. {{end}}</p>{{end}}
{{with .R.Undecodable}}<p class="note">Left out: {{range $s, $n := .}}<span data-k='{{k "undecodable" $s}}'>{{num $n}}</span> message(s) on {{$s}} {{end}}that are not the records their subjects carry (junk the services dead-lettered, see Dead letters).</p>{{end}}
{{if .R.Outside}}<p class="note"><span data-k='{{k "dated_outside"}}'>{{num .R.Outside}}</span> record(s) are dated outside the period (their own time, by agents' clocks); they are counted, and drawn in the first or last bar.</p>{{end}}

<div class="cards">
<div class="card"><div class="v" data-k='{{k "totals" "outcomes"}}'>{{num .R.Totals.Outcomes}}</div><div class="l">outcomes</div></div>
<div class="card"><div class="v" data-k='{{k "totals" "ok"}}'>{{num .R.Totals.OK}}</div><div class="l">ok</div></div>
<div class="card"><div class="v" data-k='{{k "totals" "failures"}}'>{{num .R.Totals.Failures}}</div><div class="l">failures</div></div>
<div class="card"><div class="v" data-k='{{k "totals" "decisions"}}'>{{num .R.Totals.Decisions}}</div><div class="l">decisions</div></div>
<div class="card"><div class="v" data-k='{{k "totals" "dead_letters"}}'>{{num .R.Totals.DeadLetters}}</div><div class="l">dead letters</div></div>
<div class="card"><div class="v" data-k='{{k "totals" "health_changes"}}'>{{num .R.Totals.HealthChanges}}</div><div class="l">health changes</div></div>
</div>

<h2 id="outcomes">Outcomes and failure classes per provider</h2>
<p class="sub">Each bar is one time bucket of one provider: its outcomes stacked by what the classifier made of them. Each provider has a scale of its own (its axis gives the counts), so a provider with a few outcomes reads as well as one with thousands; compare providers by their counts, not their heights. Hover a bar segment for its time and count.</p>
{{if .Names}}
<div class="legend">{{range .Legend}}<span><span class="sw" style="background:{{color .}}"></span>{{.}}</span>{{end}}</div>
{{range $i, $name := .Names}}{{$p := index $.R.Providers $name}}
<div class="prov">
<h3>{{$name}} — <span data-k='{{k "providers" $name "outcomes"}}'>{{num $p.Outcomes}}</span> outcomes, <span data-k='{{k "providers" $name "ok"}}'>{{num $p.OK}}</span> ok, <span data-k='{{k "providers" $name "failures"}}'>{{num $p.Failures}}</span> failed{{if $p.Unclassified}}, <span data-k='{{k "providers" $name "unclassified"}}'>{{num $p.Unclassified}}</span> not classified{{end}}</h3>
{{index $.Bars $i}}
</div>
{{end}}
<h3>Failures by class</h3>
<table><tr><th>class</th>{{range .Names}}<th class="n">{{.}}</th>{{end}}<th class="n">all</th></tr>
{{range $c := byCount .R.Classes}}{{if ne $c "ok"}}<tr><td><span class="sw" style="background:{{color $c}}"></span>{{$c}}</td>{{range $name := $.Names}}{{$p := index $.R.Providers $name}}<td class="n" data-k='{{k "providers" $name "classes" $c}}'>{{num (index $p.Classes $c)}}</td>{{end}}<td class="n" data-k='{{k "classes" $c}}'>{{num (index $.R.Classes $c)}}</td></tr>{{end}}{{end}}
</table>
{{else}}<div class="empty">Nothing in this period: no outcomes or classifications were stored.</div>{{end}}

<h2 id="health">Provider health and outages</h2>
<p class="sub">The state the classifier published for each provider, over the period.</p>
{{if .HealthNames}}
<div class="legend">{{range $s := (list "healthy" "degraded" "outage" "recovered")}}<span><span class="sw" style="background:{{state $s}}"></span>{{$s}}</span>{{end}}<span><span class="sw" style="background:#f0f0f0;outline:1px solid #c9ced4"></span>before the period</span></div>
{{.HealthChart}}
<table><tr><th>provider</th><th>state</th><th>from (UTC)</th><th>to (UTC)</th><th>for</th><th>reason</th></tr>
{{range $name := .HealthNames}}{{range (nonHealthy (index $.R.Health $name))}}<tr><td>{{$name}}</td><td><span class="sw" style="background:{{state .State}}"></span>{{.State}}</td><td>{{when .From}}</td><td>{{when .To}}</td><td>{{dur .From .To}}</td><td class="wrap">{{.Reason}}</td></tr>{{end}}{{end}}
</table>
<table><tr><th>provider</th><th class="n">outages</th><th class="n">down (outage to recovery)</th><th class="n">degraded otherwise</th></tr>
{{range $name := .HealthNames}}{{$h := index $.R.Health $name}}<tr><td>{{$name}}</td><td class="n" data-k='{{k "health" $name "outages"}}'>{{num $h.Outages}}</td><td class="n">{{ms $h.OutageMS}}</td><td class="n">{{ms $h.DegradedMS}}</td></tr>{{end}}
</table>
{{else}}<div class="empty">Nothing in this period: no provider changed its health state.</div>{{end}}
{{if .Steady}}<p class="sub steady">Healthy throughout (no health change published): {{join .Steady ", "}}.</p>{{end}}

<h2 id="retries">Retries</h2>
<p class="sub">Retries the scheduler decided (each a durable delayed message), those that came due, the agents' answers, and the failures it gave up on.</p>
{{if or .R.Retries.Scheduled .R.Retries.Due .R.Retries.GivenUp}}
{{.RetryChart}}
<table><tr><th>provider</th><th class="n">scheduled</th><th class="n">given up</th></tr>
{{range $name, $p := .R.Retries.ByProvider}}<tr><td>{{$name}}</td><td class="n" data-k='{{k "retries" "by_provider" $name "scheduled"}}'>{{num $p.Scheduled}}</td><td class="n" data-k='{{k "retries" "by_provider" $name "given_up"}}'>{{num $p.GivenUp}}</td></tr>{{end}}
</table>
<h3>Decisions by action</h3>
<table><tr><th>action</th><th class="n">decisions</th></tr>
{{range $a := byCount .R.Decisions}}<tr><td>{{$a}}</td><td class="n" data-k='{{k "decisions" $a}}'>{{num (index $.R.Decisions $a)}}</td></tr>{{end}}
</table>
{{else}}<div class="empty">Nothing in this period: no retry was scheduled, came due or was given up.</div>{{end}}

<h2 id="overruled">Overruled classifications</h2>
<p class="sub">Where a heuristic or an upstream library's code claimed a class and harder evidence rejected it (an empty 400 from a gateway is not a context overflow when the request is far below the window).</p>
{{if .R.Overruled}}
<table><tr><th>provider</th><th>claimed</th><th>decided</th><th>rule</th><th class="n">times</th><th>evidence (first)</th><th>outcomes</th></tr>
{{range $i, $o := .R.Overruled}}<tr><td>{{$o.Provider}}</td><td><span class="sw" style="background:{{color $o.Claimed}}"></span>{{$o.Claimed}}</td><td><span class="sw" style="background:{{color $o.Class}}"></span>{{$o.Class}}</td><td><code>{{$o.Rule}}</code></td><td class="n" data-k='{{k "overruled" $i "count"}}'>{{num $o.Count}}</td><td class="wrap">{{join $o.Evidence "; "}}</td><td class="wrap">{{join $o.Examples ", "}}</td></tr>{{end}}
</table>
{{else}}<div class="empty">Nothing in this period: no classification overruled a claim.</div>{{end}}

<h2 id="refusals">Refusal tiers</h2>
<p class="sub">Content refusals, per (segment, provider): re-rendered increments, providers skipped for a segment, and segments frozen (no re-probe left until a boundary).</p>
{{if .R.Refusals.Refused}}
<div class="cards">
<div class="card"><div class="v" data-k='{{k "refusals" "refused"}}'>{{num .R.Refusals.Refused}}</div><div class="l">refusals</div></div>
<div class="card"><div class="v" data-k='{{k "refusals" "segments"}}'>{{num .R.Refusals.Segments}}</div><div class="l">segments refused</div></div>
<div class="card"><div class="v" data-k='{{k "refusals" "rerendered"}}'>{{num .R.Refusals.Rerendered}}</div><div class="l">re-rendered</div></div>
<div class="card"><div class="v" data-k='{{k "refusals" "skipped"}}'>{{num .R.Refusals.Skipped}}</div><div class="l">segments skipped</div></div>
<div class="card"><div class="v" data-k='{{k "refusals" "frozen"}}'>{{num .R.Refusals.Frozen}}</div><div class="l">segments frozen</div></div>
</div>
<table><tr><th>provider</th><th class="n">refusals</th><th class="n">segments</th><th class="n">re-rendered</th><th class="n">skipped</th><th class="n">frozen</th></tr>
{{range $name, $p := .R.Refusals.ByProvider}}<tr><td>{{$name}}</td><td class="n" data-k='{{k "refusals" "by_provider" $name "refused"}}'>{{num $p.Refused}}</td><td class="n" data-k='{{k "refusals" "by_provider" $name "segments"}}'>{{num $p.Segments}}</td><td class="n" data-k='{{k "refusals" "by_provider" $name "rerendered"}}'>{{num $p.Rerendered}}</td><td class="n" data-k='{{k "refusals" "by_provider" $name "skipped"}}'>{{num $p.Skipped}}</td><td class="n" data-k='{{k "refusals" "by_provider" $name "frozen"}}'>{{num $p.Frozen}}</td></tr>{{end}}
</table>
{{else}}<div class="empty">Nothing in this period: no content was refused.</div>{{end}}

<h2 id="notifications">Notifications</h2>
<p class="sub">Requests to tell a human, and what the notifier did with them: deliveries to sinks, requests held back by the daily budget (critical ones always go out), repeats of a dedupe key, failed attempts.</p>
{{if or .R.Totals.Notifications .R.Notifications.Sent .R.Notifications.Held .R.Notifications.Deduped .R.Notifications.Failed .R.Notifications.Unrouted}}
{{.NotifyChart}}
<table><tr><th>severity</th><th class="n">requested</th><th class="n">sent</th><th class="n">held</th><th class="n">deduplicated</th><th class="n">failed</th><th class="n">unrouted</th></tr>
{{range $s := (list "critical" "normal" "info")}}{{$x := index $.R.Notifications.BySeverity $s}}{{$req := index $.R.Notifications.Requested $s}}{{if or $x $req}}<tr><td>{{$s}}</td><td class="n" data-k='{{k "notifications" "requested" $s}}'>{{num $req}}</td>{{if $x}}<td class="n" data-k='{{k "notifications" "by_severity" $s "sent"}}'>{{num $x.Sent}}</td><td class="n" data-k='{{k "notifications" "by_severity" $s "held"}}'>{{num $x.Held}}</td><td class="n" data-k='{{k "notifications" "by_severity" $s "deduped"}}'>{{num $x.Deduped}}</td><td class="n" data-k='{{k "notifications" "by_severity" $s "failed"}}'>{{num $x.Failed}}</td><td class="n" data-k='{{k "notifications" "by_severity" $s "unrouted"}}'>{{num $x.Unrouted}}</td>{{else}}<td class="n">0</td><td class="n">0</td><td class="n">0</td><td class="n">0</td><td class="n">0</td>{{end}}</tr>{{end}}{{end}}
</table>
{{if .R.Notifications.FailedFinal}}<p class="note"><span data-k='{{k "notifications" "failed_final"}}'>{{num .R.Notifications.FailedFinal}}</span> request(s) failed for good and went to the dead letters.</p>{{end}}
{{else}}<div class="empty">Nothing in this period: no notification was requested.</div>{{end}}

<h2 id="deadletters">Dead letters</h2>
<p class="sub">Input a service could not use, kept with the reason and the original bytes (<code>failbus dlq ls</code>, <code>show</code>, <code>requeue</code>).</p>
{{if .R.DeadLetters.Total}}
<div class="cards">{{range $s := byCount .R.DeadLetters.ByService}}<div class="card"><div class="v" data-k='{{k "dead_letters" "by_service" $s}}'>{{num (index $.R.DeadLetters.ByService $s)}}</div><div class="l">{{$s}}</div></div>{{end}}</div>
<table><tr><th>service</th><th>reason</th><th class="n">count</th></tr>
{{range $i, $x := .R.DeadLetters.ByReason}}<tr><td>{{$x.Service}}</td><td class="wrap">{{$x.Reason}}</td><td class="n" data-k='{{k "dead_letters" "by_reason" $i "count"}}'>{{num $x.Count}}</td></tr>{{end}}
</table>
{{else}}<div class="empty">Nothing in this period: no dead letters.</div>{{end}}

<h2 id="recoveries">Recovery runs</h2>
<p class="sub">The post-outage checklist per outage: the steps recorded, and what each did.</p>
{{if .R.Recoveries}}
<table><tr><th>provider</th><th>outage from (UTC)</th><th>recovered (UTC)</th><th>outage</th><th>steps</th><th>done</th><th class="n">killed</th><th class="n">crons re-run</th><th class="n">crons missed</th><th class="n">writes to check</th><th class="n">re-dispatched</th><th class="n">released</th></tr>
{{range $i, $x := .R.Recoveries}}<tr><td>{{$x.Provider}}</td><td>{{when $x.OutageStartedAt}}</td><td>{{when $x.RecoveredAt}}</td><td>{{dur $x.OutageStartedAt $x.RecoveredAt}}</td><td class="wrap">{{join $x.Steps " → "}}</td><td>{{if $x.Done}}yes{{else}}not yet{{end}}</td><td class="n" data-k='{{k "recoveries" $i "killed"}}'>{{num $x.Killed}}</td><td class="n" data-k='{{k "recoveries" $i "crons_rerun"}}'>{{num $x.CronsRerun}}</td><td class="n" data-k='{{k "recoveries" $i "crons_missed"}}'>{{num $x.CronsMissed}}</td><td class="n" data-k='{{k "recoveries" $i "writes"}}'>{{num $x.Writes}}</td><td class="n" data-k='{{k "recoveries" $i "redispatched"}}'>{{num $x.Redispatched}}</td><td class="n" data-k='{{k "recoveries" $i "released"}}'>{{num $x.Released}}</td></tr>{{end}}
</table>
{{else}}<div class="empty">Nothing in this period: no recovery ran.</div>{{end}}

<h2 id="policy">Policy changes</h2>
<p class="sub">The scheduler's policy, as it changed (from the policy file or KV): retry budgets counted after a change carry its new policy key.</p>
{{if .R.PolicyChanges}}
<table><tr><th>at (UTC)</th><th>change</th><th>source</th><th>policy key</th><th>error</th></tr>
{{range .R.PolicyChanges}}<tr><td>{{when .At}}</td><td>{{.Kind}}</td><td><code>{{.Source}}</code></td><td><code>{{.PolicyKey}}</code></td><td class="wrap">{{.Error}}</td></tr>{{end}}
</table>
{{else}}<div class="empty">Nothing in this period: the scheduler's policy did not change.</div>{{end}}
{{with .R.Shadow}}{{$s := .}}
<h2 id="shadow">Under another policy</h2>
<p class="sub">The period's outcomes and boundaries replayed through the decision engine twice, at their recorded times on in-memory stores, under <code>{{.Base}}</code> (base) and <code>{{.Policy}}</code>, as <code>failbus shadow</code> does over the same range (retry budgets opened before the period start again from zero). Nothing was published.</p>
<div class="cards"><div class="card"><div class="v" data-k='{{k "shadow" "outcomes"}}'>{{num .Outcomes}}</div><div class="l">outcomes replayed</div></div><div class="card"><div class="v" data-k='{{k "shadow" "differ"}}'>{{num .Differ}}</div><div class="l">decided differently</div></div></div>
{{if .Differ}}
<table><tr><th>provider</th>{{range $c := byCount .Changes}}<th class="n">{{$c}}</th>{{end}}</tr>
{{range $p := shadowProviders .}}<tr><td>{{$p}}</td>{{range $c := byCount $s.Changes}}{{with index (index $s.ByProvider $p) $c}}<td class="n" data-k='{{k "shadow" "by_provider" $p $c}}'>{{num .}}</td>{{else}}<td class="n">0</td>{{end}}{{end}}</tr>{{end}}
<tr><td><b>all</b></td>{{range $c := byCount .Changes}}<td class="n" data-k='{{k "shadow" "changes" $c}}'>{{num (index $s.Changes $c)}}</td>{{end}}</tr>
</table>
<p class="note">The first {{len .Examples}} of {{num .Differ}} (<code>failbus shadow</code> lists every one):</p>
<table><tr><th>outcome</th><th>at (UTC)</th><th>provider</th><th>agent</th><th>class</th><th>{{.Base}}</th><th>{{.Policy}}</th></tr>
{{range .Examples}}<tr><td><code>{{.OutcomeID}}</code></td><td>{{when .At}}</td><td>{{.Provider}}</td><td>{{.Agent}}</td><td>{{.Class}}{{if .NewClass}} → {{.NewClass}}{{end}}</td><td>{{decision .Base}}</td><td>{{decision .New}}</td></tr>{{end}}
</table>
{{else}}<div class="empty">Nothing in this period: {{.Policy}} decides every outcome as {{.Base}} does.</div>{{end}}
{{end}}
</main>
</body>
</html>
`
