package report

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/delivery"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/pkg/events"
)

// seeder publishes records as the services would and keeps, beside, the
// figures a report of them must show: what was published, counted as it
// was published.
type seeder struct {
	t    *testing.T
	ctx  context.Context
	js   jetstream.JetStream
	n    int
	from time.Time // start of the seeded day

	want Report
}

func newSeeder(t *testing.T, ctx context.Context, js jetstream.JetStream, from time.Time) *seeder {
	s := &seeder{t: t, ctx: ctx, js: js, from: from}
	s.want = Report{
		Providers: map[string]*Provider{}, Classes: map[string]int{}, Decisions: map[string]int{},
		Retries:       Retries{ByProvider: map[string]*ProviderRetries{}},
		Refusals:      Refusals{ByProvider: map[string]*ProviderRefusals{}},
		Notifications: Notifications{Requested: map[string]int{}, BySeverity: map[string]*SeverityNotifications{}},
		DeadLetters:   DeadLetters{ByService: map[string]int{}},
	}
	return s
}

func (s *seeder) pub(subject string, m events.Message) {
	s.t.Helper()
	data, hdr, err := events.Encode(m)
	if err != nil {
		s.t.Fatal(err)
	}
	s.n++
	hdr.Set(nats.MsgIdHdr, fmt.Sprintf("seed-%d", s.n))
	if _, err := s.js.PublishMsg(s.ctx, &nats.Msg{Subject: subject, Header: hdr, Data: data}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *seeder) provider(name string) *Provider {
	p := s.want.Providers[name]
	if p == nil {
		p = &Provider{Classes: map[string]int{}, Series: make([]Bucket, 24)} // the hours of records
		s.want.Providers[name] = p
	}
	return p
}

// call publishes one outcome at hour h + minute m of the day and, unless
// class is "", its classification; it returns the outcome id.
func (s *seeder) call(provider string, h, m int, class, overruled string) string {
	at := events.At(s.from.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute))
	id := fmt.Sprintf("%s-%02d-%02d-%d", provider, h, m, s.n)
	s.pub(events.OutcomeSubject(provider, "bot"), &events.Outcome{ID: id, At: at, Agent: "bot", Provider: provider, Status: 500})
	p := s.provider(provider)
	p.Outcomes++
	s.want.Totals.Outcomes++
	if class == "" {
		p.Unclassified++
		p.Series[h].Unclassified++
		return id
	}
	c := &events.Classification{OutcomeID: id, At: at, Agent: "bot", Provider: provider, Class: class, Rule: "seed." + class,
		Overruled: overruled, Session: "s-" + id, Segment: 1}
	if overruled != "" {
		c.Evidence = []string{"request_tokens 1200 far below context_window 128000"}
	}
	s.classify(c, h)
	return id
}

func (s *seeder) classify(c *events.Classification, h int) {
	s.pub(events.ClassifiedSubject(c.Provider, c.Class), c)
	p := s.provider(c.Provider)
	s.want.Totals.Classifications++
	s.want.Classes[c.Class]++
	if c.Class == events.ClassOK {
		s.want.Totals.OK++
		p.OK++
		p.Series[h].OK++
		return
	}
	s.want.Totals.Failures++
	p.Failures++
	p.Classes[c.Class]++
	if p.Series[h].Classes == nil {
		p.Series[h].Classes = map[string]int{}
	}
	p.Series[h].Classes[c.Class]++
}

func (s *seeder) decide(id, provider, action string, dueAt time.Time) {
	d := &events.Decision{OutcomeID: id, Agent: "bot", Action: action, Provider: provider}
	if !dueAt.IsZero() {
		d.DueAt = events.At(dueAt)
	}
	if action == events.ActionRetry {
		d.RetryID, d.Retry, d.DelayMS = "r-"+id, 1, 1000
	}
	s.pub(events.DecisionSubject("bot"), d)
	s.want.Totals.Decisions++
	s.want.Decisions[action]++
	pr := s.want.Retries.ByProvider[provider]
	if pr == nil && (action == events.ActionRetry || action == events.ActionGiveUp) {
		pr = &ProviderRetries{}
		s.want.Retries.ByProvider[provider] = pr
	}
	switch action {
	case events.ActionRetry:
		s.want.Retries.Scheduled++
		pr.Scheduled++
	case events.ActionGiveUp:
		s.want.Retries.GivenUp++
		pr.GivenUp++
	}
}

