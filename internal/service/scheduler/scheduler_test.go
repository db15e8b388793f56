package scheduler_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/scopestore"
	"github.com/failbus/failbus/internal/service/scheduler"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// bench is one embedded server with the topology applied.
type bench struct {
	t   *testing.T
	ctx context.Context
	srv *embedded.Server
	nc  *nats.Conn
	js  jetstream.JetStream
}

func setup(t *testing.T) *bench {
	t.Helper()
	bus := bustest.Start(t, 2*time.Minute)
	nc := bus.NC
	srv, js, ctx := bus.Srv, bus.JS, bus.Ctx
	return &bench{t: t, ctx: ctx, srv: srv, nc: nc, js: js}
}

// start runs a scheduler until the test ends (or stop is called).
func (b *bench) start(opts scheduler.Config) (*scheduler.Service, func()) {
	b.t.Helper()
	if opts.Runner.Registerer == nil {
		opts.Runner.Registerer = prometheus.NewRegistry()
	}
	if opts.Runner.FetchWait == 0 {
		opts.Runner.FetchWait = 100 * time.Millisecond
	}
	s, err := scheduler.New(b.js, opts)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				b.t.Errorf("scheduler Run: %v", err)
			}
		})
	}
	b.t.Cleanup(stop)
	b.poll("scheduler healthy", func() bool { return s.Healthy() == nil })
	return s, stop
}

func (b *bench) poll(what string, cond func() bool) {
	b.t.Helper()
	for !cond() {
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("timed out waiting for %s", what)
		case <-time.After(25 * time.Millisecond): // poll interval, bounded by b.ctx
		}
	}
}

// scopeBucket is the fault scope's KV bucket.
func (b *bench) scopeBucket() jetstream.KeyValue {
	b.t.Helper()
	kv, err := b.js.KeyValue(b.ctx, topology.BucketScope)
	if err != nil {
		b.t.Fatal(err)
	}
	return kv
}

// cls is a classified failure of one call.
func cls(id, agentName, provider, profile, class string, turn, step int, afterMS int64) *events.Classification {
	c := &events.Classification{
		OutcomeID: id, At: events.At(time.Now()), Agent: agentName, Provider: provider, Model: "m-1", Profile: profile,
		Class: class, Rule: "test", Session: "s", Segment: 1, Turn: turn, Step: step,
	}
	if info, ok := events.LookupClass(class); ok {
		c.Scope, c.Retryable = info.Scope, info.Retryable
	}
	if afterMS > 0 {
		c.Hints = &events.RetryHints{AfterMS: afterMS, Source: "retry-after-ms"}
	}
	return c
}

// publish stores a classification as the classifier would; msgID "" uses
// the classifier's id.
func (b *bench) publish(c *events.Classification, msgID string) {
	b.t.Helper()
	data, hdr, err := events.Encode(c)
	if err != nil {
		b.t.Fatal(err)
	}
	if msgID == "" {
		msgID = msgid.Output("classifier", c.OutcomeID, "0")
	}
	hdr.Set(nats.MsgIdHdr, msgID)
	if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: events.ClassifiedSubject(c.Provider, c.Class), Header: hdr, Data: data}); err != nil {
		b.t.Fatalf("publish %s: %v", c.OutcomeID, err)
	}
}

func (b *bench) putPolicy(yaml string) uint64 {
	b.t.Helper()
	kv, err := b.js.KeyValue(b.ctx, topology.BucketPolicy)
	if err != nil {
		b.t.Fatal(err)
	}
	rev, err := kv.Put(b.ctx, scheduler.PolicyKVKey, []byte(yaml))
	if err != nil {
		b.t.Fatal(err)
	}
	return rev
}

// waitPolicy waits for the audit record of KV revision rev.
func (b *bench) waitPolicy(rev uint64) *scheduler.PolicyAudit {
	b.t.Helper()
	return b.waitAudit(fmt.Sprintf("policy revision %d audited", rev), func(a *scheduler.PolicyAudit) bool { return a.Revision == rev })
}

func (b *bench) waitAudit(what string, match func(*scheduler.PolicyAudit) bool) *scheduler.PolicyAudit {
	b.t.Helper()
	var got *scheduler.PolicyAudit
	b.poll(what, func() bool {
		for _, m := range b.read(topology.StreamAudit, scheduler.PolicyAuditSubject()) {
			var a scheduler.PolicyAudit
			if err := events.Unmarshal(m.Data(), &a); err == nil && match(&a) {
				got = &a
				return true
			}
		}
		return false
	})
	return got
}

// idle reports whether a durable consumer has had everything its stream
// holds on its filter delivered and acknowledged.
func (b *bench) idle(stream, name string) bool {
	ok, err := embedded.CaughtUp(b.ctx, b.js, stream, name)
	if err != nil {
		b.t.Fatal(err)
	}
	return ok
}

func (b *bench) waitIdle() {
	b.t.Helper()
	b.poll("scheduler consumers idle", func() bool {
		return b.idle(topology.StreamClassified, topology.ConsumerScheduler) && b.idle(topology.StreamRetries, topology.ConsumerSchedulerControl)
	})
}

// read returns every message of stream on filter, in order. An empty
// no-wait fetch is the end only when the consumer has nothing pending: a
// loaded server may answer one before the new consumer has its messages
// ready. (Messages may also disappear while it reads: fired or purged
// schedules.)
func (b *bench) read(stream, filter string) []jetstream.Msg {
	b.t.Helper()
	c, err := b.js.OrderedConsumer(b.ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		b.t.Fatal(err)
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			_ = b.js.DeleteConsumer(b.ctx, stream, info.Name)
		}
	}()
	var out []jetstream.Msg
	for {
		batch, err := c.FetchNoWait(500)
		if err != nil {
			b.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			out = append(out, m)
			got++
		}
		if got > 0 {
			continue
		}
		info, err := c.Info(b.ctx)
		if err != nil {
			b.t.Fatal(err)
		}
		if info.NumPending == 0 {
			return out
		}
		if b.ctx.Err() != nil {
			b.t.Fatalf("read %s %s: %d messages still pending", stream, filter, info.NumPending)
		}
	}
}

func (b *bench) decisions(agentName string) []events.Decision {
	b.t.Helper()
	var out []events.Decision
	for _, m := range b.read(topology.StreamDecisions, events.DecisionSubject(agentName)) {
		d, err := events.DecodeAs[*events.Decision](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			b.t.Fatal(err)
		}
		out = append(out, *d)
	}
	return out
}

func (b *bench) decisionOf(agentName, outcomeID string) *events.Decision {
	b.t.Helper()
	var got *events.Decision
	b.poll("decision of "+outcomeID, func() bool {
		for _, d := range b.decisions(agentName) {
			if d.OutcomeID == outcomeID {
				got = &d
				return true
			}
		}
		return false
	})
	return got
}

// due is a retry that came due, with the time the stream stored it.
type due struct {
	events.RetryDue
	stored    time.Time
	scheduler string
}

func (b *bench) dues(agentName string) []due {
	b.t.Helper()
	var out []due
	for _, m := range b.read(topology.StreamRetries, events.RetryDueSubject(agentName)) {
		var r events.RetryDue
		if err := events.Unmarshal(m.Data(), &r); err != nil {
			b.t.Fatal(err)
		}
		md, err := m.Metadata()
		if err != nil {
			b.t.Fatal(err)
		}
		out = append(out, due{RetryDue: r, stored: md.Timestamp, scheduler: m.Headers().Get(scheduler.HeaderScheduler)})
	}
	return out
}

