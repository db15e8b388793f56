package e2e

// Acceptance of the durable scheduler on a real nats-server:
//
//   - 10,000 retries with delays spread over 1–20 s come due exactly once,
//     none early; the lateness (when JetStream stored the due message minus
//     its due time) is logged as p50/p90/p99/max.
//   - A scheduler process SIGKILLed at each point between ledger write,
//     schedule and decision, then restarted: no retry lost or doubled, every
//     budget exact.
//   - A retry scheduled before the whole `failbus dev` process is SIGKILLed
//     comes due once after a restart on the same data folder.
//
// "Exactly once" is counted on the streams themselves.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/service/scheduler"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// schBench is one embedded server with the topology applied.
type schBench struct {
	t   *testing.T
	ctx context.Context
	srv *embedded.Server
	js  jetstream.JetStream
}

func schSetup(t *testing.T, timeout time.Duration) *schBench {
	t.Helper()
	bus := bustest.Start(t, timeout)
	srv, js, ctx := bus.Srv, bus.JS, bus.Ctx
	return &schBench{t: t, ctx: ctx, srv: srv, js: js}
}

func (b *schBench) poll(what string, every time.Duration, cond func() bool) {
	b.t.Helper()
	for !cond() {
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("timed out waiting for %s", what)
		case <-time.After(every): // poll interval, bounded by b.ctx
		}
	}
}

// startScheduler runs a scheduler in this process until the test ends.
func (b *schBench) startScheduler(opts scheduler.Config) *scheduler.Service {
	b.t.Helper()
	s, err := scheduler.New(b.js, opts)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("scheduler Run: %v", err)
		}
	})
	b.poll("scheduler healthy", 20*time.Millisecond, func() bool { return s.Healthy() == nil })
	return s
}

// schClassified is a retryable failure with a provider's hint of afterMS:
// a 429 of the only profile (neither a provider-wide rate limit nor, as
// thousands of 5xx without a success would be, a provider that is down),
// so each is a retry after the hint.
func schClassified(id, agentName string, turn, step int, afterMS int64) *events.Classification {
	return &events.Classification{
		OutcomeID: id, At: events.At(time.Now()), Agent: agentName, Provider: "openai", Model: "gpt-4.1", Profile: "key-a",
		Class: events.ClassRateLimit, Retryable: true, Scope: events.ScopeProfile, Rule: "test",
		Session: "s", Segment: 1, Turn: turn, Step: step,
		Hints: &events.RetryHints{AfterMS: afterMS, Source: "retry-after-ms"},
	}
}

// schPublishWindow bounds the asynchronous publishes in flight. It must
// stay below nats.go's PublishAsyncMaxPending (4000): above it, a publish
// stalls and fails with ErrTooManyStalledMsgs after 200 ms without an ack,
// which a loaded machine (the race detector, the scheduler consuming at
// the same time) can reach.
const schPublishWindow = 1000

// publish stores classifications as the classifier does, asynchronously,
// at most schPublishWindow unacknowledged at a time.
func (b *schBench) publish(cs []*events.Classification) {
	b.t.Helper()
	for len(cs) > 0 {
		window := cs[:min(len(cs), schPublishWindow)]
		cs = cs[len(window):]
		futures := make([]jetstream.PubAckFuture, len(window))
		for i, c := range window {
			data, hdr, err := events.Encode(c)
			if err != nil {
				b.t.Fatal(err)
			}
			hdr.Set(nats.MsgIdHdr, msgid.Output("classifier", c.OutcomeID, "0"))
			if futures[i], err = b.js.PublishMsgAsync(&nats.Msg{Subject: events.ClassifiedSubject(c.Provider, c.Class), Header: hdr, Data: data}); err != nil {
				b.t.Fatalf("publish %s: %v", c.OutcomeID, err)
			}
		}
		for i, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.t.Fatalf("publish %s: %v", window[i].OutcomeID, err)
			case <-b.ctx.Done():
				b.t.Fatal("publish: timed out")
			}
		}
	}
}

