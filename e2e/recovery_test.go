package e2e

// The eight-hour outage story on a real bus, compressed: subagents beat
// every 200 ms, the fault scope recovers after 3 successes over 1 s. An
// agent reports network failures until the scheduler's fault scope declares
// an outage; then every agent holds (wait_provider) and only answers the
// recovery service's probe controls, so the outage ends through probes.
// During it subagents die, crons miss their times (one succeeds anyway),
// memory writes fail (one is written again), and 40 tasks are submitted.
// After recovery the checklist must send exactly the expected commands,
// each once: the same ones whether one recovery service runs, two replicas
// race, or the service is SIGKILLed at each checklist step in turn.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/service/classifier"
	svc "github.com/failbus/failbus/internal/service/recoverer"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/servicespec"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

const (
	recProvider = "openai"
	recOther    = "anthropic"
	// recScopeYAML is the compressed hysteresis: 3 successes over 1 s.
	recScopeYAML = "scope:\n  recovery_min_successes: 3\n  recovery_min_time: 1s\n"
)

// recPolicy is the compressed recovery section.
func recPolicy() recovery.Config {
	return recovery.Config{DrainRate: 50, ProbeInterval: 300 * time.Millisecond}
}

type recBench struct {
	t   *testing.T
	url string
	nc  *nats.Conn
	ctx context.Context
	js  jetstream.JetStream
	// up is the fake provider: calls succeed while it is up.
	up atomic.Bool
}

func recSetup(t *testing.T, timeout time.Duration) *recBench {
	t.Helper()
	bus := bustest.Start(t, timeout)
	b := &recBench{t: t, url: bus.Srv.ClientURL(), nc: bus.NC, ctx: bus.Ctx, js: bus.JS}
	b.up.Store(true)
	return b
}

func (b *recBench) poll(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) || b.ctx.Err() != nil {
			b.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startPipeline runs the classifier and the scheduler with the compressed
// hysteresis, in this process.
func (b *recBench) startPipeline(scopeYAML string) {
	b.t.Helper()
	pol, err := policy.Parse([]byte(scopeYAML))
	if err != nil {
		b.t.Fatal(err)
	}
	cls, err := classifier.New(b.js, classifier.Config{Runner: consumer.Config{FetchWait: 100 * time.Millisecond}})
	if err != nil {
		b.t.Fatal(err)
	}
	sch, err := scheduler.New(b.js, scheduler.Config{Policy: pol, Runner: consumer.Config{FetchWait: 100 * time.Millisecond}})
	if err != nil {
		b.t.Fatal(err)
	}
	for _, r := range []ops.Runnable{cls, sch} {
		b.run(r)
	}
}

// run runs r until the test ends.
func (b *recBench) run(r ops.Runnable) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("%T: %v", r, err)
		}
	})
}

// startRecovery runs a recovery service in this process.
func (b *recBench) startRecovery(owner string) {
	b.t.Helper()
	s, err := svc.New(b.ctx, b.js, svc.Options{
		Policy: recPolicy(), Owner: owner, LeaseTTL: time.Second,
		Runner: consumer.Config{FetchWait: 100 * time.Millisecond},
	})
	if err != nil {
		b.t.Fatal(err)
	}
	b.run(s)
}

// read returns every message on filter, decoded, with its Nats-Msg-Id.
func (b *recBench) read(stream, filter string) ([]events.Message, []string) {
	b.t.Helper()
	c, err := b.js.OrderedConsumer(b.ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		b.t.Fatal(err)
	}
	defer b.js.DeleteConsumer(context.Background(), stream, c.CachedInfo().Name)
	n := int(c.CachedInfo().NumPending)
	var out []events.Message
	var ids []string
	for len(out) < n {
		batch, err := c.Fetch(n-len(out), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			b.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			v, err := events.Decode(m.Subject(), m.Headers(), m.Data())
			if err != nil {
				b.t.Fatalf("%s: %v", m.Subject(), err)
			}
			out = append(out, v)
			ids = append(ids, m.Headers().Get(nats.MsgIdHdr))
		}
		if got == 0 {
			b.t.Fatalf("read %s: %d of %d", filter, len(out), n)
		}
	}
	return out, ids
}

