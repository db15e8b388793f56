package report

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// subjectCounts counts the messages stored in stream per subject: the
// server's own count, independent of how the report decodes.
func subjectCounts(t *testing.T, ctx context.Context, js jetstream.JetStream, stream, filter string) map[string]int {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for subj, n := range info.State.Subjects {
		out[subj] = int(n)
	}
	return out
}

// token is the i-th token of a subject.
func token(subject string, i int) string { return strings.Split(subject, ".")[i] }

// TestReportOfADayOnARealBus is the acceptance story: every service runs on
// a real bus; agents publish a day of traffic — three providers, an outage
// of one and its recovery, overruled classifications, a segment refused
// until frozen, notifications past the daily budget, junk that is
// dead-lettered — hour by hour; the report of the day equals what was
// published (the outcomes the agents sent, and what the services stored,
// counted by the server per subject), and the page equals the JSON.
func TestReportOfADayOnARealBus(t *testing.T) {
	t.Parallel()
	sink := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(sink.Close)
	// scope.window is an hour: the day's traffic is a quarter of an hour
	// apart, and so are the failing hours' network failures, which the
	// default 5m window would not call an outage.
	pol, err := policy.Parse(fmt.Appendf(nil, "scope:\n  window: 1h\nnotify:\n  daily_budget: 2\n  sinks:\n    - {name: ops, type: webhook, url: %s}\n", sink.URL))
	if err != nil {
		t.Fatal(err)
	}
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	js := bus.JS
	nc, err := bus.Srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	bot, err := agent.New(nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	settled := func(what string) {
		t.Helper()
		clitest.WaitFor(t, what, func() bool {
			for _, c := range topology.Consumers() {
				stream, _, _ := topology.Consumer(c)
				if ok, err := embedded.CaughtUp(ctx, js, stream, c); err != nil || !ok {
					return false
				}
			}
			return true
		})
	}

	now := time.Now().UTC()
	from := now.Add(-24 * time.Hour).Truncate(time.Hour)
	published := map[string][]int{} // provider → outcomes per hour, as sent
	overruled := 0
	n := 0
	report := func(h int, off time.Duration, o events.Outcome) {
		t.Helper()
		n++
		o.ID, o.At = fmt.Sprintf("%s-%d", o.Provider, n), events.At(from.Add(time.Duration(h)*time.Hour+off))
		if err := bot.Report(ctx, &o); err != nil {
			t.Fatal(err)
		}
		if published[o.Provider] == nil {
			published[o.Provider] = make([]int, 25)
		}
		published[o.Provider][h]++
	}
	refusedAt := map[int]bool{2: true, 3: true, 5: true, 9: true} // 1 + 3 re-probes: frozen
	for h := range 24 {
		for m := range 4 {
			report(h, time.Duration(m)*15*time.Minute, events.Outcome{Provider: "openai", Profile: "o1", OK: true, Status: 200})
		}
		report(h, 5*time.Minute, events.Outcome{Provider: "openai", Profile: "o1", Status: 429, Headers: map[string]string{"retry-after-ms": "300"}, Turn: h, Step: 1})
		report(h, 35*time.Minute, events.Outcome{Provider: "openai", Profile: "o1", Status: 500, Body: "upstream error", Turn: h, Step: 2})
		if refusedAt[h] {
			report(h, 50*time.Minute, events.Outcome{Provider: "openai", Profile: "o1", Status: 200, StopReason: "refusal", RefusalScope: "history", Session: "chat-7", Segment: 1, Turn: h, Step: 3})
		}
		for m := range 4 {
			if h >= 10 && h < 13 {
				// A quarter of an hour apart: the third network failure
				// within scope.window (1h) begins the outage.
				report(h, time.Duration(m)*15*time.Minute, events.Outcome{Provider: "anthropic", Profile: "a1", Status: 0, TransportError: "read tcp: ECONNRESET", Turn: h, Step: m})
			} else {
				report(h, time.Duration(m)*15*time.Minute, events.Outcome{Provider: "anthropic", Profile: "a1", OK: true, Status: 200})
			}
		}
		report(h, 20*time.Minute, events.Outcome{Provider: "my-gateway", OK: true, Status: 200})
		if h%6 == 0 { // a gateway's empty 400 a library labels an overflow, far below the window
			report(h, 40*time.Minute, events.Outcome{Provider: "my-gateway", Status: 400, UpstreamCode: "CONTEXT_WINDOW_EXCEEDED", RequestTokens: 41000, ContextWindow: 256000, Turn: h})
			overruled++
		}
		settled(fmt.Sprintf("hour %d handled", h)) // the scope's clock follows the outcomes' own times
	}
	for i := range 3 { // junk on an outcome subject: dead letters
		if _, err := js.Publish(ctx, events.OutcomeSubject("openai", "bot"), []byte(fmt.Sprintf("junk %d", i))); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 { // more than the budget of 2 allows
		data, hdr, err := events.Encode(&events.Notification{DedupeKey: fmt.Sprintf("cost-alert-%d", i), Severity: events.SeverityNormal, Title: "cost alert"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.NotifySubject(events.SeverityNormal), Header: hdr, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	settled("everything handled")
	clitest.WaitFor(t, "every scheduled retry due and the recovery run done", func() bool {
		due := 0
		for _, c := range subjectCounts(t, ctx, js, topology.StreamRetries, events.RetryPrefix+".due.>") {
			due += c
		}
		r, err := Collect(ctx, js, Options{From: from, To: time.Now().Add(time.Minute)})
		if err != nil || r.Retries.Scheduled == 0 || due != r.Retries.Scheduled {
			return false
		}
		for _, rec := range r.Recoveries {
			if rec.Provider == "anthropic" && rec.Done {
				return true
			}
		}
		return false
	})
	settled("the recovery's outputs handled")

	to := time.Now().Add(time.Minute)
	r, err := Collect(ctx, js, Options{From: from, To: to})
	if err != nil {
		t.Fatal(err)
	}
	// Outcomes per provider and hour: exactly what the agent published.
	for p, hours := range published {
		got := r.Providers[p]
		if got == nil {
			t.Fatalf("no figures for %s", p)
		}
		total := 0
		if len(r.Buckets) != 24 || !r.Buckets[0].Equal(from) || r.BucketMS != time.Hour.Milliseconds() {
			t.Fatalf("%d buckets of %d ms from %s; want the 24 hours of records from %s, hourly", len(r.Buckets), r.BucketMS, r.Buckets[0], from)
		}
		for h, want := range hours {
			total += want
			if h >= len(got.Series) && want == 0 {
				continue // the 25th hour of the period holds no record: off the axis
			}
			if b := got.Series[h]; b.Total() != want {
				t.Errorf("%s hour %d: %d outcomes on the chart, %d published", p, h, b.Total(), want)
			}
		}
		if got.Outcomes != total || got.Unclassified != 0 {
			t.Errorf("%s: %d outcomes (%d unclassified), %d published", p, got.Outcomes, got.Unclassified, total)
		}
	}
	// Classes per provider: what the classifier stored, by subject.
	stored := map[string]map[string]int{}
	classified := 0
	for subj, c := range subjectCounts(t, ctx, js, topology.StreamClassified, ">") {
		p, class := token(subj, 2), token(subj, 3)
		if stored[p] == nil {
			stored[p] = map[string]int{}
		}
		stored[p][class] += c
		classified += c
	}
	if r.Totals.Classifications != classified || r.Totals.Outcomes != classified {
		t.Errorf("%d classifications and %d outcomes reported, %d stored", r.Totals.Classifications, r.Totals.Outcomes, classified)
	}
	for p, classes := range stored {
		for class, c := range classes {
			got := r.Providers[p].Classes[class]
			if class == events.ClassOK {
				got = r.Providers[p].OK
			}
			if got != c {
				t.Errorf("%s %s: %d reported, %d stored", p, class, got, c)
			}
		}
	}
	// Retries due, dead letters, notifications, health, recovery: what
	// the services stored.
	due := 0
	for _, c := range subjectCounts(t, ctx, js, topology.StreamRetries, events.RetryPrefix+".due.>") {
		due += c
	}
	if r.Retries.Due != due || r.Retries.Scheduled != due || r.Retries.Scheduled < 48 {
		t.Errorf("retries: %d scheduled, %d due reported; %d due stored (want every 429 and 500 retried)", r.Retries.Scheduled, r.Retries.Due, due)
	}
	for subj, c := range subjectCounts(t, ctx, js, topology.StreamDLQ, ">") {
		if got := r.DeadLetters.ByService[token(subj, 2)]; got != c {
			t.Errorf("dead letters of %s: %d reported, %d stored", token(subj, 2), got, c)
		}
	}
	if r.DeadLetters.ByService["classifier"] != 3 {
		t.Errorf("dead letters %+v: want the 3 junk payloads from the classifier", r.DeadLetters)
	}
	for subj, c := range subjectCounts(t, ctx, js, topology.StreamNotify, ">") {
		if got := r.Notifications.Requested[token(subj, 2)]; got != c {
			t.Errorf("%s notification requests: %d reported, %d stored", token(subj, 2), got, c)
		}
	}
	audits := subjectCounts(t, ctx, js, topology.StreamAudit, events.AuditPrefix+".notifier.>")
	nf := r.Notifications
	for kind, got := range map[string]int{"sent": nf.Sent, "held_by_budget": nf.Held, "deduped": nf.Deduped, "failed": nf.Failed, "unrouted": nf.Unrouted} {
		if want := audits[events.AuditSubject("notifier", kind)]; got != want {
			t.Errorf("notifications %s: %d reported, %d audit records stored", kind, got, want)
		}
	}
	if nf.Held == 0 || nf.Sent == 0 {
		t.Errorf("notifications %+v: want some sent and some held past the budget", nf)
	}
	healthStored := 0
	for _, c := range subjectCounts(t, ctx, js, topology.StreamHealth, ">") {
		healthStored += c
	}
	if r.Totals.HealthChanges != healthStored {
		t.Errorf("%d health changes reported, %d stored", r.Totals.HealthChanges, healthStored)
	}
	h := r.Health["anthropic"]
	if h == nil || h.Outages != 1 {
		t.Fatalf("anthropic health %+v: want one outage", h)
	}
	for _, sp := range h.Spans {
		// The scope counts each failure at its own time on anthropic's own
		// clock, so openai's outcomes of the hour, published first, do not
		// move it, and the classifier and the scheduler keep the agent's
		// order: the outage begins at 10:30, the third failure, as
		// `failbus simulate` of the same publishing order says (the case
		// "after another provider's later outcomes" of
		// e2e/scope_order_test.go).
		if sp.State == events.HealthOutage && (!sp.From.Equal(from.Add(10*time.Hour+30*time.Minute)) || sp.To.Before(from.Add(13*time.Hour))) {
			t.Errorf("outage span %+v: want it to begin at 10:30 and end with the recovery after 13:00 (from %s)", sp, from)
		}
	}
	recStored := 0
	for _, c := range subjectCounts(t, ctx, js, topology.StreamRecoveries, ">") {
		recStored += c
	}
	if r.Totals.RecoveryRecords != recStored || len(r.Recoveries) != 1 || r.Recoveries[0].Provider != "anthropic" {
		t.Errorf("recoveries %+v (%d records), %d stored: want the one run after anthropic's outage", r.Recoveries, r.Totals.RecoveryRecords, recStored)
	}
	// Overruled overflow claims, refusals: as the rules say.
	if len(r.Overruled) != 1 || r.Overruled[0].Count != overruled || r.Overruled[0].Claimed != events.ClassContextOverflow || r.Overruled[0].Provider != "my-gateway" {
		t.Errorf("overruled %+v: want the %d gateway 400s whose overflow claim the token counts rejected", r.Overruled, overruled)
	}
	if rf := r.Refusals; rf.Refused != 4 || rf.Segments != 1 || rf.Skipped != 1 || rf.Frozen != 1 {
		t.Errorf("refusals %+v: want one segment refused 4 times, skipped and frozen", rf)
	}
	if len(r.Undecodable) != 1 || r.Undecodable[topology.StreamOutcomes] != 3 {
		t.Errorf("undecodable records: %v; want the 3 junk payloads on the outcome subject", r.Undecodable)
	}

	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	checkPage(t, page.String(), r)
	if out := os.Getenv("FAILBUS_REPORT_HTML"); out != "" {
		if err := os.WriteFile(out, page.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Collect read with ordered consumers only, and left none behind.
	for _, s := range sources {
		st, err := js.Stream(ctx, s.stream)
		if err != nil {
			t.Fatal(err)
		}
		for name := range st.ConsumerNames(ctx).Name() {
			if _, _, ok := topology.Consumer(name); !ok && !strings.HasPrefix(name, "agent-") {
				t.Errorf("consumer %s left on %s", name, s.stream)
			}
		}
	}
}