// subjects counts the messages FAILBUS_RETRIES holds per subject on filter.
func (b *schBench) subjects(filter string) map[string]uint64 {
	b.t.Helper()
	s, err := b.js.Stream(b.ctx, topology.StreamRetries)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(b.ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		b.t.Fatal(err)
	}
	return info.State.Subjects
}

func sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// read returns every message of stream on filter, in order, and removes
// its consumer.
func (b *schBench) read(stream, filter string) []jetstream.Msg {
	b.t.Helper()
	c, err := b.js.OrderedConsumer(b.ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		b.t.Fatal(err)
	}
	defer func() { _ = b.js.DeleteConsumer(b.ctx, stream, c.CachedInfo().Name) }()
	pending := c.CachedInfo().NumPending
	out := make([]jetstream.Msg, 0, pending)
	for uint64(len(out)) < pending {
		batch, err := c.Fetch(int(min(pending-uint64(len(out)), 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			out = append(out, m)
			got++
		}
		if got == 0 {
			b.t.Fatalf("%s %s: read %d of %d", stream, filter, len(out), pending)
		}
	}
	return out
}

// schDue is a due message as stored.
type schDue struct {
	events.RetryDue
	stored time.Time
	from   string // Nats-Scheduler: the schedule it fired from
}

func (b *schBench) dues() []schDue {
	b.t.Helper()
	var out []schDue
	for _, m := range b.read(topology.StreamRetries, events.RetryPrefix+".due.>") {
		var r events.RetryDue
		if err := events.Unmarshal(m.Data(), &r); err != nil {
			b.t.Fatal(err)
		}
		md, err := m.Metadata()
		if err != nil {
			b.t.Fatal(err)
		}
		out = append(out, schDue{RetryDue: r, stored: md.Timestamp, from: m.Headers().Get(scheduler.HeaderScheduler)})
	}
	return out
}

func (b *schBench) decisions() []events.Decision {
	b.t.Helper()
	var out []events.Decision
	for _, m := range b.read(topology.StreamDecisions, events.DecisionPrefix+".>") {
		d, err := events.DecodeAs[*events.Decision](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			b.t.Fatal(err)
		}
		out = append(out, *d)
	}
	return out
}

// schedulerIdle: everything FAILBUS_CLASSIFIED holds is delivered and
// acknowledged.
func (b *schBench) schedulerIdle() bool {
	b.t.Helper()
	ok, err := embedded.CaughtUp(b.ctx, b.js, topology.StreamClassified, topology.ConsumerScheduler)
	if err != nil {
		b.t.Fatal(err)
	}
	return ok
}

// checkDues fails unless every retry id of want came due exactly once, not
// early, from its own schedule, and nothing else came due; it returns the
// lateness of each.
func (b *schBench) checkDues(want map[string]events.Decision) []time.Duration {
	b.t.Helper()
	seen := map[string]int{}
	late := make([]time.Duration, 0, len(want))
	early := 0
	for _, d := range b.dues() {
		seen[d.RetryID]++
		dec, ok := want[d.RetryID]
		if !ok {
			b.t.Errorf("retry %s came due but no decision announced it", d.RetryID)
			continue
		}
		if !d.DueAt.Equal(dec.DueAt.Time) {
			b.t.Errorf("retry %s: due message says %v, decision %v", d.RetryID, d.DueAt, dec.DueAt)
		}
		if want := events.RetryScheduleSubject(dec.Agent, d.RetryID); d.from != want {
			b.t.Errorf("retry %s fired from %q, want %q", d.RetryID, d.from, want)
		}
		l := d.stored.Sub(d.DueAt.Time)
		if l < 0 {
			early++
			if early <= 5 {
				b.t.Errorf("retry %s came due %v early", d.RetryID, -l)
			}
		}
		late = append(late, l)
	}
	if early > 5 {
		b.t.Errorf("%d retries came due early in all", early)
	}
	doubled, lost := 0, 0
	for id := range want {
		switch seen[id] {
		case 1:
		case 0:
			lost++
			if lost <= 5 {
				b.t.Errorf("retry %s never came due", id)
			}
		default:
			doubled++
			if doubled <= 5 {
				b.t.Errorf("retry %s came due %d times", id, seen[id])
			}
		}
	}
	if lost+doubled > 0 {
		b.t.Errorf("%d retries lost, %d doubled, of %d", lost, doubled, len(want))
	}
	return late
}

// percentile of sorted durations, nearest rank.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// TestSchedulerTenThousandRetriesComeDueExactlyOnceNoneEarly schedules
// 10,000 retries whose delays (the provider's hint, taken exactly) spread
// evenly over 1–20 s, and checks every one on the stream: due exactly once,
// never before its due time. It asserts no lateness bound (wall-clock
// thresholds make flaky tests); it logs the distribution, the figures
// quoted in the README:
//
//	go test -race -run TestSchedulerTenThousand -v ./e2e/
func TestSchedulerTenThousandRetriesComeDueExactlyOnceNoneEarly(t *testing.T) {
	if testing.Short() {
		t.Skip("needs about 25 s of real time")
	}
	t.Parallel()
	const n = 10_000
	b := schSetup(t, 4*time.Minute)
	reg := prometheus.NewRegistry()
	b.startScheduler(scheduler.Config{Runner: consumer.Config{
		Concurrency: 16, FetchBatch: 128, FetchWait: 200 * time.Millisecond, Registerer: reg,
	}})
	cs := make([]*events.Classification, n)
	for i := range n {
		delay := 1000 + int64(i)*19_000/(n-1) // 1 s … 20 s, evenly
		cs[i] = schClassified(fmt.Sprintf("due-%05d", i), fmt.Sprintf("agent-%02d", i%50), i, 1, delay)
	}
	start := time.Now()
	b.publish(cs)
	b.poll("every classification decided", 250*time.Millisecond, b.schedulerIdle)
	decided := time.Since(start)
	ds := b.decisions()
	want := make(map[string]events.Decision, n)
	for _, d := range ds {
		if d.Action != events.ActionRetry {
			t.Fatalf("decision %+v, want retry", d)
		}
		if _, dup := want[d.RetryID]; dup {
			t.Fatalf("retry %s decided twice", d.RetryID)
		}
		want[d.RetryID] = d
	}
	if len(want) != n {
		t.Fatalf("%d retry decisions, want %d", len(want), n)
	}
	b.poll("every retry due", 250*time.Millisecond, func() bool {
		return sum(b.subjects(events.RetryPrefix+".due.>")) >= n && len(b.subjects(events.RetryPrefix+".sched.>")) == 0
	})
	elapsed := time.Since(start)
	late := b.checkDues(want)
	slices.Sort(late)
	t.Logf("scheduler: %d retries, delays 1-20 s, decided (ledger, schedule, decision) in %v; all due %v after the first publish",
		n, decided.Round(time.Millisecond), elapsed.Round(time.Millisecond))
	t.Logf("lateness (stored - due_at) over %d: p50 %v  p90 %v  p99 %v  max %v  min %v",
		len(late), percentile(late, .50).Round(time.Millisecond), percentile(late, .90).Round(time.Millisecond),
		percentile(late, .99).Round(time.Millisecond), late[len(late)-1].Round(time.Millisecond), late[0].Round(time.Millisecond))
}

// Environment of the scheduler child process.
const (
	schChildURL   = "FAILBUS_TEST_SCHEDULER_CHILD"
	schChildPoint = "FAILBUS_TEST_SCHEDULER_CRASH_POINT"
	schChildAt    = "FAILBUS_TEST_SCHEDULER_CRASH_AT"
)

// TestSchedulerCrashChild is not a test: it is the scheduler process that
// TestSchedulerKilledBetweenLedgerScheduleAndDecision kills. It runs the
// scheduler, and the crashAt-th time a handler reaches the crash point it
// SIGKILLs itself there, with its other handlers wherever they are.
func TestSchedulerCrashChild(t *testing.T) {
	url := os.Getenv(schChildURL)
	if url == "" {
		t.Skip("helper process of TestSchedulerKilledBetweenLedgerScheduleAndDecision")
	}
	point := os.Getenv(schChildPoint)
	crashAt, err := strconv.Atoi(os.Getenv(schChildAt))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		reached int
	)
	hook := func(p string) {
		if p != point {
			return
		}
		mu.Lock()
		reached++
		kill := reached == crashAt
		mu.Unlock()
		if kill {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // SIGKILL is not caught; nothing after this runs
		}
	}
	err = scheduler.Run(context.Background(), nc, scheduler.Config{
		WatchPolicy: true,
		CrashAt:     hook,
		Runner:      consumer.Config{Concurrency: 8, FetchBatch: 16, FetchWait: 100 * time.Millisecond},
	})
	t.Fatalf("child scheduler returned: %v", err)
}

// TestSchedulerKilledBetweenLedgerScheduleAndDecision: 40 steps fail 5
// times each under a budget of 3 retries. Scheduler processes are
// SIGKILLed in turn right after a ledger write, right after a schedule,
// and right after a decision (each time with other handlers in flight at
// other points), each followed by a fresh process that gets the
// unacknowledged classifications again; a last one finishes. Then: every
// outcome has exactly one decision, every step exactly retries 1, 2, 3 and
// two give_ups, its ledger exactly 3 records, and every retry comes due
// exactly once, none early.
func TestSchedulerKilledBetweenLedgerScheduleAndDecision(t *testing.T) {
	t.Parallel()
	b := schSetup(t, 4*time.Minute)
	// Redeliver unacknowledged classifications after 2s instead of the
	// topology's 30s, so the test does not wait it out.
	stream, cc, ok := topology.Consumer(topology.ConsumerScheduler)
	if !ok {
		t.Fatal("no scheduler consumer in the topology")
	}
	cc.AckWait, cc.BackOff = 2*time.Second, nil
	if _, err := b.js.UpdateConsumer(b.ctx, stream, cc); err != nil {
		t.Fatalf("shorten AckWait: %v", err)
	}
	const budgetYAML = "retry:\n  max_retries: 3\n"
	kv, err := b.js.KeyValue(b.ctx, topology.BucketPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(b.ctx, scheduler.PolicyKVKey, []byte(budgetYAML)); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse([]byte(budgetYAML))
	if err != nil {
		t.Fatal(err)
	}

	const steps, fails = 40, 5
	var cs []*events.Classification
	for f := range fails {
		for s := range steps {
			// Delays of 1.5–3.5 s: most retries fall due while processes
			// are being killed and restarted.
			cs = append(cs, schClassified(fmt.Sprintf("k-%02d-%d", s, f), fmt.Sprintf("agent-%d", s%4), s, 1, 1500+int64(s)*50))
		}
	}
	b.publish(cs)

	kills := []struct {
		point string
		at    int
	}{
		{scheduler.CrashAfterLedger, 6},
		{scheduler.CrashAfterSchedule, 6},
		{scheduler.CrashAfterDecision, 6},
		{scheduler.CrashAfterLedger, 12},
	}
	for _, k := range kills {
		child := exec.CommandContext(b.ctx, os.Args[0], "-test.run=^TestSchedulerCrashChild$")
		child.Env = append(os.Environ(), schChildURL+"="+b.srv.ClientURL(), schChildPoint+"="+k.point, schChildAt+"="+strconv.Itoa(k.at))
		var out bytes.Buffer
		child.Stdout, child.Stderr = &out, &out
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		err := child.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("scheduler child for %s #%d ended with %v, want SIGKILL at the crash point:\n%s", k.point, k.at, err, out.String())
		}
		c, err := b.js.Consumer(b.ctx, topology.StreamClassified, topology.ConsumerScheduler)
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("killed at %s #%d: %d ledger records, %d decisions stored; %d classifications acknowledged (ack floor), %d in flight",
			k.point, k.at, sum(b.subjects(events.RetryPrefix+".ledger.>")), len(b.decisions()), info.AckFloor.Stream, info.NumAckPending)
		// The next process starts once what this one left in flight is due
		// for redelivery, so it replays those first (and may die in them).
		killed := time.Now()
		b.poll("the AckWait of the killed process's deliveries", 50*time.Millisecond, func() bool { return time.Since(killed) > cc.AckWait })
	}

	reg := prometheus.NewRegistry()
	b.startScheduler(scheduler.Config{WatchPolicy: true, Runner: consumer.Config{Concurrency: 8, FetchWait: 100 * time.Millisecond, Registerer: reg}})
	b.poll("every classification decided", 100*time.Millisecond, b.schedulerIdle)

	// Exactly one decision per outcome; per step, retries 1..3 once each.
	ds := b.decisions()
	perOutcome := map[string]int{}
	retries := map[string]events.Decision{}
	type tally struct{ retries, giveUps []int }
	perStep := map[string]*tally{}
	for _, d := range ds {
		perOutcome[d.OutcomeID]++
		step := d.OutcomeID[:len("k-00")]
		if perStep[step] == nil {
			perStep[step] = &tally{}
		}
		switch d.Action {
		case events.ActionRetry:
			retries[d.RetryID] = d
			perStep[step].retries = append(perStep[step].retries, d.Retry)
		case events.ActionGiveUp:
			if !strings.Contains(d.Reason, "3 of 3") {
				t.Errorf("%s: give_up %q, want the exhausted budget", d.OutcomeID, d.Reason)
			}
			perStep[step].giveUps = append(perStep[step].giveUps, 0)
		default:
			t.Errorf("%s: unexpected %s", d.OutcomeID, d.Action)
		}
	}
	for _, c := range cs {
		if perOutcome[c.OutcomeID] != 1 {
			t.Errorf("outcome %s has %d decisions, want 1", c.OutcomeID, perOutcome[c.OutcomeID])
		}
	}
	for step, tl := range perStep {
		slices.Sort(tl.retries)
		if !slices.Equal(tl.retries, []int{1, 2, 3}) || len(tl.giveUps) != fails-3 {
			t.Errorf("step %s: retries %v and %d give_up, want [1 2 3] and %d", step, tl.retries, len(tl.giveUps), fails-3)
		}
	}
	if len(perStep) != steps || len(retries) != steps*3 {
		t.Fatalf("%d steps decided, %d retries; want %d and %d", len(perStep), len(retries), steps, steps*3)
	}
	// The ledger of every budget holds exactly its three records.
	for s := range steps {
		c := schClassified("x", fmt.Sprintf("agent-%d", s%4), s, 1, 0)
		token := retry.BudgetFor(*c, pol.RetryFor(c.Provider)).Token()
		var got []int
		for _, m := range b.read(topology.StreamRetries, events.RetryLedgerSubject(token)) {
			e, err := scheduler.DecodeLedgerEntry(m.Headers(), m.Data())
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, e.Retry)
		}
		if !slices.Equal(got, []int{1, 2, 3}) {
			t.Errorf("step %d: ledger records %v, want [1 2 3]", s, got)
		}
	}
	// Every retry comes due exactly once, none early.
	b.poll("every retry due", 100*time.Millisecond, func() bool {
		return sum(b.subjects(events.RetryPrefix+".due.>")) >= uint64(len(retries)) && len(b.subjects(events.RetryPrefix+".sched.>")) == 0
	})
	late := b.checkDues(retries)
	slices.Sort(late)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var notes []string
	for _, mf := range mfs {
		switch mf.GetName() {
		case "failbus_scheduler_replays_total", "failbus_scheduler_schedules_restored_total", "failbus_scheduler_ledger_conflicts_total", "failbus_consumer_redeliveries_total":
			for _, m := range mf.GetMetric() {
				notes = append(notes, fmt.Sprintf("%s%s=%v", mf.GetName(), labelString(m.GetLabel()), m.GetCounter().GetValue()))
			}
		}
	}
	t.Logf("after %d kills: %d retries due once each (lateness p50 %v, max %v); last process: %s",
		len(kills), len(late), percentile(late, .5).Round(time.Millisecond), late[len(late)-1].Round(time.Millisecond), strings.Join(notes, " "))
	if n := len(b.read(topology.StreamDLQ, events.DLQSubject(scheduler.Name))); n != 0 {
		t.Errorf("%d dead letters, want 0", n)
	}
}