func (s *seeder) refusals(provider string) *ProviderRefusals {
	p := s.want.Refusals.ByProvider[provider]
	if p == nil {
		p = &ProviderRefusals{}
		s.want.Refusals.ByProvider[provider] = p
	}
	return p
}

// refuse publishes a content refusal of segment by provider and the
// refusal tiers' decision.
func (s *seeder) refuse(provider, session string, h int, action string, nextProbe time.Duration) {
	at := s.from.Add(time.Duration(h) * time.Hour)
	id := fmt.Sprintf("ref-%d", s.n)
	s.pub(events.OutcomeSubject(provider, "bot"), &events.Outcome{ID: id, At: events.At(at), Agent: "bot", Provider: provider, OK: false, Status: 200, StopReason: "refusal"})
	s.provider(provider).Outcomes++
	s.want.Totals.Outcomes++
	s.classify(&events.Classification{OutcomeID: id, At: events.At(at), Agent: "bot", Provider: provider, Class: events.ClassContentRefusal,
		Rule: "seed.refusal", Session: session, Segment: 1}, h)
	s.want.Refusals.Refused++
	s.refusals(provider).Refused++
	var due time.Time
	if nextProbe > 0 {
		due = at.Add(nextProbe)
	}
	s.decide(id, provider, action, due)
	if action == events.ActionRerender {
		s.want.Refusals.Rerendered++
		s.refusals(provider).Rerendered++
	}
}

func (s *seeder) health(provider, state string, at time.Time) {
	s.pub(events.HealthSubject(provider), &events.Health{At: events.At(at), Provider: provider, State: state, Reason: "seeded " + state})
	s.want.Totals.HealthChanges++
}

func (s *seeder) notification(severity string) {
	s.pub(events.NotifySubject(severity), &events.Notification{DedupeKey: fmt.Sprintf("k-%d", s.n), Severity: severity, Title: "t"})
	s.want.Totals.Notifications++
	s.want.Notifications.Requested[severity]++
}

func (s *seeder) audit(kind, severity string) {
	s.pub(events.AuditSubject("notifier", kind), &delivery.Audit{At: events.At(s.from), Kind: kind, DedupeKey: fmt.Sprintf("k-%d", s.n), Severity: severity, Request: "req"})
	sv := s.want.Notifications.BySeverity[severity]
	if sv == nil {
		sv = &SeverityNotifications{}
		s.want.Notifications.BySeverity[severity] = sv
	}
	switch kind {
	case delivery.AuditSent:
		s.want.Notifications.Sent++
		sv.Sent++
	case delivery.AuditHeld:
		s.want.Notifications.Held++
		sv.Held++
	case delivery.AuditDeduped:
		s.want.Notifications.Deduped++
		sv.Deduped++
	}
}

func (s *seeder) deadLetter(service, reason string) {
	s.pub(events.DLQSubject(service), &events.DeadLetter{At: events.At(s.from), Service: service, Reason: reason, Subject: "failbus.outcome.x.y", Data: []byte("junk")})
	s.want.Totals.DeadLetters++
	s.want.DeadLetters.Total++
	s.want.DeadLetters.ByService[service]++
}