func (b *bench) ledger(token string) []scheduler.LedgerEntry {
	b.t.Helper()
	var out []scheduler.LedgerEntry
	for _, m := range b.read(topology.StreamRetries, events.RetryLedgerSubject(token)) {
		e, err := scheduler.DecodeLedgerEntry(m.Headers(), m.Data())
		if err != nil {
			b.t.Fatal(err)
		}
		out = append(out, *e)
	}
	return out
}

func (b *bench) pendingSchedules() int {
	b.t.Helper()
	return len(b.read(topology.StreamRetries, events.RetryPrefix+".sched.>"))
}

// budgetToken is the ledger token of a classification under p.
func budgetToken(c *events.Classification, p *policy.Policy) string {
	return retry.BudgetFor(*c, p.RetryFor(c.Provider)).Token()
}

// checkDueOnce fails unless retryID came due exactly once, not before its
// due time, from its own schedule.
func (b *bench) checkDueOnce(agentName, retryID string) due {
	b.t.Helper()
	var got []due
	for _, d := range b.dues(agentName) {
		if d.RetryID == retryID {
			got = append(got, d)
		}
	}
	if len(got) != 1 {
		b.t.Fatalf("retry %s came due %d times, want once", retryID, len(got))
	}
	d := got[0]
	if d.stored.Before(d.DueAt.Time) {
		b.t.Errorf("retry %s came due %v early", retryID, d.DueAt.Sub(d.stored))
	}
	if want := events.RetryScheduleSubject(agentName, retryID); d.scheduler != want {
		b.t.Errorf("retry %s fired from %q, want %q", retryID, d.scheduler, want)
	}
	return d
}

func TestRetryIsLedgeredScheduledAndComesDueOnceWithTheHintExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(scheduler.Config{})
	c := cls("o-1", "ag", "openai", "key-a", events.ClassRateLimit, 1, 1, 1500)
	b.publish(c, "")
	d := b.decisionOf("ag", "o-1")
	if d.Action != events.ActionRetry || d.DelayMS != 1500 || d.Retry != 1 || d.RetryID == "" {
		t.Fatalf("decision %+v, want retry 1 after 1500ms", d)
	}
	if got := d.DueAt.Sub(d.At.Time); got != 1500*time.Millisecond {
		t.Errorf("due_at - at = %v, want the hint exactly", got)
	}
	entries := b.ledger(budgetToken(c, policy.Default()))
	if len(entries) != 1 || entries[0].RetryID != d.RetryID || entries[0].Retry != 1 || !entries[0].DueAt.Equal(d.DueAt.Time) {
		t.Fatalf("ledger %+v, want one entry for %s", entries, d.RetryID)
	}
	b.poll("the retry to come due", func() bool { return len(b.dues("ag")) > 0 })
	got := b.checkDueOnce("ag", d.RetryID)
	if got.OutcomeID != "o-1" || got.Retry != 1 || !got.DueAt.Equal(d.DueAt.Time) {
		t.Errorf("due %+v, want the decision's", got.RetryDue)
	}
	if n := b.pendingSchedules(); n != 0 {
		t.Errorf("%d schedules left after firing", n)
	}
	t.Logf("due at %s, stored %v later", d.DueAt.Format(time.RFC3339Nano), got.stored.Sub(got.DueAt.Time))
}

func TestBudgetIsExactWhenOneStepFailsConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rev := b.putPolicy("retry:\n  max_retries: 3\n  initial_delay: 100ms\n  max_delay: 1s\n")
	b.start(scheduler.Config{WatchPolicy: true, Runner: consumer.Config{Concurrency: 8, FetchBatch: 16}})
	b.waitPolicy(rev)
	const fails = 7
	for i := range fails {
		b.publish(cls(fmt.Sprintf("c-%d", i), "ag", "anthropic", "k", events.ClassServerError, 4, 2, 0), "")
	}
	b.waitIdle()
	ds := b.decisions("ag")
	if len(ds) != fails {
		t.Fatalf("%d decisions, want %d", len(ds), fails)
	}
	retries := map[int]string{}
	giveUps := 0
	for _, d := range ds {
		switch d.Action {
		case events.ActionRetry:
			if prev, dup := retries[d.Retry]; dup {
				t.Errorf("retry %d decided twice (%s and %s)", d.Retry, prev, d.OutcomeID)
			}
			retries[d.Retry] = d.RetryID
		case events.ActionGiveUp:
			giveUps++
			if !strings.Contains(d.Reason, "3 of 3") {
				t.Errorf("give_up reason %q, want the exhausted budget", d.Reason)
			}
		default:
			t.Errorf("unexpected %s for %s", d.Action, d.OutcomeID)
		}
	}
	if len(retries) != 3 || giveUps != fails-3 {
		t.Fatalf("retries %v, %d give_up; want retries 1..3 and %d give_up", retries, giveUps, fails-3)
	}
	p, err := policy.Parse([]byte("retry:\n  max_retries: 3\n  initial_delay: 100ms\n  max_delay: 1s\n"))
	if err != nil {
		t.Fatal(err)
	}
	entries := b.ledger(budgetToken(cls("x", "ag", "anthropic", "k", events.ClassServerError, 4, 2, 0), p))
	if len(entries) != 3 || entries[2].Retry != 3 {
		t.Fatalf("ledger holds %d entries (last %+v), want 3 ending at retry 3", len(entries), entries[len(entries)-1])
	}
	b.poll("three retries due", func() bool { return len(b.dues("ag")) >= 3 })
	for _, id := range retries {
		b.checkDueOnce("ag", id)
	}
}

func TestRedeliveredClassificationReplaysItsRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The hook turns the first pass at each crash point into a panic: the
	// runner dead-letters that delivery, as if the process had died there,
	// and the test then delivers the classification again (a new message
	// with the same outcome), as JetStream does after a crash.
	var mu sync.Mutex
	crashAt := map[string]string{} // outcome id -> point
	crashed := map[string]bool{}
	hook := func(point string) {
		mu.Lock()
		defer mu.Unlock()
		for id, p := range crashAt {
			if p == point && !crashed[id] {
				crashed[id] = true
				panic("crash at " + point)
			}
		}
	}
	reg := prometheus.NewRegistry()
	b.start(scheduler.Config{CrashAt: hook, Runner: consumer.Config{Registerer: reg, Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)}})
	cases := []struct {
		name, id, point string
		afterMS         int64
		waitDue         bool // let it fire before the redelivery
		restored        float64
	}{
		{"crash after the ledger write: the schedule is restored", "r-ledger", scheduler.CrashAfterLedger, 800, false, 1},
		{"crash after the schedule: it is not scheduled again", "r-sched", scheduler.CrashAfterSchedule, 800, false, 0},
		{"crash after the schedule fired: it does not fire again", "r-fired", scheduler.CrashAfterSchedule, 300, true, 0},
		{"crash after the decision: nothing new", "r-dec", scheduler.CrashAfterDecision, 800, false, 0},
	}
	restored := 0.0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := &bench{t: t, ctx: b.ctx, srv: b.srv, nc: b.nc, js: b.js}
			mu.Lock()
			crashAt[tc.id] = tc.point
			mu.Unlock()
			// server_error, not a network class: four network failures in
			// a row on the provider's only profile would be an outage.
			c := cls(tc.id, "ag-"+tc.id, "openai", "k", events.ClassServerError, 1, 1, tc.afterMS)
			b.publish(c, "")
			b.poll("the crash", func() bool {
				for _, m := range b.read(topology.StreamDLQ, events.DLQSubject(scheduler.Name)) {
					if strings.Contains(string(m.Data()), tc.id) {
						return true
					}
				}
				return false
			})
			token := budgetToken(c, policy.Default())
			entries := b.ledger(token)
			if len(entries) != 1 {
				t.Fatalf("ledger after the crash: %d entries, want 1", len(entries))
			}
			if tc.waitDue {
				b.poll("the retry to fire", func() bool { return len(b.dues(c.Agent)) == 1 })
			}
			b.publish(c, "redelivery:"+tc.id)
			b.waitIdle()
			d := b.decisionOf(c.Agent, tc.id)
			if d.RetryID != entries[0].RetryID || !d.DueAt.Equal(entries[0].DueAt.Time) || d.Retry != 1 {
				t.Errorf("replayed decision %+v, want the ledger's %+v", d, entries[0].Record)
			}
			if n := len(b.decisions(c.Agent)); n != 1 {
				t.Errorf("%d decisions, want 1", n)
			}
			if n := len(b.ledger(token)); n != 1 {
				t.Errorf("ledger after the replay: %d entries, want 1 (nothing spent again)", n)
			}
			b.poll("the retry to fire", func() bool { return len(b.dues(c.Agent)) >= 1 && b.schedulesOf(c.Agent) == 0 })
			b.checkDueOnce(c.Agent, d.RetryID)
			restored += tc.restored
			if got := counter(t, reg, "failbus_scheduler_schedules_restored_total"); got != restored {
				t.Errorf("schedules restored: %v, want %v", got, restored)
			}
		})
	}
}

func (b *bench) schedulesOf(agentName string) int {
	return len(b.read(topology.StreamRetries, events.RetryPrefix+".sched."+events.Token(agentName)+".>"))
}

func TestCancelPurgesTheScheduleAndAStartedAfterItIsIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	b.start(scheduler.Config{Runner: consumer.Config{Registerer: reg}})
	ag, err := agent.New(b.nc, "canceller")
	if err != nil {
		t.Fatal(err)
	}
	c := cls("k-1", "canceller", "openai", "k", events.ClassOverloaded, 1, 1, 3000)
	b.publish(c, "")
	d := b.decisionOf("canceller", "k-1")
	if b.schedulesOf("canceller") != 1 {
		t.Fatal("no pending schedule after the decision")
	}
	if err := ag.Cancel(b.ctx, d.RetryID); err != nil {
		t.Fatal(err)
	}
	b.poll("the schedule purged", func() bool { return b.schedulesOf("canceller") == 0 })
	if err := ag.Started(b.ctx, d.RetryID); err != nil {
		t.Fatal(err)
	}
	b.waitIdle()
	entries := b.ledger(budgetToken(c, policy.Default()))
	if len(entries) != 2 || !entries[1].Cancelled() || entries[1].Started() || entries[1].Retry != 1 {
		t.Fatalf("ledger %+v, want the record then its cancel (still retry 1: no refund), no start", entries)
	}
	// A later failure of the same step spends retry 2: cancelling refunds
	// nothing.
	b.publish(cls("k-2", "canceller", "openai", "k", events.ClassOverloaded, 1, 1, 200), "")
	d2 := b.decisionOf("canceller", "k-2")
	if d2.Retry != 2 {
		t.Errorf("next retry is %d, want 2", d2.Retry)
	}
	// A late redelivery of k-1 (its acknowledgement lost before the cancel)
	// now finds its record behind k-2's: it is replayed as retry 1 and its
	// cancelled schedule is not restored.
	b.publish(c, "redelivery:k-1")
	b.waitIdle()
	if n := len(b.ledger(budgetToken(c, policy.Default()))); n != 3 {
		t.Errorf("ledger after the redelivery: %d entries, want 3 (record, cancel, retry 2)", n)
	}
	if got := counter(t, reg, "failbus_scheduler_replays_total"); got != 1 {
		t.Errorf("replays: %v, want 1", got)
	}
	if got := counter(t, reg, "failbus_scheduler_schedules_restored_total"); got != 0 {
		t.Errorf("schedules restored: %v, want 0 (the retry was cancelled)", got)
	}
	b.poll("retry 2 due", func() bool { return len(b.dues("canceller")) == 1 })
	// The cancelled one never comes due: its due time has passed by now.
	if !time.Now().After(d.DueAt.Time) {
		b.poll("the cancelled retry's due time to pass", func() bool { return time.Now().After(d.DueAt.Add(500 * time.Millisecond)) })
	}
	for _, x := range b.dues("canceller") {
		if x.RetryID == d.RetryID {
			t.Errorf("cancelled retry %s came due", d.RetryID)
		}
	}
}

func TestStartedIsMarkedAndACancelAfterItIsIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(scheduler.Config{})
	ag, err := agent.New(b.nc, "starter")
	if err != nil {
		t.Fatal(err)
	}
	c := cls("s-1", "starter", "openai", "k", events.ClassServerError, 1, 1, 200)
	b.publish(c, "")
	d := b.decisionOf("starter", "s-1")
	b.poll("due", func() bool { return len(b.dues("starter")) == 1 })
	if err := ag.Started(b.ctx, d.RetryID); err != nil {
		t.Fatal(err)
	}
	if err := ag.Cancel(b.ctx, d.RetryID); err != nil {
		t.Fatal(err)
	}
	b.waitIdle()
	entries := b.ledger(budgetToken(c, policy.Default()))
	if len(entries) != 2 || !entries[1].Started() || entries[1].Cancelled() {
		t.Fatalf("ledger %+v, want the record then its start only", entries)
	}
}

func TestJunkControlRecordsAreDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(scheduler.Config{})
	mark := func(v any) []byte {
		data, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	junk := []struct {
		name, subject string
		data          []byte
		reason        string
	}{
		{"not msgpack", events.RetryCancelSubject("a"), []byte("cancel it"), "not a msgpack map"},
		{"no retry id", events.RetryCancelSubject("a"), mark(map[string]any{"agent": "a"}), `"retry_id": required`},
		{"a retry id failbus never issued", events.RetryStartedSubject("a"), mark(map[string]any{"agent": "a", "retry_id": "mine-1"}), "not a retry id failbus issued"},
		{"another agent's retry", events.RetryCancelSubject("a"), mark(map[string]any{"agent": "b", "retry_id": "b0123-1"}), "the subject is the identity"},
	}
	for _, j := range junk {
		if _, err := b.js.Publish(b.ctx, j.subject, j.data); err != nil {
			t.Fatal(err)
		}
	}
	b.waitIdle()
	dead := b.read(topology.StreamDLQ, events.DLQSubject(scheduler.ControlName))
	if len(dead) != len(junk) {
		t.Fatalf("%d dead letters, want %d", len(dead), len(junk))
	}
	for i, j := range junk {
		dl, err := events.DecodeAs[*events.DeadLetter](dead[i].Subject(), dead[i].Headers(), dead[i].Data())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(dl.Reason, j.reason) {
			t.Errorf("%s: reason %q, want %q", j.name, dl.Reason, j.reason)
		}
	}
}