func labelString[L interface {
	GetName() string
	GetValue() string
}](ls []L) string {
	if len(ls) == 0 {
		return ""
	}
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.GetName() + "=" + l.GetValue()
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// TestSchedulerRetryComesDueOnceAfterDevIsSIGKILLed: an agent's two
// failures get retries (due in 2 s and 6 s); the whole `failbus dev` process
// is SIGKILLed at once, and restarted on the same data folder only after the
// first due time has passed. Both retries come due exactly once, not early:
// the first as soon as the server is back, the second on time.
func TestSchedulerRetryComesDueOnceAfterDevIsSIGKILLed(t *testing.T) {
	t.Parallel()
	port, dir := freePort(t), t.TempDir()
	dev := startDev(t, port, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nc, err := nats.Connect(dev.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	b := &schBench{t: t, ctx: ctx, js: js}

	const agentName = "sigkill-agent"
	for i, after := range []string{"6", "2"} {
		o := &events.Outcome{ID: fmt.Sprintf("dev-kill-%d", i), At: events.At(time.Now()), Agent: agentName, Provider: "openai",
			Model: "gpt-4.1", Profile: "key-a", Turn: i, Step: 1, Status: 503, Body: "service unavailable",
			Headers: map[string]string{"retry-after": after}}
		data, hdr, err := events.Encode(o)
		if err != nil {
			t.Fatal(err)
		}
		hdr.Set(nats.MsgIdHdr, o.ID)
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: hdr, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]events.Decision{}
	b.poll("both retries decided", 20*time.Millisecond, func() bool {
		clear(want)
		for _, d := range b.decisions() {
			if d.Action == events.ActionRetry {
				want[d.RetryID] = d
			}
		}
		return len(want) == 2
	})
	// SIGKILL the whole process: server, classifier, scheduler.
	if err := dev.stop(t, syscall.SIGKILL); err == nil {
		t.Fatal("SIGKILLed dev exited cleanly?")
	}
	killed := time.Now()
	var first, last time.Time
	for _, d := range want {
		if first.IsZero() || d.DueAt.Before(first) {
			first = d.DueAt.Time
		}
		if d.DueAt.After(last) {
			last = d.DueAt.Time
		}
	}
	if !killed.Before(first) {
		t.Logf("note: dev was killed %v after the first due time; it may have fired before the kill", killed.Sub(first))
	}
	// Stay down until the first retry's due time has passed.
	b.poll("the first due time to pass while dev is down", 50*time.Millisecond, func() bool { return time.Now().After(first.Add(500 * time.Millisecond)) })

	dev = startDev(t, port, dir)
	restarted := time.Now()
	b.poll("both retries due after the restart", 50*time.Millisecond, func() bool {
		return sum(b.subjects(events.RetryPrefix+".due.>")) >= 2 && len(b.subjects(events.RetryPrefix+".sched.>")) == 0
	})
	waitIdle(ctx, t, js, topology.StreamClassified, topology.ConsumerScheduler)
	late := b.checkDues(want)
	for _, d := range b.dues() {
		t.Logf("retry %s (due %s) stored %v after its due time, %v after the restart",
			d.RetryID, d.DueAt.Format("15:04:05.000"), d.stored.Sub(d.DueAt.Time).Round(time.Millisecond), d.stored.Sub(restarted).Round(time.Millisecond))
	}
	if len(late) != 2 {
		t.Errorf("%d due messages, want 2", len(late))
	}
	if n := len(b.decisions()); n != 2 {
		t.Errorf("%d decisions after the restart, want 2 (none doubled)", n)
	}
	if err := dev.stop(t, os.Interrupt); err != nil {
		t.Fatalf("dev after SIGINT: %v\n%s", err, dev.stderr.String())
	}
}