// seedDay publishes a day of traffic: three providers, an outage of one,
// overruled classifications, refusals up to freezing, notifications past
// the budget, dead letters, a recovery run and a policy change.
func (s *seeder) seedDay() {
	for h := range 24 {
		for m := range 10 {
			class := events.ClassOK
			switch {
			case m == 8 || m == 9:
				class = events.ClassRateLimit
			case m == 7 && h%3 == 0:
				class = events.ClassServerError
			}
			if h == 23 && m < 2 {
				class = "" // not classified (yet)
			}
			id := s.call("openai", h, m*6, class, "")
			switch class {
			case events.ClassRateLimit, events.ClassServerError:
				s.decide(id, "openai", events.ActionRetry, time.Time{})
			}
		}
		for m := range 5 {
			class := events.ClassOK
			if h >= 10 && h < 13 {
				class = events.ClassTransport // the outage
			} else if m == 4 && h%4 == 0 {
				class = events.ClassOverloaded
			}
			id := s.call("anthropic", h, m*12, class, "")
			switch class {
			case events.ClassTransport:
				s.decide(id, "anthropic", events.ActionWaitProvider, time.Time{})
			case events.ClassOverloaded:
				s.decide(id, "anthropic", events.ActionRetry, time.Time{})
			}
		}
		for m := range 3 {
			if m == 2 && h%6 == 0 {
				id := s.call("my-gateway", h, m*20, events.ClassBadRequest, events.ClassContextOverflow)
				s.decide(id, "my-gateway", events.ActionGiveUp, time.Time{})
				continue
			}
			s.call("my-gateway", h, m*20, events.ClassOK, "")
		}
	}
	s.want.Overruled = []Overruled{{Provider: "my-gateway", Claimed: events.ClassContextOverflow, Class: events.ClassBadRequest,
		Rule: "seed.bad_request", Count: 4, Evidence: []string{"request_tokens 1200 far below context_window 128000"}}}

	// Retries that came due, and the agents' answers in the ledger.
	for i := range 30 {
		s.pub(events.RetryDueSubject("bot"), &events.RetryDue{RetryID: fmt.Sprintf("r-due-%d", i), OutcomeID: "o", Agent: "bot", Retry: 1, DueAt: events.At(s.from)})
		s.want.Retries.Due++
	}
	for i := range 12 {
		e := &scheduler.LedgerEntry{Record: retry.Record{RetryID: fmt.Sprintf("r-%d", i), OutcomeID: "o", Agent: "bot", Provider: "openai", PolicyKey: "k", Retry: 1}}
		s.pub(events.RetryLedgerSubject("b1"), e) // the record
		if i < 9 {
			e.StartedAt = events.At(s.from)
			s.want.Retries.Started++
		} else {
			e.CancelledAt = events.At(s.from)
			s.want.Retries.Cancelled++
		}
		s.pub(events.RetryLedgerSubject("b1"), e) // and the mark
	}

	// The outage of anthropic, 10:00 to 13:00.
	at := func(h, m int) time.Time { return s.from.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute) }
	s.health("anthropic", events.HealthDegraded, at(9, 30))
	s.health("anthropic", events.HealthOutage, at(10, 0))
	s.health("anthropic", events.HealthRecovered, at(13, 0))
	s.health("anthropic", events.HealthHealthy, at(13, 30))

	// Refusals: one segment re-rendered then skipped with a re-probe due,
	// one refused until frozen, one on another provider.
	s.refuse("openai", "seg-a", 2, events.ActionRerender, 0)
	s.refuse("openai", "seg-a", 2, events.ActionSkipProvider, 15*time.Minute)
	for i, next := range []time.Duration{15 * time.Minute, time.Hour, 6 * time.Hour, 0} {
		s.refuse("openai", "seg-b", 5+i, events.ActionSkipProvider, next)
	}
	s.refuse("anthropic", "seg-c", 15, events.ActionSkipProvider, 15*time.Minute)
	s.want.Refusals.Segments, s.want.Refusals.Skipped, s.want.Refusals.Frozen = 3, 3, 1
	s.refusals("openai").Segments, s.refusals("openai").Skipped, s.refusals("openai").Frozen = 2, 2, 1
	s.refusals("anthropic").Segments, s.refusals("anthropic").Skipped = 1, 1

	// Notifications past a budget of 20: 30 normal and 2 critical
	// requested, 20 normal and both critical sent, 10 held, 3 repeats.
	for range 30 {
		s.notification(events.SeverityNormal)
	}
	for range 2 {
		s.notification(events.SeverityCritical)
	}
	for range 20 {
		s.audit(delivery.AuditSent, events.SeverityNormal)
	}
	for range 2 {
		s.audit(delivery.AuditSent, events.SeverityCritical)
	}
	for range 10 {
		s.audit(delivery.AuditHeld, events.SeverityNormal)
	}
	for range 3 {
		s.audit(delivery.AuditDeduped, events.SeverityNormal)
	}

	// Dead letters.
	for range 4 {
		s.deadLetter("classifier", `decode outcome: invalid outcome: field "agent": required`)
	}
	s.deadLetter("notifier", "sink ops after 4 attempt(s): 502 relay unreachable")
	s.want.DeadLetters.ByReason = []ReasonCount{
		{Service: "classifier", Reason: `decode outcome: invalid outcome: field "agent": required`, Count: 4},
		{Service: "notifier", Reason: "sink ops after 4 attempt(s): 502 relay unreachable", Count: 1},
	}

	// The recovery run after the outage.
	rid := fmt.Sprintf("anthropic:%d", at(10, 0).UnixMilli())
	rec := func(step string, done bool, fill func(*events.Recovery)) {
		r := &events.Recovery{RecoveryID: rid, At: events.At(at(13, 1)), Provider: "anthropic",
			OutageStartedAt: events.At(at(10, 0)), RecoveredAt: events.At(at(13, 0)), Step: step, Done: done}
		if fill != nil {
			fill(r)
		}
		s.pub(events.RecoverySubject("anthropic"), r)
		s.want.Totals.RecoveryRecords++
	}
	rec("confirm", false, nil)
	rec("kill", false, func(r *events.Recovery) {
		r.Killed = []events.SubagentRef{{Agent: "bot", Subagent: "a"}, {Agent: "bot", Subagent: "b"}}
	})
	rec("crons", false, func(r *events.Recovery) {
		r.CronsRerun = []events.CronRef{{Agent: "bot", Cron: "digest"}}
		r.CronsMissed = []events.CronRef{{Agent: "bot", Cron: "digest", Why: "outside the catch-up window"}}
	})
	rec("release", true, func(r *events.Recovery) { r.Released = 5 })
	s.want.Recoveries = []Recovery{{ID: rid, Provider: "anthropic", OutageStartedAt: events.At(at(10, 0)), RecoveredAt: events.At(at(13, 0)),
		Steps: []string{"confirm", "kill", "crons", "release"}, Done: true, LastAt: events.At(at(13, 1)),
		Killed: 2, CronsRerun: 1, CronsMissed: 1, Released: 5}}

	// A policy change.
	s.pub(scheduler.PolicyAuditSubject(), &scheduler.PolicyAudit{At: events.At(at(8, 0)), Kind: scheduler.PolicyApplied, Source: "kv FAILBUS_POLICY/active", Revision: 1, PolicyKey: "p1"})
	s.want.PolicyChanges = []PolicyChange{{At: events.At(at(8, 0)), Kind: scheduler.PolicyApplied, Source: "kv FAILBUS_POLICY/active", PolicyKey: "p1"}}
}