// outagePolicy detects an outage after 2 network failures and recovers
// after 2 successes spanning 1s.
const outagePolicy = "scope:\n  outage_min_failures: 2\n  recovery_min_successes: 2\n  recovery_min_time: 1s\n"

func (b *bench) health(provider string) []events.Health {
	b.t.Helper()
	var out []events.Health
	for _, m := range b.read(topology.StreamHealth, events.HealthSubject(provider)) {
		h, err := events.DecodeAs[*events.Health](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			b.t.Fatal(err)
		}
		out = append(out, *h)
	}
	return out
}

func TestOutageDecidesWaitProviderSpendsNoBudgetAndSurvivesARestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rev := b.putPolicy(outagePolicy)
	_, stop := b.start(scheduler.Config{WatchPolicy: true})
	b.waitPolicy(rev)
	// The outcomes' times lie in the past: the scheduler believes no `at`
	// later than when the bus stored it (events.EventTime).
	t0 := time.Now().Add(-time.Minute)
	at := func(d time.Duration) events.Time { return events.At(t0.Add(d)) }
	fail := func(id, profile string, d time.Duration) *events.Classification {
		c := cls(id, "ag", "deepseek", profile, events.ClassTransport, 1, 1, 0)
		c.At = at(d)
		return c
	}
	b.publish(fail("n-1", "key-1", 0), "")
	if d := b.decisionOf("ag", "n-1"); d.Action != events.ActionRetry {
		t.Fatalf("first network failure: %s, want retry", d.Action)
	}
	b.publish(fail("n-2", "key-2", 100*time.Millisecond), "")
	d := b.decisionOf("ag", "n-2")
	if d.Action != events.ActionWaitProvider || d.RetryID != "" || !strings.Contains(d.Reason, "down") {
		t.Fatalf("second failure with every profile down: %+v, want wait_provider without a retry", d)
	}
	hs := b.health("deepseek")
	if len(hs) != 1 || hs[0].State != events.HealthOutage {
		t.Fatalf("health %+v, want one outage record", hs)
	}
	notes := b.read(topology.StreamNotify, events.NotifySubject(events.SeverityCritical))
	if len(notes) != 1 {
		t.Fatalf("%d critical notification requests, want 1", len(notes))
	}
	p, _ := policy.Parse([]byte(outagePolicy))
	if n := len(b.ledger(budgetToken(fail("n-2", "key-2", 0), p))); n != 1 {
		t.Errorf("ledger of the step holds %d records, want 1 (wait_provider spends nothing)", n)
	}

	// A restarted scheduler still holds the provider: the outage is read
	// back from FAILBUS_HEALTH, not forgotten.
	stop()
	b.start(scheduler.Config{WatchPolicy: true})
	b.publish(fail("n-3", "key-1", 200*time.Millisecond), "")
	if d := b.decisionOf("ag", "n-3"); d.Action != events.ActionWaitProvider {
		t.Fatalf("after a restart: %s, want wait_provider", d.Action)
	}
	// Recovery: two successes spanning 1s of the outcomes' time.
	ok := func(id string, d time.Duration) *events.Classification {
		c := cls(id, "ag", "deepseek", "key-1", events.ClassOK, 2, 1, 0)
		c.At = at(d)
		return c
	}
	// ok-2 is published only once ok-1 was observed (its degraded record
	// is out): the scheduler handles a fetched batch concurrently, and
	// ok-2 observed first would start the streak at 1.4s, leaving ok-1
	// (clamped to the clock) no time span to add.
	b.publish(ok("ok-1", 300*time.Millisecond), "")
	b.poll("recovering", func() bool {
		hs := b.health("deepseek")
		return len(hs) > 0 && hs[len(hs)-1].State == events.HealthDegraded
	})
	b.publish(ok("ok-2", 1400*time.Millisecond), "")
	b.poll("recovered", func() bool {
		hs := b.health("deepseek")
		return len(hs) > 0 && hs[len(hs)-1].State == events.HealthRecovered
	})
	states := []string{}
	for _, h := range b.health("deepseek") {
		states = append(states, h.State)
	}
	if got := strings.Join(states, ","); got != "outage,degraded,recovered" {
		t.Errorf("health sequence %s, want outage,degraded,recovered", got)
	}
	b.publish(fail("n-4", "key-2", 1500*time.Millisecond), "")
	if d := b.decisionOf("ag", "n-4"); d.Action != events.ActionRetry {
		t.Errorf("after recovery: %s, want retry", d.Action)
	}
}

// A scheduler that dies after storing an outage in FAILBUS_SCOPE and before
// publishing its health record and notification loses neither: the
// redelivered classification (or any next one of the provider) publishes
// them, under the transition's ids, once, and the decision that depends
// on them goes out only after them.
func TestADeathBetweenTheScopeWriteAndThePublishLosesNoRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rev := b.putPolicy(outagePolicy)
	var (
		once    sync.Once
		crashed atomic.Bool
	)
	hook := func(point string) {
		if point == scheduler.CrashAfterScope {
			once.Do(func() {
				crashed.Store(true)
				panic("crash at " + point)
			})
		}
	}
	b.start(scheduler.Config{WatchPolicy: true, CrashAt: hook})
	b.waitPolicy(rev)
	t0 := time.Now().Add(-time.Minute) // believed: not after the stored time
	fail := func(id, profile string, d time.Duration) *events.Classification {
		c := cls(id, "ag", "deepseek", profile, events.ClassTransport, 1, 1, 0)
		c.At = events.At(t0.Add(d))
		return c
	}
	b.publish(fail("n-1", "key-1", 0), "")
	b.decisionOf("ag", "n-1")
	b.publish(fail("n-2", "key-2", 100*time.Millisecond), "") // the outage: stored, then the crash
	// Its handler waited for the publish, so it is delivered again; the
	// next write publishes what the crashed one stored, then decides.
	d := b.decisionOf("ag", "n-2")
	if !crashed.Load() {
		t.Fatal("decided without passing the crash point")
	}
	if d.Action != events.ActionWaitProvider {
		t.Fatalf("redelivered: %s, want wait_provider", d.Action)
	}
	// Stored times of one server: the decision's is not before the
	// health record's.
	stored := func(stream, subject, outcomeID string) time.Time {
		for _, m := range b.read(stream, subject) {
			if strings.Contains(string(m.Data()), outcomeID) || outcomeID == "" {
				md, err := m.Metadata()
				if err != nil {
					t.Fatal(err)
				}
				return md.Timestamp
			}
		}
		t.Fatalf("nothing on %s", subject)
		return time.Time{}
	}
	hAt, dAt := stored(topology.StreamHealth, events.HealthSubject("deepseek"), ""), stored(topology.StreamDecisions, events.DecisionSubject("ag"), "n-2")
	if dAt.Before(hAt) {
		t.Errorf("the decision (stored %s) before the health record it depends on (%s)", dAt, hAt)
	}
	b.publish(fail("n-2", "key-2", 100*time.Millisecond), "redelivery:n-2") // once more, as a new message
	b.decisionOf("ag", "n-2")
	b.publish(fail("n-3", "key-1", 200*time.Millisecond), "")
	b.decisionOf("ag", "n-3")
	b.waitIdle()
	if hs := b.health("deepseek"); len(hs) != 1 || hs[0].State != events.HealthOutage {
		t.Fatalf("health %+v, want the outage once", hs)
	}
	if notes := b.read(topology.StreamNotify, events.NotifySubject(events.SeverityCritical)); len(notes) != 1 {
		t.Fatalf("%d critical notification requests, want the outage's once", len(notes))
	}
}