func recTyped[T events.Message](ms []events.Message) []T {
	var out []T
	for _, m := range ms {
		if v, ok := m.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func (b *recBench) records() []*events.Recovery {
	ms, _ := b.read(topology.StreamRecoveries, events.RecoverySubject(recProvider))
	return recTyped[*events.Recovery](ms)
}

func (b *recBench) done() bool {
	rs := b.records()
	return len(rs) > 0 && rs[len(rs)-1].Done
}

func (b *recBench) health() []*events.Health {
	ms, _ := b.read(topology.StreamHealth, events.HealthSubject(recProvider))
	return recTyped[*events.Health](ms)
}

func (b *recBench) healthIs(state string) bool {
	hs := b.health()
	return len(hs) > 0 && hs[len(hs)-1].State == state
}

// story is the agents' side of the story.
type story struct {
	b  *recBench
	ag *agent.Agent
	// anchor is the crons' declared time (their @every anchor).
	anchor time.Time
	subs   map[string]*agent.Subagent

	mu      sync.Mutex
	probes  int
	probeOK int
	reruns  []string // run_cron handled: cron@scheduled
	errs    []error
}

// The crons: every period from the anchor, with their catch-up mode and
// window.
var recCrons = []struct {
	name   string
	every  time.Duration
	mode   string
	window time.Duration
}{
	{"every-latest", 2 * time.Second, events.CatchupLatest, 0},
	{"every-all", time.Second, events.CatchupAll, 3 * time.Second},
	{"every-none", 2 * time.Second, events.CatchupNone, 0},
	{"every-ok", 2 * time.Second, events.CatchupAll, 0},
}

// call is one real call to the fake provider, reported as an outcome.
func (s *story) call(ctx context.Context, kind string) bool {
	o := &events.Outcome{Provider: recProvider, Profile: "p1", Model: "m", Origin: &events.Origin{Kind: kind}}
	ok := s.b.up.Load()
	if ok {
		o.OK, o.Status = true, 200
	} else {
		o.TransportError = "fetch failed: connect ECONNREFUSED"
	}
	if err := s.ag.Report(ctx, o); err != nil {
		s.fail(err)
	}
	return ok
}

func (s *story) fail(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

// beforeOutage starts the agent: 20 subagents beating, crons declared, the
// stale-to-be subagents' tasks dispatched, a write that fails before the
// outage.
func (b *recBench) beforeOutage() *story {
	b.t.Helper()
	s := &story{b: b, subs: map[string]*agent.Subagent{}}
	var err error
	s.ag, err = agent.New(b.nc, "coord", agent.WithErrorHandler(s.fail))
	if err != nil {
		b.t.Fatal(err)
	}
	hctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.ag.HandleControls(hctx, agent.ControlHandlers{
			Probe: func(ctx context.Context, c events.Control) error {
				ok := s.call(ctx, "probe")
				s.mu.Lock()
				s.probes++
				if ok {
					s.probeOK++
				}
				s.mu.Unlock()
				return nil
			},
			RunCron: func(ctx context.Context, c events.Control) error {
				s.mu.Lock()
				s.reruns = append(s.reruns, c.Cron+"@"+c.ScheduledAt.UTC().Format(time.RFC3339Nano))
				s.mu.Unlock()
				return s.ag.CronRun(ctx, events.CronRun{Cron: c.Cron, ScheduledAt: c.ScheduledAt, Status: events.CronOK, Provider: recProvider})
			},
			CheckWrite: func(ctx context.Context, c events.Control) error { return nil },
		})
	}()
	b.t.Cleanup(func() {
		cancel()
		<-done
	})
	ctx := b.ctx
	s.anchor = time.Now().UTC().Truncate(time.Second)
	for _, c := range recCrons {
		spec := events.CronSpec{At: events.At(s.anchor), Cron: c.name, Schedule: "@every " + c.every.String(), Provider: recProvider, Catchup: c.mode, CatchupWindow: events.Duration(c.window)}
		if err := s.ag.DeclareCron(ctx, spec); err != nil {
			b.t.Fatal(err)
		}
	}
	start := func(name, provider, task string, iv time.Duration) {
		sub, err := s.ag.StartSubagent(context.Background(), agent.SubagentConfig{Name: name, Provider: provider, TaskID: task, Interval: iv})
		if err != nil {
			b.t.Fatal(err)
		}
		s.subs[name] = sub
		b.t.Cleanup(sub.Stop)
	}
	for i := range 5 {
		id := fmt.Sprintf("job-stale-%d", i)
		if err := s.ag.SubmitTask(ctx, &events.Task{ID: id, Provider: recProvider, Kind: "research", Payload: recPayload(id)}); err != nil {
			b.t.Fatal(err)
		}
		start(fmt.Sprintf("stale-%d", i), recProvider, id, 200*time.Millisecond)
	}
	for i := range 2 {
		start(fmt.Sprintf("slow-%d", i), recProvider, "", 1500*time.Millisecond)
	}
	for i := range 4 {
		start(fmt.Sprintf("done-%d", i), recProvider, "", 200*time.Millisecond)
	}
	for i := range 3 {
		start(fmt.Sprintf("failed-%d", i), recProvider, "", 200*time.Millisecond)
	}
	for i := range 6 {
		start(fmt.Sprintf("other-%d", i), recOther, "", 200*time.Millisecond)
	}
	if err := s.ag.Write(ctx, events.Write{Key: "mem/before.md", Error: "disk full", Provider: recProvider}); err != nil {
		b.t.Fatal(err)
	}
	b.poll("the 5 first tasks dispatched", func() bool {
		ms, _ := b.read(topology.StreamDispatch, ">")
		return len(ms) == 5
	})
	return s
}

func recPayload(id string) events.Raw {
	var r events.Raw
	if err := r.UnmarshalJSON([]byte(`{"task":"` + id + `"}`)); err != nil {
		panic(err)
	}
	return r
}

// outage takes the provider down until the scope says outage, then plays
// what happens during it; it returns once probes have failed 6 times.
func (s *story) outage() {
	b := s.b
	b.t.Helper()
	b.up.Store(false)
	for i := 0; !b.healthIs(events.HealthOutage); i++ {
		if i > 50 {
			b.t.Fatal("no outage after 50 network failures")
		}
		s.call(b.ctx, "chat")
	}
	ctx := b.ctx
	// Subagents die silently, end, fail; another provider's die too.
	for i := range 5 {
		s.subs[fmt.Sprintf("stale-%d", i)].Stop()
	}
	for i := range 6 {
		s.subs[fmt.Sprintf("other-%d", i)].Stop()
	}
	for i := range 4 {
		if err := s.subs[fmt.Sprintf("done-%d", i)].Done(ctx); err != nil {
			b.t.Fatal(err)
		}
	}
	for i := range 3 {
		if err := s.subs[fmt.Sprintf("failed-%d", i)].Failed(ctx, errors.New("provider down")); err != nil {
			b.t.Fatal(err)
		}
	}
	// Writes: one lost, one lost and written again.
	for _, w := range []events.Write{
		{Key: "mem/lost.md", Error: "fetch failed", Provider: recProvider},
		{Key: "mem/fixed.md", Error: "fetch failed", Provider: recProvider},
	} {
		if err := s.ag.Write(ctx, w); err != nil {
			b.t.Fatal(err)
		}
	}
	if err := s.ag.Write(ctx, events.Write{Key: "mem/fixed.md", OK: true, Provider: recProvider}); err != nil {
		b.t.Fatal(err)
	}
	// 40 tasks from four workers.
	for i := range 40 {
		w := fmt.Sprintf("w%d", i%4)
		if err := s.ag.SubmitTask(ctx, &events.Task{ID: fmt.Sprintf("held-%02d", i), Agent: w, Provider: recProvider, Payload: recPayload("held")}); err != nil {
			b.t.Fatal(err)
		}
	}
	// The outage lasts while probes fail; the every-ok cron succeeds once
	// during it (its agent had another way).
	okAt := time.Time{}
	b.poll("6 failed probes", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if okAt.IsZero() && s.probes >= 2 {
			okAt = s.nextTime(2*time.Second, time.Now())
		}
		return s.probes >= 6 && !okAt.IsZero() && time.Now().After(okAt)
	})
	if err := s.ag.CronRun(ctx, events.CronRun{Cron: "every-ok", ScheduledAt: events.At(okAt), Status: events.CronOK, Provider: recProvider}); err != nil {
		b.t.Fatal(err)
	}
	b.up.Store(true)
}

// nextTime is the first time anchor + k·every at or after t.
func (s *story) nextTime(every time.Duration, t time.Time) time.Time {
	k := (t.Sub(s.anchor) + every - 1) / every
	return s.anchor.Add(k * every)
}

// expectation is what the checklist must do, computed from the recorded
// outage start and recovery times.
func (s *story) check(label string) {
	b := s.b
	t := b.t
	t.Helper()
	recs := b.records()
	var steps []string
	for _, r := range recs {
		steps = append(steps, r.Step)
	}
	if !slices.Equal(steps, events.Steps) {
		t.Fatalf("%s: records %v, want each step once, in order", label, steps)
	}
	start, rec := recs[0].OutageStartedAt.Time, recs[0].RecoveredAt.Time
	rid := recs[0].RecoveryID

	// Controls: kills, cron re-runs, write checks, and the probes.
	cms, cids := b.read(topology.StreamControl, ">")
	controls := recTyped[*events.Control](cms)
	byAction := map[string][]string{}
	for i, c := range controls {
		key := c.Subagent + c.Key + c.Provider
		if c.Action == events.ControlRunCron {
			key = c.Cron + "@" + c.ScheduledAt.UTC().Format(time.RFC3339Nano)
		}
		byAction[c.Action] = append(byAction[c.Action], key)
		if !strings.Contains(cids[i], c.Action) && c.Action != events.ControlRunCron && c.Action != events.ControlCheckWrite {
			t.Errorf("%s: control %s has Nats-Msg-Id %q", label, c.Action, cids[i])
		}
	}
	for action, keys := range byAction {
		seen := map[string]bool{}
		for _, k := range keys {
			if seen[k] && action != events.ControlProbe {
				t.Errorf("%s: %s %s sent twice", label, action, k)
			}
			seen[k] = true
		}
	}
	kills := slices.Sorted(slices.Values(byAction[events.ControlKill]))
	if want := []string{"stale-0", "stale-1", "stale-2", "stale-3", "stale-4"}; !slices.Equal(kills, want) {
		t.Errorf("%s: killed %v, want exactly %v", label, kills, want)
	}
	if got := byAction[events.ControlCheckWrite]; !slices.Equal(got, []string{"mem/lost.md"}) {
		t.Errorf("%s: checked writes %v, want only mem/lost.md", label, got)
	}
	// Cron re-runs, computed here from the outage and each cron's anchor:
	// its first recorded run (reported before the checklist), else its
	// declared time (CONTRACT.md: @every counts from there).
	var wantRerun []string
	okTimes := map[string]bool{}
	anchors := map[string]time.Time{}
	for _, r := range b.cronRuns() {
		if !r.At.Before(rec) {
			continue // the re-runs themselves
		}
		if a, ok := anchors[r.Cron]; !ok || r.ScheduledAt.Before(a) {
			anchors[r.Cron] = r.ScheduledAt.Time
		}
		if r.Status == events.CronOK {
			okTimes[r.Cron+"@"+r.ScheduledAt.UTC().Format(time.RFC3339Nano)] = true
		}
	}
	for _, c := range recCrons {
		anchor, ok := anchors[c.name]
		if !ok {
			anchor = s.anchor
		}
		first := anchor
		if start.After(anchor) {
			first = anchor.Add((start.Sub(anchor) + c.every - 1) / c.every * c.every)
		}
		var in []time.Time
		for tm := first; !tm.After(rec); tm = tm.Add(c.every) {
			in = append(in, tm)
		}
		key := func(tm time.Time) string { return c.name + "@" + tm.UTC().Format(time.RFC3339Nano) }
		switch c.mode {
		case events.CatchupLatest:
			if len(in) > 0 {
				wantRerun = append(wantRerun, key(in[len(in)-1]))
			}
		case events.CatchupAll:
			for _, tm := range in {
				if okTimes[key(tm)] {
					continue
				}
				if c.window > 0 && tm.Before(rec.Add(-c.window)) {
					continue
				}
				wantRerun = append(wantRerun, key(tm))
			}
		}
	}
	if len(okTimes) != 1 {
		t.Errorf("%s: %d ok runs of every-ok during the outage, want 1", label, len(okTimes))
	}
	sort.Strings(wantRerun)
	gotRerun := slices.Sorted(slices.Values(byAction[events.ControlRunCron]))
	if !slices.Equal(gotRerun, wantRerun) {
		t.Errorf("%s: cron re-runs\n%v\nwant\n%v", label, gotRerun, wantRerun)
	}
	// Probes: during the outage only, one per probe interval across
	// replicas.
	var probeAt []time.Time
	for _, p := range controls {
		if p.Action != events.ControlProbe {
			continue
		}
		if p.At.Before(start) || p.At.After(rec.Add(time.Second)) {
			t.Errorf("%s: probe at %s outside the outage %s–%s", label, p.At, start, rec)
		}
		probeAt = append(probeAt, p.At.Time)
	}
	slices.SortFunc(probeAt, time.Time.Compare)
	for i := 1; i < len(probeAt); i++ {
		if gap := probeAt[i].Sub(probeAt[i-1]); gap < recPolicy().ProbeInterval {
			t.Errorf("%s: probes %s apart, closer than the probe interval %s", label, gap, recPolicy().ProbeInterval)
		}
	}

	// Dispatches: 5 before, 5 redispatched as attempt 2, 40 released after
	// recovery in each worker's order at most 50/s; each (task, attempt)
	// once.
	dms, _ := b.read(topology.StreamDispatch, ">")
	ds := recTyped[*events.Dispatch](dms)
	seen := map[string]int{}
	var held []*events.Dispatch
	var redis []string
	for _, d := range ds {
		seen[fmt.Sprintf("%s#%d", d.TaskID, d.Attempt)]++
		switch {
		case strings.HasPrefix(d.TaskID, "held-"):
			held = append(held, d)
		case d.Attempt == 2:
			redis = append(redis, d.TaskID)
			if string(d.Payload) != string(recPayload(d.TaskID)) {
				t.Errorf("%s: redispatch of %s without its payload", label, d.TaskID)
			}
		}
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s: dispatch %s stored %d times", label, k, n)
		}
	}
	slices.Sort(redis)
	if want := []string{"job-stale-0", "job-stale-1", "job-stale-2", "job-stale-3", "job-stale-4"}; !slices.Equal(redis, want) {
		t.Errorf("%s: redispatched %v, want %v as attempt 2", label, redis, want)
	}
	if len(held) != 40 {
		t.Errorf("%s: %d held tasks dispatched, want 40", label, len(held))
	}
	last := map[string]string{}
	for i, d := range held {
		if d.At.Before(rec) {
			t.Errorf("%s: %s dispatched at %s, before recovery at %s", label, d.TaskID, d.At, rec)
		}
		if prev, ok := last[d.Agent]; ok && prev > d.TaskID {
			t.Errorf("%s: %s released after %s", label, d.TaskID, prev)
		}
		last[d.Agent] = d.TaskID
		if i > 0 && d.At.Sub(held[i-1].At.Time) < 20*time.Millisecond {
			t.Errorf("%s: %s released %s after the previous one, faster than 50/s", label, d.TaskID, d.At.Sub(held[i-1].At.Time))
		}
	}
	final := recs[len(recs)-1]
	if final.Released != 40 || !final.Done {
		t.Errorf("%s: final record released %d, done %v", label, final.Released, final.Done)
	}

	// Notifications: one outage, one recovered (the scope's), one recovery
	// (the checklist's) — by dedupe key, which the notifier delivers once.
	nms, _ := b.read(topology.StreamNotify, ">")
	keys := map[string]int{}
	for _, n := range recTyped[*events.Notification](nms) {
		keys[strings.SplitN(n.DedupeKey, ":", 2)[0]+":"+n.Labels["provider"]]++
	}
	for _, k := range []string{"provider-outage:" + recProvider, "provider-recovered:" + recProvider, "recovery:" + recProvider} {
		if keys[k] != 1 {
			t.Errorf("%s: %d %s notification requests, want 1 (%v)", label, keys[k], k, keys)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, err := range s.errs {
		t.Errorf("%s: agent: %v", label, err)
	}
	t.Logf("%s: outage %s, %d probes (%d ok) ended it; %s: %d kills, %d cron re-runs, %d write checks, %d redispatched, %d released; %d dispatches, %d controls stored",
		label, rec.Sub(start).Round(time.Millisecond), s.probes, s.probeOK, rid,
		len(kills), len(gotRerun), len(byAction[events.ControlCheckWrite]), len(redis), len(held), len(ds), len(controls))
}

func (b *recBench) cronRuns() []*events.CronRun {
	ms, _ := b.read(topology.StreamReports, events.CronRunPrefix+".>")
	return recTyped[*events.CronRun](ms)
}

// One recovery service.
func TestRecoveryStoryOnTheBus(t *testing.T) {
	t.Parallel()
	b := recSetup(t, 3*time.Minute)
	b.startPipeline(recScopeYAML)
	b.startRecovery("")
	s := b.beforeOutage()
	s.outage()
	b.poll("the checklist done", b.done)
	s.check("one service")
}

// Two recovery replicas, both running all along.
func TestRecoveryStoryTwoReplicas(t *testing.T) {
	t.Parallel()
	b := recSetup(t, 3*time.Minute)
	b.startPipeline(recScopeYAML)
	b.startRecovery("replica-a")
	b.startRecovery("replica-b")
	s := b.beforeOutage()
	s.outage()
	b.poll("the checklist done", b.done)
	s.check("two replicas")
}

// Environment of the recovery child process.
const (
	recChildURL  = "FAILBUS_TEST_RECOVERY_CHILD"
	recChildKill = "FAILBUS_TEST_RECOVERY_KILL" // "<point> <id substring>"
)

// TestRecoveryCrashChild is not a test: it is the recovery process
// TestRecoveryStoryKilledAtEachStep kills. It SIGKILLs itself the first time
// the core reaches the crash point named in its environment.
func TestRecoveryCrashChild(t *testing.T) {
	url := os.Getenv(recChildURL)
	if url == "" {
		t.Skip("helper process of TestRecoveryStoryKilledAtEachStep")
	}
	point, what, _ := strings.Cut(os.Getenv(recChildKill), " ")
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := svc.New(context.Background(), js, svc.Options{
		Policy: recPolicy(), LeaseTTL: 300 * time.Millisecond,
		Runner: consumer.Config{FetchWait: 100 * time.Millisecond},
		CrashAt: func(p, w string) {
			if point != "" && p == point && strings.Contains(w, what) {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // SIGKILL is not caught; nothing after this runs
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Run(context.Background())
	t.Fatalf("child recovery returned: %v", err)
}

// The recovery service SIGKILLed at each checklist step in turn — each time
// right after a command of that step was stored and before its ledger entry
// was written, the narrowest gap — and restarted: the same commands, each
// exactly once.
func TestRecoveryStoryKilledAtEachStep(t *testing.T) {
	t.Parallel()
	b := recSetup(t, 4*time.Minute)
	// Redeliver what a killed process held after 1 s instead of 30 s.
	for _, name := range []string{topology.ConsumerRecovery, topology.ConsumerRecoveryHeartbeats, topology.ConsumerRecoveryReports, topology.ConsumerRecoveryTasks} {
		stream, cc, _ := topology.Consumer(name)
		cc.AckWait, cc.BackOff = time.Second, nil
		if _, err := b.js.UpdateConsumer(b.ctx, stream, cc); err != nil {
			t.Fatal(err)
		}
	}
	b.startPipeline(recScopeYAML)
	kills := []string{
		recovery.HookPublished + " :" + events.StepConfirm,
		recovery.HookPublished + " :" + events.StepSubagents,
		recovery.HookPublished + " :kill:",
		recovery.HookPublished + " recovery:cron:",
		recovery.HookPublished + " :write:",
		recovery.HookPublished + " dispatch:job-stale-0:2", // the first redispatch
		recovery.HookPublished + " held-1",                 // mid-release: the 11th held task
		recovery.HookPublished + " :" + events.StepRelease,
		recovery.HookPublished + " :notify",
	}
	var mu sync.Mutex
	var died []string
	child := func(kill string) *exec.Cmd {
		c := exec.Command(os.Args[0], "-test.run=^TestRecoveryCrashChild$")
		c.Env = append(os.Environ(), recChildURL+"="+b.url, recChildKill+"="+kill)
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			err := c.Wait()
			var ee *exec.ExitError
			mu.Lock()
			defer mu.Unlock()
			if errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
				died = append(died, kill)
				return
			}
			if kill != "" {
				died = append(died, "ended without SIGKILL: "+kill+": "+fmt.Sprint(err)+"\n"+out.String())
			}
		}()
		return c
	}
	// The first child lives through the outage and dies at the first step.
	child(kills[0])
	s := b.beforeOutage()
	s.outage()
	for i, kill := range kills {
		b.poll("death at "+kill, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(died) > i
		})
		mu.Lock()
		if died[i] != kill {
			t.Fatalf("child %d: %s", i, died[i])
		}
		mu.Unlock()
		next := ""
		if i+1 < len(kills) {
			next = kills[i+1]
		}
		c := child(next)
		if next == "" {
			t.Cleanup(func() { _ = c.Process.Kill() })
		}
	}
	b.poll("the checklist done", b.done)
	s.check(fmt.Sprintf("killed %d times", len(kills)))
}

// Flapping: the provider goes up and down every 2 s for 30 s; the scope's
// hysteresis (3 successes over 3 s here, longer than an up phase) keeps it
// in one outage, so nothing is released and no checklist runs until it
// stays up; then one run, and one outage, one recovered and one recovery
// notification.
func TestRecoveryFlappingReleasesNothingUntilItStaysUp(t *testing.T) {
	t.Parallel()
	b := recSetup(t, 3*time.Minute)
	b.startPipeline("scope:\n  recovery_min_successes: 3\n  recovery_min_time: 3s\n")
	b.startRecovery("")
	s := &story{b: b, subs: map[string]*agent.Subagent{}}
	var err error
	if s.ag, err = agent.New(b.nc, "coord", agent.WithErrorHandler(s.fail)); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.ag.HandleControls(hctx, agent.ControlHandlers{Probe: func(ctx context.Context, c events.Control) error {
		s.call(ctx, "probe")
		return nil
	}})
	b.up.Store(false)
	for i := 0; !b.healthIs(events.HealthOutage); i++ {
		if i > 50 {
			t.Fatal("no outage")
		}
		s.call(b.ctx, "chat")
	}
	for i := range 20 {
		if err := s.ag.SubmitTask(b.ctx, &events.Task{ID: fmt.Sprintf("flap-%02d", i), Provider: recProvider}); err != nil {
			t.Fatal(err)
		}
	}
	flapStart := time.Now()
	for time.Since(flapStart) < 30*time.Second {
		b.up.Store(!b.up.Load())
		next := time.Now().Add(2 * time.Second)
		b.poll("the next flap", func() bool { return time.Now().After(next) })
	}
	b.up.Store(true)
	steady := time.Now()
	b.poll("the checklist done", b.done)

	var states []string
	recovered := 0
	for _, h := range b.health() {
		states = append(states, h.State)
		if h.State == events.HealthRecovered {
			recovered++
			if h.At.Before(steady) {
				t.Errorf("recovered at %s, during the flapping (until %s)", h.At, steady)
			}
		}
	}
	if recovered != 1 {
		t.Errorf("health %v: want one recovered, after the flapping", states)
	}
	dms, _ := b.read(topology.StreamDispatch, ">")
	ds := recTyped[*events.Dispatch](dms)
	if len(ds) != 20 {
		t.Errorf("%d dispatches, want the 20 held tasks once each", len(ds))
	}
	for _, d := range ds {
		if d.At.Before(steady) {
			t.Errorf("%s released at %s, during the flapping (until %s)", d.TaskID, d.At, steady)
		}
	}
	if n := len(b.records()); n != len(events.Steps) {
		t.Errorf("%d recovery records, want one run (%d)", n, len(events.Steps))
	}
	nms, _ := b.read(topology.StreamNotify, ">")
	keys := map[string]int{}
	for _, n := range recTyped[*events.Notification](nms) {
		keys[strings.SplitN(n.DedupeKey, ":", 2)[0]]++
	}
	for _, k := range []string{"provider-outage", "provider-recovered", "recovery"} {
		if keys[k] != 1 {
			t.Errorf("%d %s notification requests, want 1 for the one episode (%v)", keys[k], k, keys)
		}
	}
	t.Logf("flapping 30 s: health %s; %d tasks released after it steadied; notification requests %v", strings.Join(states, " → "), len(ds), keys)
}

// An outage nobody probes ends: the agent holds and does not even answer
// probe controls; the policy's built-in HTTP probe calls the provider every
// probe interval, its outcomes (origin probe) feed the fault scope, and the
// provider recovers once its endpoint answers again.
func TestRecoveryHTTPProbeEndsAnOutage(t *testing.T) {
	t.Parallel()
	b := recSetup(t, 2*time.Minute)
	b.startPipeline(recScopeYAML)
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer probe-secret" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if !up.Load() {
			// A gateway that lost its upstream: the connection is cut.
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			conn.Close()
			return
		}
		_, _ = w.Write([]byte(`{"data":[]}`))
	}))
	t.Cleanup(srv.Close)
	cfg := recPolicy()
	cfg.Probes = map[string]recovery.HTTPProbe{recProvider: {
		URL: srv.URL + "/v1/models", HeadersEnv: map[string]string{"Authorization": "PROBE_AUTH"}, Profile: "p1",
	}}
	s, err := svc.New(b.ctx, b.js, svc.Options{
		Policy: cfg, Runner: consumer.Config{FetchWait: 100 * time.Millisecond},
		Getenv: func(k string) string {
			if k == "PROBE_AUTH" {
				return "Bearer probe-secret"
			}
			return ""
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	b.run(s)
	ag, err := agent.New(b.nc, "coord")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; !b.healthIs(events.HealthOutage); i++ {
		if i > 50 {
			t.Fatal("no outage")
		}
		if err := ag.Report(b.ctx, &events.Outcome{Provider: recProvider, Profile: "p1", TransportError: "fetch failed"}); err != nil {
			t.Fatal(err)
		}
	}
	// Down for a few probes, then back; nobody but the probe calls.
	b.poll("3 failed HTTP probes", func() bool { return b.probeOutcomes(false) >= 3 })
	up.Store(true)
	b.poll("recovered", func() bool { return b.healthIs(events.HealthRecovered) })
	b.poll("the checklist done", b.done)
	t.Logf("outage ended by the HTTP probe: %d failed and %d ok probe outcomes", b.probeOutcomes(false), b.probeOutcomes(true))
}

// probeOutcomes counts the built-in probe's outcomes that failed or
// succeeded.
func (b *recBench) probeOutcomes(ok bool) int {
	ms, _ := b.read(topology.StreamOutcomes, events.OutcomePrefix+"."+recProvider+"."+recovery.DefaultProbeAgent)
	n := 0
	for _, o := range recTyped[*events.Outcome](ms) {
		if o.Origin == nil || o.Origin.Kind != svc.OriginProbe || o.Profile != "p1" {
			b.t.Errorf("probe outcome %+v without origin probe and the configured profile", o)
		}
		if o.OK == ok {
			n++
		}
	}
	return n
}

// The story against `failbus dev`: server, classifier, scheduler and
// recovery in one process, configured by the policy file (the compressed
// hysteresis and recovery section).
func TestRecoveryStoryWithFailbusDev(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte(recScopeYAML+"recovery:\n  drain_rate: 50\n  probe_interval: 300ms\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dev := startDev(t, freePort(t), t.TempDir(), "--policy", file)
	nc, err := nats.Connect(dev.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	b := &recBench{t: t, url: dev.url, nc: nc, ctx: ctx, js: js}
	b.up.Store(true)
	s := b.beforeOutage()
	s.outage()
	b.poll("the checklist done", b.done)
	s.check("failbus dev")
	if err := dev.stop(t, os.Interrupt); err != nil {
		t.Fatalf("dev after SIGINT: %v\n%s", err, dev.stderr.String())
	}
}

// The recovery service under its own role (failbus auth init): the whole
// checklist — holding, probes, kills, re-runs, write checks, redispatch,
// release — runs with only the recovery user's permissions, and the agent
// does its part with only the agent user's; nothing is denied.
func TestRecoveryUnderItsOwnRole(t *testing.T) {
	t.Parallel()
	set, err := auth.Init(filepath.Join(t.TempDir(), "auth"), nil)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse([]byte(recScopeYAML + "recovery:\n  drain_rate: 50\n  probe_interval: 300ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-recovery-auth"}, Policy: pol, Auth: set})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	ac, err := connect.Connect(connect.Options{Servers: bus.Srv.ClientURL(), Nkey: set.Seed(auth.RoleAgent)}, "agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ac.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	b := &recBench{t: t, url: bus.Srv.ClientURL(), nc: ac.Conn, ctx: ctx, js: bus.JS} // reads as admin, acts as agent
	b.up.Store(true)
	s := &story{b: b, subs: map[string]*agent.Subagent{}}
	if s.ag, err = agent.New(ac.Conn, "coord", agent.WithErrorHandler(s.fail)); err != nil {
		t.Fatal(err)
	}
	hctx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	go s.ag.HandleControls(hctx, agent.ControlHandlers{
		Probe:      func(ctx context.Context, c events.Control) error { s.call(ctx, "probe"); return nil },
		RunCron:    func(ctx context.Context, c events.Control) error { return nil },
		CheckWrite: func(ctx context.Context, c events.Control) error { return nil },
	})
	if err := s.ag.DeclareCron(ctx, events.CronSpec{Cron: "tick", Schedule: "@every 1s", Provider: recProvider}); err != nil {
		t.Fatal(ac.Explain(err))
	}
	if err := s.ag.SubmitTask(ctx, &events.Task{ID: "job", Provider: recProvider}); err != nil {
		t.Fatal(ac.Explain(err))
	}
	sub, err := s.ag.StartSubagent(context.Background(), agent.SubagentConfig{Name: "worker", TaskID: "job", Provider: recProvider, Interval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(ac.Explain(err))
	}
	b.up.Store(false)
	for i := 0; !b.healthIs(events.HealthOutage); i++ {
		if i > 50 {
			t.Fatal("no outage")
		}
		s.call(ctx, "chat")
	}
	sub.Stop()
	if err := s.ag.Write(ctx, events.Write{Key: "mem.md", Error: "fetch failed", Provider: recProvider}); err != nil {
		t.Fatal(ac.Explain(err))
	}
	for i := range 5 {
		if err := s.ag.SubmitTask(ctx, &events.Task{ID: fmt.Sprintf("held-%d", i), Provider: recProvider}); err != nil {
			t.Fatal(ac.Explain(err))
		}
	}
	b.poll("3 failed probes", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.errs) > 0 || b.probeCount() >= 3 })
	b.up.Store(true)
	b.poll("the checklist done", b.done)
	rs := b.records()
	if len(rs) != len(events.Steps) || len(rs[2].Killed) != 1 || len(rs[4].Writes) != 1 || len(rs[5].Redispatched) != 1 || rs[6].Released != 5 {
		t.Errorf("records %+v", rs)
	}
	if d := append(bus.Denials(), ac.Denials()...); len(d) > 0 {
		t.Errorf("permissions denied: %v", d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, err := range s.errs {
		t.Errorf("agent: %v", ac.Explain(err))
	}
}

func (b *recBench) probeCount() int {
	ms, _ := b.read(topology.StreamControl, ">")
	n := 0
	for _, c := range recTyped[*events.Control](ms) {
		if c.Action == events.ControlProbe {
			n++
		}
	}
	return n
}

// Environment of the recovery service process TestRecoveryServiceChild runs.
const recServiceArgs = "FAILBUS_TEST_RECOVERY_SERVICE_ARGS" // flags, one per line

// TestRecoveryServiceChild is not a test: it is cmd/recovery (the same
// daemon.Run of servicespec.Recovery with the flags in its environment)
// for TestRecoveryServiceUnderItsRoleKilled.
func TestRecoveryServiceChild(t *testing.T) {
	args := os.Getenv(recServiceArgs)
	if args == "" {
		t.Skip("helper process of TestRecoveryServiceUnderItsRoleKilled")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(daemon.Run(ctx, servicespec.Recovery(), strings.Split(args, "\n"), os.Stderr))
}

// The recovery service as operators deploy it (compose.yaml): its own
// processes, two replicas, each connecting with the recovery user's seed
// of `failbus auth init` and --no-apply, while the admin applied the
// topology and the other services run under their own roles. Both answer
// /healthz; the replica driving the checklist is SIGKILLed once the first
// step record is stored, and the other finishes the run: the whole story's
// commands, each exactly once, the finished run on the survivor's
// /metrics, and no permission denied anywhere.
func TestRecoveryServiceUnderItsRoleKilled(t *testing.T) {
	t.Parallel()
	set, err := auth.Init(filepath.Join(t.TempDir(), "auth"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// 20/s: the release of 40 tasks takes 2 s, time enough to kill its
	// driver mid-checklist.
	polYAML := recScopeYAML + "recovery:\n  drain_rate: 20\n  probe_interval: 300ms\n"
	polFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(polFile, []byte(polYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse([]byte(polYAML))
	if err != nil {
		t.Fatal(err)
	}
	var others []daemon.Spec
	for _, s := range servicespec.All() {
		if s.Name != svc.Name {
			others = append(others, s)
		}
	}
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-recovery-role"}, Policy: pol, PolicyFile: polFile, Specs: others, Auth: set})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	// What a killed replica held is redelivered after 1 s, not 30 s.
	for _, name := range []string{topology.ConsumerRecovery, topology.ConsumerRecoveryHeartbeats, topology.ConsumerRecoveryReports, topology.ConsumerRecoveryTasks} {
		stream, cc, _ := topology.Consumer(name)
		cc.AckWait, cc.BackOff = time.Second, nil
		if _, err := bus.JS.UpdateConsumer(ctx, stream, cc); err != nil {
			t.Fatal(err)
		}
	}

	type replica struct {
		name, ops string
		cmd       *exec.Cmd
		out       *lockedBuffer
		exited    chan struct{} // closed once it exited, with err set
		err       error
	}
	start := func(name string) *replica {
		r := &replica{name: name, ops: fmt.Sprintf("127.0.0.1:%d", freePort(t)), out: &lockedBuffer{}, exited: make(chan struct{})}
		args := []string{"--server", bus.Srv.ClientURL(), "--nkey", set.Seed(auth.RoleRecovery), "--no-apply",
			"--policy", polFile, "--ops-addr", r.ops, "--replica", name, "--lease", "500ms"}
		r.cmd = exec.Command(os.Args[0], "-test.run=^TestRecoveryServiceChild$")
		r.cmd.Env = append(os.Environ(), recServiceArgs+"="+strings.Join(args, "\n"))
		r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			r.err = r.cmd.Wait()
			close(r.exited)
		}()
		t.Cleanup(func() {
			_ = r.cmd.Process.Kill()
			<-r.exited
			if strings.Contains(r.out.String(), "permission denied") {
				t.Errorf("replica %s was denied something:\n%s", name, r.out.String())
			}
		})
		return r
	}
	get := func(r *replica, path string) (int, string) {
		resp, err := http.Get("http://" + r.ops + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		return resp.StatusCode, body.String()
	}
	replicas := map[string]*replica{"replica-a": start("replica-a"), "replica-b": start("replica-b")}

	ac, err := connect.Connect(connect.Options{Servers: bus.Srv.ClientURL(), Nkey: set.Seed(auth.RoleAgent)}, "agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ac.Close)
	b := &recBench{t: t, url: bus.Srv.ClientURL(), nc: ac.Conn, ctx: ctx, js: bus.JS} // reads as admin, acts as agent
	b.up.Store(true)
	for _, r := range replicas {
		b.poll("/healthz of "+r.name, func() bool {
			select {
			case <-r.exited:
				t.Fatalf("replica %s exited: %v\n%s", r.name, r.err, r.out.String())
			default:
			}
			code, body := get(r, "/healthz")
			return code == http.StatusOK && strings.TrimSpace(body) == "ok"
		})
	}

	s := b.beforeOutage()
	s.outage()
	b.poll("the first step record", func() bool { return len(b.records()) > 0 })
	e, err := b.kv(topology.BucketRecovery).Get(ctx, svc.ProviderKey(recProvider))
	if err != nil {
		t.Fatal(err)
	}
	var rec recovery.ProviderRecord
	if err := msgpack.Unmarshal(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	driver := replicas[rec.Lease.Owner]
	if driver == nil {
		t.Fatalf("lease held by %q, not a replica", rec.Lease.Owner)
	}
	if b.done() {
		t.Fatal("the checklist finished before its driver could be killed")
	}
	stepsBefore := len(b.records())
	if err := driver.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	delete(replicas, driver.name)
	b.poll("the checklist done", b.done)
	s.check(fmt.Sprintf("recovery processes under the recovery role, driver %s SIGKILLed after %d step record(s)", driver.name, stepsBefore))
	for _, r := range replicas {
		code, body := get(r, "/metrics")
		if want := `failbus_recovery_runs_total{provider="openai"} 1`; code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("/metrics of %s (the survivor): %d, no %s", r.name, code, want)
		}
	}
	if d := append(bus.Denials(), ac.Denials()...); len(d) > 0 {
		t.Errorf("permissions denied: %v", d)
	}
}

func (b *recBench) kv(bucket string) jetstream.KeyValue {
	b.t.Helper()
	kv, err := b.js.KeyValue(b.ctx, bucket)
	if err != nil {
		b.t.Fatal(err)
	}
	return kv
}