// TestReportOfASeededDay: a day of traffic published as the services would
// publish it → the report's JSON equals what was published, figure by
// figure, and every number on the page equals the JSON.
func TestReportOfASeededDay(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, 2*time.Minute)
	now := time.Now().UTC()
	from := now.Add(-24 * time.Hour).Truncate(time.Hour)
	s := newSeeder(t, b.Ctx, b.JS, from)
	s.seedDay()
	// The 25th hour holds now: from is now−24h cut to the hour, so now is
	// within [from+24h, from+25h). (now + 1 minute crossed into a 26th
	// hour when the test ran in the last minute of an hour.)
	to := from.Add(25 * time.Hour)

	r, err := Collect(b.Ctx, b.JS, Options{From: from, To: to})
	if err != nil {
		t.Fatal(err)
	}
	w := s.want
	// The axis spans the 24 hours of records, not the 25th hour of the
	// period, which holds none.
	if r.BucketMS != time.Hour.Milliseconds() || len(r.Buckets) != 24 || !r.Buckets[0].Equal(from) {
		t.Fatalf("buckets: %d of %d ms from %s; want 24 hourly from %s", len(r.Buckets), r.BucketMS, r.Buckets[0], from)
	}
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			g, _ := json.Marshal(got)
			x, _ := json.Marshal(want)
			t.Errorf("%s:\n got  %s\n want %s", what, g, x)
		}
	}
	check("totals", r.Totals, w.Totals)
	check("classes", r.Classes, w.Classes)
	for name, p := range w.Providers {
		check("provider "+name, r.Providers[name], p)
	}
	check("providers", len(r.Providers), len(w.Providers))
	check("decisions", r.Decisions, w.Decisions)
	check("retries", r.Retries, w.Retries)
	overruled := slices.Clone(r.Overruled)
	for i := range overruled {
		if len(overruled[i].Examples) != 3 {
			t.Errorf("overruled %+v: want three examples", overruled[i])
		}
		overruled[i].Examples = nil // the ids are the seeder's; their count is checked
	}
	check("overruled", overruled, w.Overruled)
	check("refusals", r.Refusals, w.Refusals)
	check("notifications", r.Notifications, w.Notifications)
	check("dead letters", r.DeadLetters, w.DeadLetters)
	check("recoveries", r.Recoveries, w.Recoveries)
	check("policy changes", r.PolicyChanges, w.PolicyChanges)
	check("undecodable", r.Undecodable, map[string]int{})
	check("dated outside", r.Outside, 0)

	h := r.Health["anthropic"]
	if h == nil || h.Outages != 1 || h.OutageMS != (3*time.Hour).Milliseconds() || h.DegradedMS != (30*time.Minute).Milliseconds() {
		t.Fatalf("anthropic health %+v: want one outage of 3h, 30m degraded", h)
	}
	states := []string{}
	for _, sp := range h.Spans {
		states = append(states, sp.State)
	}
	check("anthropic spans", states, []string{"healthy", "degraded", "outage", "recovered", "healthy"})
	if !h.Spans[2].From.Equal(from.Add(10*time.Hour)) || !h.Spans[2].To.Equal(from.Add(13*time.Hour)) || !h.Spans[4].To.Equal(to) {
		t.Errorf("outage span %+v, last %+v", h.Spans[2], h.Spans[4])
	}

	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	n := checkPage(t, page.String(), r)
	if n < 100 {
		t.Errorf("only %d numbers on the page carry their JSON path", n)
	}
	// Providers that never changed health are named, not left out.
	if !strings.Contains(page.String(), "Healthy throughout (no health change published): my-gateway, openai.") {
		t.Error("the page does not say that my-gateway and openai were healthy throughout")
	}
	for _, want := range []string{"anthropic", "outage", "context_overflow", "seed.bad_request", "held by the budget", "sink ops after 4 attempt(s)", "confirm → kill → crons → release", "kv FAILBUS_POLICY/active"} {
		if !strings.Contains(page.String(), html.EscapeString(want)) {
			t.Errorf("the page does not show %q", want)
		}
	}
	for _, external := range []string{"<script", "http://", "https://", "url(", "@import", "<link", "<img", "<iframe"} {
		if strings.Contains(page.String(), external) {
			t.Errorf("the page holds %q: it must be self-contained", external)
		}
	}
	if strings.Contains(page.String(), "Nothing in this period") {
		t.Error("a section of a full day says it is empty")
	}
	if out := os.Getenv("FAILBUS_REPORT_HTML"); out != "" { // to look at the page: see the package README
		if err := os.WriteFile(out, page.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReportOfAnEmptyPeriod: every section says there is nothing, and the
// JSON is all zeros.
func TestReportOfAnEmptyPeriod(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	now := time.Now()
	r, err := Collect(b.Ctx, b.JS, Options{From: now.Add(-time.Hour), To: now})
	if err != nil {
		t.Fatal(err)
	}
	if r.Totals != (Totals{}) || len(r.Providers) != 0 || len(r.Health) != 0 || r.BucketMS != (5*time.Minute).Milliseconds() {
		t.Errorf("empty period: %+v", r)
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(page.String(), "Nothing in this period"); got != 9 {
		t.Errorf("%d sections say they are empty, want all 9", got)
	}
	checkPage(t, page.String(), r)
	if out := os.Getenv("FAILBUS_REPORT_EMPTY_HTML"); out != "" {
		if err := os.WriteFile(out, page.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var js bytes.Buffer
	if err := json.NewEncoder(&js).Encode(r); err != nil || !strings.Contains(js.String(), `"providers":{}`) || !strings.Contains(js.String(), `"overruled":[]`) {
		t.Errorf("empty JSON has nulls where lists and maps belong: %s", js.String())
	}
}

var (
	tagged = regexp.MustCompile(`<(\w+)\b([^>]*?)\bdata-k=(["'])(.*?)(["'])([^>]*)>([^<]*)`)
	dataV  = regexp.MustCompile(`\bdata-v="(\d+)"`)
	rectH  = regexp.MustCompile(`\bheight="([\d.]+)"`)
)

// checkPage compares every number on the page that carries data-k with
// the figure at that path of the report's JSON, checks that the bars of
// each chart are drawn to one scale, and returns how many it compared.
func checkPage(t *testing.T, page string, r *Report) int {
	t.Helper()
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, chart := range strings.Split(page, "<svg") {
		scale := math.NaN()
		for _, m := range tagged.FindAllStringSubmatch(chart, -1) {
			attrs := m[2] + m[6]
			var path []any
			if err := json.Unmarshal([]byte(html.UnescapeString(m[4])), &path); err != nil {
				t.Fatalf("data-k %q is not a JSON path: %v", m[4], err)
			}
			shown := strings.ReplaceAll(strings.TrimSpace(html.UnescapeString(m[7])), ",", "")
			if v := dataV.FindStringSubmatch(attrs); v != nil {
				shown = v[1]
				if hm := rectH.FindStringSubmatch(attrs); m[1] == "rect" && hm != nil && strings.Contains(chart, "outcomes per") {
					h, _ := strconv.ParseFloat(hm[1], 64)
					val, _ := strconv.ParseFloat(v[1], 64)
					if ratio := h / val; math.IsNaN(scale) {
						scale = ratio
					} else if math.Abs(ratio-scale) > 0.02 {
						t.Errorf("bar %v: %v high for %v, other bars %.3f per unit", path, h, val, scale)
					}
				}
			}
			want, ok := lookup(doc, path)
			if !ok {
				t.Errorf("the page shows %v at %v, a path the JSON does not have", shown, path)
				continue
			}
			if shown != fmt.Sprint(want) {
				t.Errorf("the page shows %q at %v, the JSON has %v", shown, path, want)
			}
			n++
		}
	}
	return n
}

// lookup follows path through decoded JSON; a missing map key is 0 (the
// page prints absent counts as 0).
func lookup(doc any, path []any) (any, bool) {
	cur := doc
	for i, p := range path {
		switch c := cur.(type) {
		case map[string]any:
			key, _ := p.(string)
			v, ok := c[key]
			if !ok {
				if i == len(path)-1 {
					return 0, true
				}
				return nil, false
			}
			cur = v
		case []any:
			idx, ok := p.(float64)
			if !ok || int(idx) >= len(c) {
				return nil, false
			}
			cur = c[int(idx)]
		default:
			return nil, false
		}
	}
	return cur, true
}

// TestHealthTimelineStartsFromTheStateBeforeThePeriod: a provider already
// in outage when the period starts is drawn in outage from its start, and
// the outage counts.
func TestHealthTimelineStartsFromTheStateBeforeThePeriod(t *testing.T) {
	from := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	to := from.Add(6 * time.Hour)
	a := newAggregator(from, to)
	a.healthRecord(&events.Health{At: events.At(from.Add(-2 * time.Hour)), Provider: "p", State: events.HealthOutage}, from.Add(-2*time.Hour))
	a.healthRecord(&events.Health{At: events.At(from.Add(-time.Hour)), Provider: "q", State: events.HealthHealthy}, from.Add(-time.Hour))
	a.healthRecord(&events.Health{At: events.At(from.Add(time.Hour)), Provider: "p", State: events.HealthRecovered}, from.Add(time.Hour))
	r := a.finish(to)
	h := r.Health["p"]
	if h == nil || h.Start != events.HealthOutage || h.Outages != 1 || h.OutageMS != time.Hour.Milliseconds() || len(h.Spans) != 2 {
		t.Fatalf("p: %+v", h)
	}
	if _, ok := r.Health["q"]; ok {
		t.Error("a provider healthy before the period and quiet in it gets a timeline")
	}
}

// TestRecordsArePlacedByTheTimeTheServicesGoBy: an outcome's own time
// places it when it is believed; one dated ahead of its store time, or
// long before it, is placed at its store time, as the services' clocks do.
func TestRecordsArePlacedByTheTimeTheServicesGoBy(t *testing.T) {
	from := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	a := newAggregator(from, from.Add(24*time.Hour))
	stored := from.Add(20 * time.Hour)
	for _, c := range []struct {
		at   time.Time
		want time.Time // the start of the bucket
	}{
		{from.Add(3*time.Hour + 10*time.Minute), from.Add(3*time.Hour + 10*time.Minute)}, // believed
		{time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), stored},                            // ahead: its store time
		{from.Add(-90 * 24 * time.Hour), stored},                                         // far behind: its store time
		{time.Time{}, stored},                                                            // none
	} {
		if got := a.bucketOf(events.At(c.at), stored); !a.r.Buckets[got].Equal(c.want) {
			t.Errorf("at %s stored %s: bucket of %s, want %s", c.at, stored, a.r.Buckets[got], c.want)
		}
	}
	if a.r.Outside != 0 {
		t.Errorf("%d counted outside the period", a.r.Outside)
	}
	if got := a.bucketOf(events.At(from.Add(-time.Hour)), from.Add(time.Minute)); got != 0 || a.r.Outside != 1 {
		t.Errorf("an hour before the period: bucket %d, %d outside; want the first bucket, counted outside", got, a.r.Outside)
	}
}

// TestHealthLanesNameTheirProvidersWhole: two providers whose names share
// their first nine characters are told apart on the health chart.
func TestHealthLanesNameTheirProvidersWhole(t *testing.T) {
	from := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	to := from.Add(6 * time.Hour)
	a := newAggregator(from, to)
	for _, p := range []string{"azure-openai-eu", "azure-openai-us"} {
		a.healthRecord(&events.Health{At: events.At(from.Add(time.Hour)), Provider: p, State: events.HealthOutage}, from.Add(time.Hour))
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, a.finish(to)); err != nil {
		t.Fatal(err)
	}
	chart := page.String()[strings.Index(page.String(), `aria-label="provider health`):]
	chart = chart[:strings.Index(chart, "</svg>")]
	for _, p := range []string{"azure-openai-eu", "azure-openai-us"} {
		if !strings.Contains(chart, ">"+p+"</text>") {
			t.Errorf("the health chart does not name %s whole", p)
		}
	}
}

// TestReportReadsNoStreamThroughSeveralFilters: a read filtered on
// several subjects of a stream with many subjects (FAILBUS_RETRIES: one
// ledger subject per budget, one schedule subject per retry) makes the
// server find each next message slowly — over 20,000 outcomes, `failbus
// report` took 10 s and 8 s of the server's CPU for 10,600 retry records
// through a consumer filtered on two subjects, 0.3 s read whole. Each
// stream is read whole (or through one filter), with direct gets (no
// consumer: the operator may create none), and the report skips what it
// does not use; the figures are the same (TestReportOfASeededDay).
func TestReportReadsNoStreamThroughSeveralFilters(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, time.Minute)
	s := newSeeder(t, b.Ctx, b.JS, time.Now().Add(-2*time.Hour))
	s.seedDay()
	var (
		mu        sync.Mutex
		filters   = map[string]map[string]bool{} // stream → the filters its direct gets asked for
		consumers int
	)
	spy := func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		if strings.Contains(m.Subject, ".CONSUMER.CREATE.") {
			consumers++
			return
		}
		var req struct {
			NextFor string `json:"next_by_subj"`
		}
		if err := json.Unmarshal(m.Data, &req); err != nil || req.NextFor == "" {
			return
		}
		stream := strings.Split(m.Subject, ".")[4]
		if filters[stream] == nil {
			filters[stream] = map[string]bool{}
		}
		filters[stream][req.NextFor] = true
	}
	// A channel subscription: the connection's reader puts each copy in
	// the channel before it reads the flush's answer, so after Flush every
	// request the report made is in seen (an asynchronous handler may
	// not have run yet).
	seen := make(chan *nats.Msg, 1<<16)
	for _, subj := range []string{"$JS.API.DIRECT.GET.*", "$JS.API.CONSUMER.CREATE.>"} {
		if _, err := b.NC.ChanSubscribe(subj, seen); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := Collect(b.Ctx, b.JS, Options{From: time.Now().Add(-3 * time.Hour), To: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	for len(seen) > 0 {
		spy(<-seen)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(filters) < len(sources) {
		t.Fatalf("read %d streams, want %d", len(filters), len(sources))
	}
	for stream, f := range filters {
		if len(f) > 1 {
			t.Errorf("%s is read through %d filters %v: slow on the server", stream, len(f), f)
		}
	}
	if consumers != 0 {
		t.Errorf("%d consumers created", consumers)
	}
}