func TestANewPolicyKeyStartsANewBudget(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rev := b.putPolicy("retry:\n  max_retries: 1\n")
	b.start(scheduler.Config{WatchPolicy: true})
	a := b.waitPolicy(rev)
	if a.Kind != scheduler.PolicyApplied {
		t.Fatalf("audit %+v, want applied", a)
	}
	step := func(id string) *events.Decision {
		b.publish(cls(id, "ag", "openai", "k", events.ClassServerError, 9, 9, 5000), "")
		return b.decisionOf("ag", id)
	}
	if d := step("p-1"); d.Action != events.ActionRetry || d.Retry != 1 {
		t.Fatalf("p-1: %+v", d)
	}
	if d := step("p-2"); d.Action != events.ActionGiveUp {
		t.Fatalf("p-2: %s, want give_up (budget of 1 spent)", d.Action)
	}
	bad := b.putPolicy("retry:\n  max_retrys: 5\n")
	if a := b.waitPolicy(bad); a.Kind != scheduler.PolicyRejected || !strings.Contains(a.Error, "max_retrys") {
		t.Fatalf("audit of a bad policy %+v, want rejected naming the key", a)
	}
	if d := step("p-3"); d.Action != events.ActionGiveUp {
		t.Fatalf("p-3 under the kept policy: %s, want give_up", d.Action)
	}
	rev = b.putPolicy("retry:\n  max_retries: 2\n")
	a2 := b.waitPolicy(rev)
	if a2.PolicyKey == a.PolicyKey {
		t.Fatal("a new max_retries kept the policy key")
	}
	d := step("p-4")
	if d.Action != events.ActionRetry || d.Retry != 1 {
		t.Fatalf("p-4 under a new policy key: %+v, want retry 1 of a new budget", d)
	}
	kv, err := b.js.KeyValue(b.ctx, topology.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(b.ctx, scheduler.PolicyKVKey); err != nil {
		t.Fatal(err)
	}
	if a := b.waitAudit("policy removal audited", func(a *scheduler.PolicyAudit) bool { return a.Kind == scheduler.PolicyRemoved }); a.PolicyKey != policy.Default().RetryFor("").Key() {
		t.Fatalf("audit after delete %+v, want the default policy's key", a)
	}
}

func TestUndecodableClassificationIsDeadLetteredAndConsumingGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(scheduler.Config{})
	if _, err := b.js.Publish(b.ctx, events.ClassifiedSubject("openai", "server_error"), []byte("junk")); err != nil {
		t.Fatal(err)
	}
	nobody := cls("nobody", "", "openai", "k", events.ClassServerError, 1, 1, 0)
	nobody.Agent = ""
	b.publish(nobody, "")
	b.publish(cls("after", "ag", "openai", "k", events.ClassServerError, 1, 1, 0), "")
	b.decisionOf("ag", "after")
	b.waitIdle()
	if n := len(b.read(topology.StreamDLQ, events.DLQSubject(scheduler.Name))); n != 2 {
		t.Errorf("%d dead letters, want 2", n)
	}
}

func TestContentRefusalsAndSuccessesGetNoDecision(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(scheduler.Config{})
	b.publish(cls("ref", "ag", "openai", "k", events.ClassContentRefusal, 1, 1, 0), "")
	b.publish(cls("fine", "ag", "openai", "k", events.ClassOK, 1, 2, 0), "")
	b.publish(cls("last", "ag", "openai", "k", events.ClassAuth, 1, 3, 0), "")
	b.decisionOf("ag", "last")
	b.waitIdle()
	ds := b.decisions("ag")
	if len(ds) != 1 || ds[0].OutcomeID != "last" || ds[0].Action != events.ActionGiveUp {
		t.Fatalf("decisions %+v, want only give_up for the auth failure", ds)
	}
}

// counter reads a counter without labels from reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// syncBuffer is a log sink the scheduler writes to while the test reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// count is how many log lines contain every one of parts.
func (w *syncBuffer) count(parts ...string) int {
	n := 0
	for line := range strings.Lines(w.String()) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// gauge reads a gauge without labels from reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// reloads reads failbus_scheduler_policy_reloads_total{source, result}.
func reloads(t *testing.T, reg *prometheus.Registry, source, result string) float64 {
	t.Helper()
	return labeledCounter(t, reg, "failbus_scheduler_policy_reloads_total", map[string]string{"source": source, "result": result})
}

// labeledCounter reads the counter name whose labels include every one of
// labels; 0 when there is none.
func labeledCounter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// retryKey is the policy key of the global retry policy of doc.
func retryKey(t *testing.T, doc string) string {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p.RetryFor("").Key()
}

// writeFile replaces the file at path with content the recommended way: a
// new file renamed over it, so no look sees it half written (the scheduler
// would wait for a half-written file to settle; see
// TestPolicyFileChangesSettleBeforeTheyCount).
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	f, err := os.CreateTemp(filepath.Dir(path), ".policy-*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		t.Fatal(err)
	}
}

func TestPolicyFileIsReloadedAndTheKVKeyOverridesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		one   = "retry:\n  max_retries: 1\n"
		three = "retry:\n  max_retries: 3\n"
		bad   = "retry:\n  max_retrys: 5\n"
		kvTwo = "retry:\n  max_retries: 2\n"
		four  = "retry:\n  max_retries: 4\n"
	)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, one)
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	s, _ := b.start(scheduler.Config{
		PolicyFile: path, PolicyPollInterval: 10 * time.Millisecond, WatchPolicy: true,
		Runner: consumer.Config{Registerer: reg, Logger: zerolog.New(logs).Level(zerolog.DebugLevel)},
	})
	if got, want := s.Policy().RetryFor("").Key(), retryKey(t, one); got != want {
		t.Fatalf("policy key at start %s, want the file's %s", got, want)
	}
	n := 0
	step := func() *events.Decision {
		n++
		id := fmt.Sprintf("f-%d", n)
		b.publish(cls(id, "ag", "openai", "k", events.ClassServerError, 9, 9, 5000), "")
		return b.decisionOf("ag", id)
	}
	expect := func(what string, d *events.Decision, action string, retry, of int) {
		t.Helper()
		if d.Action != action {
			t.Fatalf("%s: %s (%s), want %s", what, d.Action, d.Reason, action)
		}
		if action == events.ActionRetry && (d.Retry != retry || !strings.Contains(d.Reason, fmt.Sprintf("retry %d of %d", retry, of))) {
			t.Fatalf("%s: retry %d (%s), want retry %d of %d", what, d.Retry, d.Reason, retry, of)
		}
	}
	isFile := func(a *scheduler.PolicyAudit) bool { return strings.HasPrefix(a.Source, "file "+path) }
	fileAudits := func() []scheduler.PolicyAudit {
		var out []scheduler.PolicyAudit
		for _, m := range b.read(topology.StreamAudit, scheduler.PolicyAuditSubject()) {
			var a scheduler.PolicyAudit
			if err := events.Unmarshal(m.Data(), &a); err != nil {
				t.Fatal(err)
			}
			if isFile(&a) {
				out = append(out, a)
			}
		}
		return out
	}

	// max_retries 1 from the file: one retry, then give_up.
	expect("first failure under the file's max_retries 1", step(), events.ActionRetry, 1, 1)
	expect("second failure under the file's max_retries 1", step(), events.ActionGiveUp, 0, 0)

	// The file rewritten with max_retries 3: a new policy key, a new budget.
	writeFile(t, path, three)
	a := b.waitAudit("the rewritten file applied", func(a *scheduler.PolicyAudit) bool {
		return isFile(a) && a.Kind == scheduler.PolicyApplied
	})
	if a.PolicyKey != retryKey(t, three) || a.PolicyKey == retryKey(t, one) || a.Revision != 0 {
		t.Fatalf("audit %+v, want applied with the new file's policy key %s", a, retryKey(t, three))
	}
	expect("the same step under the file's max_retries 3", step(), events.ActionRetry, 1, 3)

	// The same content written again reloads nothing.
	writeFile(t, path, three)
	earlier := time.Now().Add(-time.Minute)
	if err := os.Chtimes(path, earlier, earlier); err != nil { // a new stat for certain
		t.Fatal(err)
	}
	b.poll("the identical rewrite noticed", func() bool { return logs.count("same content", path) > 0 })

	// An invalid rewrite: logged, counted, audited; the last good policy
	// stays in force and its budget goes on.
	writeFile(t, path, bad)
	r := b.waitAudit("the invalid file rejected", func(a *scheduler.PolicyAudit) bool {
		return isFile(a) && a.Kind == scheduler.PolicyRejected
	})
	if !strings.Contains(r.Error, "max_retrys") || !strings.Contains(r.Error, path) || r.PolicyKey != retryKey(t, three) {
		t.Fatalf("audit %+v, want rejected naming the file and the key, keeping the policy key %s", r, retryKey(t, three))
	}
	if logs.count("policy file rejected", "max_retrys", path) != 1 {
		t.Errorf("want one error line for the invalid file, log:\n%s", logs)
	}
	if got := reloads(t, reg, "file", scheduler.PolicyRejected); got != 1 {
		t.Errorf("rejected file reloads %v, want 1", got)
	}
	if got := gauge(t, reg, "failbus_scheduler_policy_file_valid"); got != 0 {
		t.Errorf("failbus_scheduler_policy_file_valid %v while the file is invalid, want 0", got)
	}
	expect("the same step while the file is invalid", step(), events.ActionRetry, 2, 3)
	if got := s.Policy().RetryFor("").Key(); got != retryKey(t, three) {
		t.Fatalf("policy key %s after the invalid file, want the last good %s", got, retryKey(t, three))
	}

	// A KV key overrides the file (max_retries 2: a budget of its own).
	rev := b.putPolicy(kvTwo)
	if a := b.waitPolicy(rev); a.Kind != scheduler.PolicyApplied || a.PolicyKey != retryKey(t, kvTwo) {
		t.Fatalf("KV audit %+v, want applied with key %s", a, retryKey(t, kvTwo))
	}
	expect("the same step under the KV's max_retries 2", step(), events.ActionRetry, 1, 2)

	// A valid file rewrite while the KV key exists is loaded, not in force.
	writeFile(t, path, four)
	sh := b.waitAudit("the file shadowed by KV", func(a *scheduler.PolicyAudit) bool {
		return isFile(a) && a.Kind == scheduler.PolicyShadowed
	})
	if sh.PolicyKey != retryKey(t, kvTwo) {
		t.Fatalf("audit %+v, want shadowed with the KV policy key %s still in force", sh, retryKey(t, kvTwo))
	}
	if got := gauge(t, reg, "failbus_scheduler_policy_file_valid"); got != 1 {
		t.Errorf("failbus_scheduler_policy_file_valid %v after a valid rewrite, want 1", got)
	}
	expect("the same step while KV overrides the file", step(), events.ActionRetry, 2, 2)

	// The KV key deleted: the file's current content applies.
	kv, err := b.js.KeyValue(b.ctx, topology.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(b.ctx, scheduler.PolicyKVKey); err != nil {
		t.Fatal(err)
	}
	rm := b.waitAudit("the KV removal audited", func(a *scheduler.PolicyAudit) bool { return a.Kind == scheduler.PolicyRemoved })
	if rm.PolicyKey != retryKey(t, four) {
		t.Fatalf("audit %+v, want removed with the file's current key %s", rm, retryKey(t, four))
	}
	expect("the same step back on the file's max_retries 4", step(), events.ActionRetry, 1, 4)

	var kinds []string
	for _, a := range fileAudits() {
		kinds = append(kinds, a.Kind)
	}
	if got := strings.Join(kinds, ","); got != "applied,rejected,shadowed" {
		t.Errorf("file audits %s, want applied,rejected,shadowed (nothing for the identical rewrite)", got)
	}
	if got := reloads(t, reg, "file", scheduler.PolicyApplied); got != 1 {
		t.Errorf("applied file reloads %v, want 1", got)
	}
}

func TestPolicyFileUnusableAtStart(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		content  string // "" for no file at all
		fallback bool   // Options.Policy set
		wantErr  string // Run's error; "" when it runs on Options.Policy
	}{
		{"missing, no fallback", "", false, "no such file"},
		{"invalid, no fallback", "retry:\n  max_retrys: 1\n", false, "max_retrys"},
		{"missing, Options.Policy kept", "", true, ""},
		{"invalid, Options.Policy kept", "retry: [\n", true, ""},
	}
	b := setup(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := &bench{t: t, ctx: b.ctx, srv: b.srv, nc: b.nc, js: b.js}
			path := filepath.Join(t.TempDir(), "policy.yaml")
			if tc.content != "" {
				writeFile(t, path, tc.content)
			}
			reg := prometheus.NewRegistry()
			logs := &syncBuffer{}
			opts := scheduler.Config{
				PolicyFile: path, PolicyPollInterval: 10 * time.Millisecond,
				Runner: consumer.Config{Registerer: reg, Logger: zerolog.New(logs), FetchWait: 100 * time.Millisecond},
			}
			fallback, err := policy.Parse([]byte("retry:\n  max_retries: 7\n"))
			if err != nil {
				t.Fatal(err)
			}
			if tc.fallback {
				opts.Policy = fallback
			}
			if tc.wantErr != "" {
				s, err := scheduler.New(b.js, opts)
				if err != nil {
					t.Fatal(err)
				}
				err = s.Run(b.ctx)
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Run: %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			s, _ := b.start(opts)
			if got := s.Policy().RetryFor("").Key(); got != fallback.RetryFor("").Key() {
				t.Errorf("policy key %s, want Options.Policy's", got)
			}
			if logs.count("policy file rejected", path) != 1 {
				t.Errorf("want one error line naming the file, log:\n%s", logs)
			}
			if got := gauge(t, reg, "failbus_scheduler_policy_file_valid"); got != 0 {
				t.Errorf("failbus_scheduler_policy_file_valid %v, want 0", got)
			}
			// Once the file is fixed, it applies.
			writeFile(t, path, "retry:\n  max_retries: 5\n")
			b.poll("the fixed file applied", func() bool { return s.Policy().Retry.MaxRetries == 5 })
			if got := gauge(t, reg, "failbus_scheduler_policy_file_valid"); got != 1 {
				t.Errorf("failbus_scheduler_policy_file_valid %v after the fix, want 1", got)
			}
		})
	}
}

// Retry episodes on the bus: an agent without turn and step fails, its call goes
// through, then fails again — two retry episodes, each retry 1, distinct
// retry ids; the success is marked in the budget's ledger (ended_by), and
// the second retry's lookup starts at its episode (episode_from).
func TestRetryEpisodesWithoutTurnAndStepOnTheLedger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(scheduler.Config{})
	t0 := time.Now().Add(-time.Hour)
	first := cls("e1", "loose", "openai", "k", events.ClassServerError, 0, 0, 0)
	first.At = events.At(t0)
	b.publish(first, "")
	d1 := b.decisionOf("loose", "e1")
	ok := cls("e2", "loose", "openai", "k", events.ClassOK, 0, 0, 0)
	ok.At = events.At(d1.DueAt.Add(time.Second))
	b.publish(ok, "")
	// The scheduler decides several classifications at once: the next
	// failure goes out once the success is marked, as a retry's outcome
	// comes after its success would.
	token := budgetToken(first, policy.Default())
	b.poll("the success's end mark", func() bool { return len(b.ledger(token)) == 2 })
	again := cls("e3", "loose", "openai", "k", events.ClassServerError, 0, 0, 0)
	again.At = events.At(d1.DueAt.Add(2 * time.Second))
	b.publish(again, "")
	d3 := b.decisionOf("loose", "e3")
	if d1.Action != events.ActionRetry || d1.Retry != 1 || d3.Action != events.ActionRetry || d3.Retry != 1 || d1.RetryID == d3.RetryID {
		t.Fatalf("decisions %+v and %+v, want retry 1 each with distinct ids", d1, d3)
	}
	if !strings.Contains(d3.Reason, "new retry episode: success e2") {
		t.Errorf("reason %q does not say the success ended the previous episode", d3.Reason)
	}
	b.waitIdle()
	led := b.ledger(token)
	if len(led) != 3 || led[1].EndedBy != "e2" || led[2].OutcomeID != "e3" || led[2].EpisodeFrom == 0 || led[2].Seq != 2 {
		t.Fatalf("ledger %+v, want e1's record, the end mark by e2, and e3's record (seq 2) from the mark on", led)
	}
}

// A rate limit's end on the bus: a rate limit on every profile ends (health healthy
// on failbus.health) when a later failure finds the profiles it counted
// out of scope.window — not only at a success.
func TestProviderRateLimitEndsOnTheHealthSubject(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.start(scheduler.Config{})
	t0 := time.Now().Add(-26 * time.Hour)
	for i, p := range []string{"p1", "p2"} {
		c := cls("rl"+p, "rl-agent", "rl-provider", p, events.ClassRateLimit, i+1, 1, 0)
		c.At = events.At(t0.Add(time.Duration(i) * time.Second))
		b.publish(c, "")
		b.decisionOf("rl-agent", c.OutcomeID)
	}
	later := cls("later", "rl-agent", "rl-provider", "p3", events.ClassServerError, 3, 1, 0)
	b.publish(later, "")
	d := b.decisionOf("rl-agent", "later")
	if strings.Contains(d.Reason, "rate-limited") {
		t.Errorf("a day later: reason %q still waits for the rate limit", d.Reason)
	}
	var states []string
	b.poll("health degraded then healthy", func() bool {
		states = states[:0]
		for _, h := range b.health("rl-provider") {
			states = append(states, h.State)
		}
		return len(states) >= 2
	})
	if strings.Join(states, " ") != "degraded healthy" {
		t.Fatalf("health %v, want degraded then healthy", states)
	}
}

// The end mark a success writes keeps the agent's cancel: a late
// redelivery of the cancelled failure finds it and restores no schedule.
func TestAnEpisodeEndKeepsTheCancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	b.start(scheduler.Config{Runner: consumer.Config{Registerer: reg}})
	ag, err := agent.New(b.nc, "quitter")
	if err != nil {
		t.Fatal(err)
	}
	c := cls("q-1", "quitter", "openai", "k", events.ClassOverloaded, 0, 0, 3000)
	b.publish(c, "")
	d := b.decisionOf("quitter", "q-1")
	if err := ag.Cancel(b.ctx, d.RetryID); err != nil {
		t.Fatal(err)
	}
	b.poll("the schedule purged", func() bool { return b.schedulesOf("quitter") == 0 })
	b.waitIdle()
	ok := cls("q-ok", "quitter", "openai", "k", events.ClassOK, 0, 0, 0)
	ok.At = events.At(time.Now())
	b.publish(ok, "")
	token := budgetToken(c, policy.Default())
	b.poll("the end mark", func() bool { return len(b.ledger(token)) == 3 })
	led := b.ledger(token)
	if last := led[2]; last.EndedBy != "q-ok" || !last.Cancelled() {
		t.Fatalf("end mark %+v, want ended by q-ok and still cancelled", last)
	}
	b.publish(c, "redelivery:q-1")
	b.waitIdle()
	if got := counter(t, reg, "failbus_scheduler_schedules_restored_total"); got != 0 {
		t.Errorf("schedules restored: %v, want 0 (the retry was cancelled)", got)
	}
	if n := b.schedulesOf("quitter"); n != 0 {
		t.Errorf("%d schedules pending, want none", n)
	}
}

// failbus_scheduler_decisions_total counts a decision without a retry once
// it is stored, and not when a delivery finds it stored already (the
// decision of an earlier delivery that died before its ack).
func TestDecisionsAreCountedOnceStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	reg := prometheus.NewRegistry()
	b.start(scheduler.Config{Runner: consumer.Config{Registerer: reg}})
	giveUps := func() float64 {
		return labeledCounter(t, reg, "failbus_scheduler_decisions_total", map[string]string{"action": events.ActionGiveUp})
	}

	b.publish(cls("first", "ag", "openai", "k", events.ClassAuth, 1, 1, 0), "")
	b.decisionOf("ag", "first")
	b.waitIdle()
	if got := giveUps(); got != 1 {
		t.Fatalf("give_up decisions counted after one was stored: %v, want 1", got)
	}

	// What a scheduler that died after storing the decision of "second"
	// left behind, under the id the runner gives that output.
	c := cls("second", "ag", "openai", "k", events.ClassAuth, 1, 2, 0)
	input := msgid.Output("classifier", c.OutcomeID, "0")
	stored := &events.Decision{OutcomeID: c.OutcomeID, At: c.At, Agent: c.Agent, Provider: c.Provider, Action: events.ActionGiveUp, Reason: "stored by a delivery that died"}
	data, hdr, err := events.Encode(stored)
	if err != nil {
		t.Fatal(err)
	}
	hdr.Set(nats.MsgIdHdr, msgid.Output(scheduler.Name, input, "decision"))
	if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: events.DecisionSubject(c.Agent), Header: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
	b.publish(c, input)
	b.waitIdle()
	var seconds int
	for _, d := range b.decisions("ag") {
		if d.OutcomeID == "second" {
			seconds++
		}
	}
	if seconds != 1 {
		t.Fatalf("decisions of the redelivered outcome: %d, want the one stored before", seconds)
	}
	if got := giveUps(); got != 1 {
		t.Errorf("give_up decisions counted after a delivery found its decision stored: %v, want still 1", got)
	}
}

// TestClassificationsShareTheNextScopeWrite: a classification does not
// wait for the fault-scope write that stores its fold unless the fold
// left records to publish: a success's handler returns at once, a
// failure's is decided at once, and each stays unacknowledged until the
// provider's next write, which the linger ends, or a stopping scheduler
// before its drain ends (one write for all). Each is acknowledged only
// once that write is stored.
func TestClassificationsShareTheNextScopeWrite(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		linger  time.Duration
		then    string // "failure", "linger" or "stop"
		wantOne bool   // exactly one write of the provider's record
	}{
		{name: "a failure is decided before the write", linger: time.Hour, then: "failure", wantOne: true},
		{name: "the linger ends", linger: 50 * time.Millisecond, then: "linger"},
		{name: "a stopping scheduler writes them", linger: time.Hour, then: "stop", wantOne: true},
		{name: "another writer came first", linger: time.Hour, then: "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var handled atomic.Int32 // classifications through the handler
			count := func(h consumer.Handler) consumer.Handler {
				return func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
					err := h(ctx, m, out)
					if strings.HasPrefix(m.Subject, "failbus.classified.") {
						handled.Add(1)
					}
					return err
				}
			}
			_, stop := b.start(scheduler.Config{ScopeLinger: tc.linger, Runner: consumer.Config{Middleware: []consumer.Middleware{count}}})
			cons, err := b.js.Consumer(b.ctx, topology.StreamClassified, topology.ConsumerScheduler)
			if err != nil {
				t.Fatal(err)
			}
			const n = 5
			for i := range n { // one session: its lane takes each in turn
				b.publish(cls(fmt.Sprintf("ok-%d", i), "ag", "deepseek", "key-1", events.ClassOK, 1, i+1, 0), "")
			}
			if tc.linger == time.Hour {
				// Handled, not only delivered: a stopping runner hands
				// back what no worker has started.
				b.poll("every success handled, none acknowledged", func() bool {
					info, err := cons.Info(b.ctx)
					return handled.Load() == n && err == nil && info.NumPending == 0 && info.NumAckPending == n
				})
				kv := b.scopeBucket()
				if _, err := kv.Get(b.ctx, "deepseek"); !errors.Is(err, jetstream.ErrKeyNotFound) {
					t.Fatalf("fault scope written while its successes linger: %v", err)
				}
			}
			calls := n
			switch tc.then {
			case "failure":
				// Of another profile: key-1 still works, so the fold
				// changes no health and publishes nothing.
				b.publish(cls("rl-1", "ag", "deepseek", "key-2", events.ClassRateLimit, 1, n+1, 30_000), "")
				calls++
				if d := b.decisionOf("ag", "rl-1"); d.Action != events.ActionSwitchProfile {
					t.Errorf("the failure: %s, want switch_profile", d.Action)
				}
				b.poll("the failure handled, nothing acknowledged", func() bool {
					info, err := cons.Info(b.ctx)
					return handled.Load() == n+1 && err == nil && info.NumAckPending == n+1
				})
				kv := b.scopeBucket()
				if _, err := kv.Get(b.ctx, "deepseek"); !errors.Is(err, jetstream.ErrKeyNotFound) {
					t.Fatalf("fault scope written before the linger ends: %v", err)
				}
				stop()
			case "stop":
				stop()
			case "other":
				// A replica writes the key meanwhile: the lane's
				// write fails on the revision, and its folds go on top
				// of the other's record, nothing of either lost.
				other, err := scopestore.Open(b.ctx, b.js, scopestore.Options{})
				if err != nil {
					t.Fatal(err)
				}
				if err := other.Update(b.ctx, "deepseek", func(rec *engine.ProviderRecord) (bool, error) {
					rec.Seq = 41
					return true, nil
				}); err != nil {
					t.Fatal(err)
				}
				stop()
			}
			b.waitIdle() // every classification acknowledged
			kv := b.scopeBucket()
			// The bucket keeps one value per key; deepseek is its only
			// key, so the key's revision counts the writes to it.
			e, err := kv.Get(b.ctx, "deepseek")
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantOne && e.Revision() != 1 {
				t.Errorf("%d writes of the fault scope, want one for all", e.Revision())
			}
			rec, err := scopestore.DecodeRecord(e.Value())
			if err != nil {
				t.Fatal(err)
			}
			if got := len(rec.State.Calls); got != calls {
				t.Errorf("the fault scope holds %d calls, want %d: %+v", got, calls, rec.State.Calls)
			}
			if tc.then == "other" && (e.Revision() != 2 || rec.Seq != 41) {
				t.Errorf("%d writes, record seq %d; want the other writer's and one on top of it (seq 41)", e.Revision(), rec.Seq)
			}
		})
	}
}

// A classification is acknowledged only once the fault-scope write that
// holds its fold is stored, up to a linger after it is handled, so the
// scheduler's window must hold everything that arrives in a linger: more
// than the runner's default of 256 here, all handled while none is
// written, then one write for all of them.
func TestALingerHoldsMoreThanTheRunnersDefaultWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var handled atomic.Int32
	count := func(h consumer.Handler) consumer.Handler {
		return func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
			err := h(ctx, m, out)
			handled.Add(1)
			return err
		}
	}
	reg := prometheus.NewRegistry()
	_, stop := b.start(scheduler.Config{ScopeLinger: time.Hour, Runner: consumer.Config{Registerer: reg, Middleware: []consumer.Middleware{count}}})
	// A window too small fills with inputs waiting for the write; they
	// give up waiting after the runner's settle timeout and are handed
	// back, which frees room for the rest: handled, but not in one linger.
	failed := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0.0
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if mf.GetName() == "failbus_consumer_messages_total" && l.GetName() == "result" && l.GetValue() != "ack" {
						n += m.GetCounter().GetValue()
					}
				}
			}
		}
		return n
	}
	cons, err := b.js.Consumer(b.ctx, topology.StreamClassified, topology.ConsumerScheduler)
	if err != nil {
		t.Fatal(err)
	}
	const n = 400
	for i := range n {
		b.publish(cls(fmt.Sprintf("ok-%d", i), fmt.Sprintf("ag-%d", i%40), "deepseek", "key-1", events.ClassOK, 1, i+1, 0), "")
	}
	b.poll("every success handled, none acknowledged or handed back", func() bool {
		if f := failed(); f > 0 {
			t.Fatalf("%v inputs settled otherwise than acknowledged while their fold waited for the write", f)
		}
		info, err := cons.Info(b.ctx)
		return handled.Load() == n && err == nil && info.NumPending == 0 && info.NumAckPending == n
	})
	stop()
	b.waitIdle() // every classification acknowledged
	kv := b.scopeBucket()
	if e, err := kv.Get(b.ctx, "deepseek"); err != nil || e.Revision() != 1 {
		t.Fatalf("the fault scope after the stop: %v, want one write for all (revision 1)", err)
	}
}
