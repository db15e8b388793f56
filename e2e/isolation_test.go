package e2e

// One agent cannot take the bus down, starve it or speak for another
// agent. Each test drives one way a single misbehaving agent once could,
// against a real bus (every service in this process, on an embedded
// nats-server, with per-agent users where identity is the point), and
// checks that the agent's records are dead letters naming why while every
// other agent is served as before.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/policy/limits"
	"github.com/failbus/failbus/internal/policy/recovery"
	svc "github.com/failbus/failbus/internal/service/recoverer"
	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// isoBus is every service on an embedded server, with policy yaml (and
// per-agent users when set is not nil); its client connection acts as the
// agents (as admin, or as agent-<name> through connAs).
type isoBus struct {
	t   *testing.T
	bus *devbus.Bus
	set *auth.Set
	nc  *nats.Conn
	js  jetstream.JetStream // admin: reads what the bus stored
	ctx context.Context
}

func newIsoBus(t *testing.T, yaml string, set *auth.Set) *isoBus {
	t.Helper()
	pol, err := policy.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}, Policy: pol, Auth: set, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	b := &isoBus{t: t, bus: bus, set: set, js: bus.JS, ctx: ctx}
	if set == nil {
		if b.nc, err = bus.Srv.Connect(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.nc.Close)
	}
	return b
}

// connAs connects as one of set's users (agent-a, …).
func (b *isoBus) connAs(user string) *nats.Conn {
	b.t.Helper()
	c, err := connect.Connect(connect.Options{Servers: b.bus.Srv.ClientURL(), Nkey: b.set.Seed(user)}, "test-"+user)
	if err != nil {
		b.t.Fatalf("connect as %s: %v", user, err)
	}
	b.t.Cleanup(c.Close)
	return c.Conn
}

// pub publishes v (a msgpack map, or a failbus message encoded without
// validation) on subject with JetStream, and fails on an error.
func (b *isoBus) pub(nc *nats.Conn, subject string, v any, id string) {
	b.t.Helper()
	if err := b.tryPub(nc, subject, v, id); err != nil {
		b.t.Fatalf("publish %s: %v", subject, err)
	}
}

func (b *isoBus) tryPub(nc *nats.Conn, subject string, v any, id string) error {
	data, err := msgpack.Marshal(v)
	if err != nil {
		b.t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.t.Fatal(err)
	}
	m := nats.NewMsg(subject)
	m.Data = data
	if id != "" {
		m.Header.Set(nats.MsgIdHdr, id)
	}
	_, err = js.PublishMsg(b.ctx, m)
	return err
}

func (b *isoBus) poll(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) || b.ctx.Err() != nil {
			b.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stored returns every message of stream on filter, decoded (direct
// batch reads: polling creates no consumers).
func stored[T events.Message](b *isoBus, stream, filter string) []T {
	b.t.Helper()
	var out []T
	for _, m := range b.raw(stream, filter) {
		subject := streamread.ServerHeader(m, jetstream.SubjectHeader)
		v, err := events.Decode(subject, m.Header, m.Data)
		if err != nil {
			b.t.Fatalf("%s on %s: %v", stream, subject, err)
		}
		if t, ok := v.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// raw returns every message of stream on filter as stored.
func (b *isoBus) raw(stream, filter string) []*nats.Msg {
	b.t.Helper()
	var out []*nats.Msg
	if err := streamread.ReadFrom(b.ctx, b.js, stream, filter, 0, 0, 1<<30, func(m *nats.Msg) error {
		out = append(out, m)
		return nil
	}); err != nil {
		b.t.Fatal(err)
	}
	return out
}

// deadLetters are the dead letters of service whose reason contains want.
func (b *isoBus) deadLetters(service, want string) []*events.DeadLetter {
	var out []*events.DeadLetter
	for _, d := range stored[*events.DeadLetter](b, topology.StreamDLQ, events.DLQSubject(service)) {
		if strings.Contains(d.Reason, want) {
			out = append(out, d)
		}
	}
	return out
}

// health is provider's latest health state on the bus ("" for none).
func (b *isoBus) health(provider string) string {
	hs := stored[*events.Health](b, topology.StreamHealth, events.HealthSubject(provider))
	if len(hs) == 0 {
		return ""
	}
	return hs[len(hs)-1].State
}

func outcomeMap(id, agent, provider string, status int, ok bool) map[string]any {
	m := map[string]any{"id": id, "agent": agent, "provider": provider, "model": "m", "status": status, "ok": ok,
		"at": time.Now().UTC().Format(time.RFC3339Nano)}
	if status == 0 && !ok {
		m["transport_error"] = "connect: connection refused"
	}
	if status == 429 {
		m["headers"] = map[string]string{"retry-after": "1"}
		m["turn"], m["step"] = 1, 1
	}
	return m
}

// Finding 1: a heartbeat, write or cron spec whose provider is not valid
// UTF-8 once panicked recovery in a metric label at every restart (the
// value was kept and replayed). Each is now a dead letter naming the
// field; and a record kept from before that makes the service panic is
// quarantined (moved to failbus.dlq.recovery and removed), while the
// service keeps serving other providers.
func TestIsolationBadNamesAndPoisonedRecordsDoNotCrashRecovery(t *testing.T) {
	t.Parallel()
	b := newIsoBus(t, "", nil)
	bad := "open\xffai"
	now := time.Now().UTC().Format(time.RFC3339Nano)
	b.pub(b.nc, events.HeartbeatSubject("a"), map[string]any{"at": now, "agent": "a", "subagent": "s", "provider": bad}, "")
	b.pub(b.nc, events.WriteSubject("a"), map[string]any{"at": now, "agent": "a", "key": "mem.md", "provider": bad}, "")
	b.pub(b.nc, events.CronSpecSubject("a"), map[string]any{"at": now, "agent": "a", "cron": "c", "schedule": "@every 1m", "provider": bad}, "")
	b.poll("three dead letters naming the provider field", func() bool {
		return len(b.deadLetters(svc.HeartbeatName, `"provider": not valid UTF-8`))+
			len(b.deadLetters(svc.ReportName, `"provider": not valid UTF-8`)) == 3
	})

	// A provider record as an older version stored it under an invalid
	// name, and one whose checklist position no version writes: the
	// first once panicked the watch (metric label), the second panics the
	// checklist's step lookup.
	kv, err := b.js.KeyValue(b.ctx, topology.BucketRecovery)
	if err != nil {
		t.Fatal(err)
	}
	rec := recovery.ProviderRecord{Provider: bad, Down: true}
	data, _ := msgpack.Marshal(&rec)
	if _, err := kv.Put(b.ctx, svc.ProviderKey(bad), data); err != nil {
		t.Fatal(err)
	}
	poison := recovery.ProviderRecord{Provider: "poison", Episodes: []recovery.Episode{{
		RecoveryID: "poison:1", OutageStartedAt: events.At(time.Now().Add(-time.Hour)), RecoveredAt: events.At(time.Now()), Step: -1,
	}}}
	data, _ = msgpack.Marshal(&poison)
	if _, err := kv.Put(b.ctx, svc.ProviderKey("poison"), data); err != nil {
		t.Fatal(err)
	}
	b.poll("the poisoned record quarantined", func() bool {
		_, err := kv.Get(b.ctx, svc.ProviderKey("poison"))
		return errors.Is(err, jetstream.ErrKeyNotFound) && len(b.deadLetters(svc.Name, "panic")) == 1
	})
	dl := b.deadLetters(svc.Name, "panic")[0]
	if dl.Subject != "$KV."+topology.BucketRecovery+"."+svc.ProviderKey("poison") || len(dl.Data) == 0 {
		t.Fatalf("quarantined as %s with %d bytes, want the record's key and bytes", dl.Subject, len(dl.Data))
	}
	if err := b.bus.Healthy(); err != nil {
		t.Fatalf("the bus is not healthy after the poisoned records: %v", err)
	}
	// And recovery still serves: a task for a healthy provider is
	// dispatched at once.
	b.pub(b.nc, events.TaskSubject("openai", "a"), map[string]any{"id": "t-after", "agent": "a", "provider": "openai"}, "t-after")
	b.poll("the task dispatched", func() bool {
		return len(stored[*events.Dispatch](b, topology.StreamDispatch, events.DispatchSubject("a"))) == 1
	})
}

// Finding 2: one agent inventing provider names once filled FAILBUS_SCOPE
// and stopped every decision. Now its outcomes past limits.providers_per_agent
// are dead letters naming the limit and the agent (one notification a
// day), the scope holds no more than its share, and another agent's 429
// is decided. Past limits.providers (all agents together), the same.
func TestIsolationProviderFloodLeavesOthersDecided(t *testing.T) {
	t.Parallel()
	const perAgent, total, flood = 8, 40, 300
	b := newIsoBus(t, fmt.Sprintf("limits:\n  providers_per_agent: %d\n  providers: %d\n", perAgent, total), nil)
	b.pub(b.nc, events.OutcomeSubject("openai", "b"), outcomeMap("b-ok", "b", "openai", 200, true), "b-ok")
	for i := range flood {
		p := fmt.Sprintf("invented-%04d", i)
		b.pub(b.nc, events.OutcomeSubject(p, "flood"), outcomeMap("flood-"+strconv.Itoa(i), "flood", p, 200, true), "flood-"+strconv.Itoa(i))
	}
	start := time.Now()
	b.pub(b.nc, events.OutcomeSubject("openai", "b"), outcomeMap("b-429", "b", "openai", 429, false), "b-429")
	b.poll("b's decision", func() bool {
		return len(stored[*events.Decision](b, topology.StreamDecisions, events.DecisionSubject("b"))) == 1
	})
	t.Logf("b's 429 decided %v after a flood of %d invented providers", time.Since(start).Round(time.Millisecond), flood)
	b.poll("the flood's dead letters", func() bool {
		n := len(b.deadLetters("classifier", "limits."+limits.ProvidersPerAgent))
		return n == flood-perAgent
	})
	for _, d := range b.deadLetters("classifier", "limits."+limits.ProvidersPerAgent)[:1] {
		if !strings.Contains(d.Reason, "agent flood") {
			t.Errorf("reason %q does not name the agent", d.Reason)
		}
	}
	notes := stored[*events.Notification](b, topology.StreamNotify, events.NotifySubject(events.SeverityNormal))
	want := limits.NotifyKey(limits.ProvidersPerAgent, "flood", time.Now().UTC().Format("2006-01-02"))
	if n := len(slices.DeleteFunc(notes, func(n *events.Notification) bool { return n.DedupeKey != want })); n != 1 {
		t.Errorf("%d notification requests %s, want 1", n, want)
	}
	kv, err := b.js.KeyValue(b.ctx, topology.BucketScope)
	if err != nil {
		t.Fatal(err)
	}
	b.poll("the scope to hold the admitted providers", func() bool {
		st, err := kv.Status(b.ctx)
		return err == nil && st.Values() == perAgent+1
	})

	// Many agents, one new provider each: all agents together stop at
	// limits.providers; b's known provider is still decided.
	for i := range total {
		a := fmt.Sprintf("many-%02d", i)
		p := fmt.Sprintf("own-%02d", i)
		b.pub(b.nc, events.OutcomeSubject(p, a), outcomeMap(a, a, p, 200, true), a)
	}
	b.pub(b.nc, events.OutcomeSubject("openai", "b"), outcomeMap("b-429-2", "b", "openai", 429, false), "b-429-2")
	b.poll("b's second decision and the total's refusals", func() bool {
		return len(stored[*events.Decision](b, topology.StreamDecisions, events.DecisionSubject("b"))) == 2 &&
			len(b.deadLetters("classifier", "limits."+limits.Providers+" ")) == perAgent+1
	})
}

// Finding 2, the other shared state: subagents, crons, and tasks (their
// count and bytes in FAILBUS_TASKS, and one task's size) past an agent's
// share are refused, the refused tasks removed from the stream, while
// another agent's are kept and dispatched.
func TestIsolationSubagentsCronsAndTasksPerAgent(t *testing.T) {
	t.Parallel()
	b := newIsoBus(t, "limits:\n  subagents_per_agent: 3\n  crons_per_agent: 2\n  tasks_per_agent: 4\n  task_bytes_per_agent: 3000\n  task_bytes: 2048\n", nil)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	for i := range 6 {
		b.pub(b.nc, events.HeartbeatSubject("a"), map[string]any{"at": now, "agent": "a", "subagent": fmt.Sprintf("s%d", i)}, "")
		b.pub(b.nc, events.CronSpecSubject("a"), map[string]any{"at": now, "agent": "a", "cron": fmt.Sprintf("c%d", i), "schedule": "@every 1h"}, "")
	}
	b.pub(b.nc, events.HeartbeatSubject("b"), map[string]any{"at": now, "agent": "b", "subagent": "s0"}, "")
	b.pub(b.nc, events.CronSpecSubject("b"), map[string]any{"at": now, "agent": "b", "cron": "c0", "schedule": "@every 1h"}, "")
	// The same subagent again is no new name: admitted at the limit.
	b.pub(b.nc, events.HeartbeatSubject("a"), map[string]any{"at": now, "agent": "a", "subagent": "s0", "status": "done"}, "")
	b.poll("the subagents and crons past a's share refused", func() bool {
		return len(b.deadLetters(svc.HeartbeatName, "limits."+limits.SubagentsPerAgent)) == 3 &&
			len(b.deadLetters(svc.ReportName, "limits."+limits.CronsPerAgent)) == 4
	})
	hb, err := b.js.KeyValue(b.ctx, topology.BucketHeartbeats)
	if err != nil {
		t.Fatal(err)
	}
	b.poll("b's heartbeat and a's three stored", func() bool {
		st, err := hb.Status(b.ctx)
		return err == nil && st.Values() == 4
	})

	// Tasks: five of 500 bytes (the fifth past tasks_per_agent), then one
	// of 1600 (past task_bytes_per_agent); one of 4000 is refused by the
	// stream itself (task_bytes).
	payload := func(n int) string { return strings.Repeat("x", n) }
	for i := range 5 {
		id := fmt.Sprintf("a-%d", i)
		b.pub(b.nc, events.TaskSubject("openai", "a"), map[string]any{"id": id, "agent": "a", "provider": "openai", "payload": payload(500)}, id)
	}
	b.poll("the fifth task refused", func() bool {
		return len(b.deadLetters(svc.TaskName, "limits."+limits.TasksPerAgent)) == 1
	})
	err = b.tryPub(b.nc, events.TaskSubject("openai", "a"), map[string]any{"id": "a-big", "agent": "a", "provider": "openai", "payload": payload(4000)}, "a-big")
	if err == nil || !strings.Contains(err.Error(), "maximum") {
		t.Fatalf("a task past task_bytes: %v, want the stream to refuse it", err)
	}
	b.pub(b.nc, events.TaskSubject("openai", "b"), map[string]any{"id": "b-1", "agent": "b", "provider": "openai", "payload": payload(1600)}, "b-1")
	b.poll("b's task dispatched", func() bool {
		return len(stored[*events.Dispatch](b, topology.StreamDispatch, events.DispatchSubject("b"))) == 1
	})
	if n := len(stored[*events.Dispatch](b, topology.StreamDispatch, events.DispatchSubject("a"))); n != 4 {
		t.Errorf("%d of a's tasks dispatched, want 4", n)
	}
	if n := len(b.raw(topology.StreamTasks, events.TaskSubject("openai", "a"))); n != 4 {
		t.Errorf("%d of a's tasks in %s, want the 4 admitted (the refused one removed)", n, topology.StreamTasks)
	}
}

// Finding 3: with per-agent users, the subject is the identity. As
// agent-a, records on a's own subjects that name agent b in the payload
// are dead letters: no decision spends b's budget, no task is dispatched
// to b, no heartbeat is stored as b's subagent.
func TestIsolationAgentCannotSpeakForAnother(t *testing.T) {
	t.Parallel()
	set, err := auth.Init(filepath.Join(t.TempDir(), "auth"), []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	b := newIsoBus(t, "", set)
	a := b.connAs("agent-a")
	now := time.Now().UTC().Format(time.RFC3339Nano)
	b.pub(a, events.OutcomeSubject("openai", "a"), outcomeMap("as-b-429", "b", "openai", 429, false), "as-b-429")
	b.pub(a, events.TaskSubject("openai", "a"), map[string]any{"id": "as-b-task", "agent": "b", "provider": "openai"}, "as-b-task")
	b.pub(a, events.HeartbeatSubject("a"), map[string]any{"at": now, "agent": "b", "subagent": "old", "status": "running"}, "")
	// And a's own records pass.
	b.pub(a, events.OutcomeSubject("openai", "a"), outcomeMap("a-429", "a", "openai", 429, false), "a-429")
	b.poll("a's own decision and three dead letters", func() bool {
		return len(stored[*events.Decision](b, topology.StreamDecisions, events.DecisionSubject("a"))) == 1 &&
			len(b.deadLetters("classifier", events.ErrWrongAgent.Error())) == 1 &&
			len(b.deadLetters(svc.TaskName, events.ErrWrongAgent.Error())) == 1 &&
			len(b.deadLetters(svc.HeartbeatName, events.ErrWrongAgent.Error())) == 1
	})
	if n := len(stored[*events.Decision](b, topology.StreamDecisions, events.DecisionSubject("b"))); n != 0 {
		t.Errorf("%d decisions for b", n)
	}
	if n := len(stored[*events.Dispatch](b, topology.StreamDispatch, events.DispatchSubject("b"))); n != 0 {
		t.Errorf("%d dispatches for b", n)
	}
	hb, err := b.js.KeyValue(b.ctx, topology.BucketHeartbeats)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := hb.Status(b.ctx); err != nil || st.Values() != 0 {
		t.Errorf("heartbeats stored: %v (%v), want none", st.Values(), err)
	}
}

// isoOutage reports network failures of provider for agent until health
// says outage.
func (b *isoBus) outage(provider, agent string) {
	b.t.Helper()
	i := 0
	b.poll(provider+" in an outage", func() bool {
		id := fmt.Sprintf("%s-down-%d", agent, i)
		i++
		b.pub(b.nc, events.OutcomeSubject(provider, agent), outcomeMap(id, agent, provider, 0, false), id)
		return b.health(provider) == events.HealthOutage
	})
}

// recover reports successes of provider until cond holds.
func (b *isoBus) recoverUntil(provider, agent, what string, cond func() bool) {
	b.t.Helper()
	i := 0
	b.poll(what, func() bool {
		id := fmt.Sprintf("%s-up-%d", agent, i)
		i++
		b.pub(b.nc, events.OutcomeSubject(provider, agent), outcomeMap(id, agent, provider, 200, true), id)
		return cond()
	})
}

const isoRecoveryYAML = recScopeYAML + "recovery:\n  drain_rate: 50\n  probe_interval: 300ms\n"

// Finding 5: FAILBUS_SCOPE lost during an outage once came back empty:
// the provider stayed in an outage for good and its held tasks were never
// released. Its state is rebuilt from the health records, so successes
// recover it and the task is released.
func TestIsolationLostScopeStillRecovers(t *testing.T) {
	t.Parallel()
	b := newIsoBus(t, isoRecoveryYAML, nil)
	b.outage("openai", "x")
	b.pub(b.nc, events.TaskSubject("openai", "x"), map[string]any{"id": "held-1", "agent": "x", "provider": "openai"}, "held-1")
	if err := b.js.DeleteKeyValue(b.ctx, topology.BucketScope); err != nil {
		t.Fatal(err)
	}
	b.recoverUntil("openai", "x", "the held task released after recovery", func() bool {
		return len(stored[*events.Dispatch](b, topology.StreamDispatch, events.DispatchSubject("x"))) == 1
	})
	if h := b.health("openai"); h != events.HealthRecovered && h != events.HealthHealthy {
		t.Errorf("health %s after the release", h)
	}
}

// Finding 8: a task held in an outage, whose subagent (started on it by
// its agent) is killed by the checklist, is redispatched once (attempt 2,
// with its payload) and not released again as attempt 1.
func TestIsolationHeldTaskOfKilledSubagentDispatchedOnce(t *testing.T) {
	t.Parallel()
	b := newIsoBus(t, isoRecoveryYAML, nil)
	b.outage("openai", "x")
	for i := range 4 {
		id := fmt.Sprintf("job-%d", i)
		b.pub(b.nc, events.TaskSubject("openai", "x"), map[string]any{"id": id, "agent": "x", "provider": "openai", "payload": map[string]any{"job": id}}, id)
	}
	b.pub(b.nc, events.HeartbeatSubject("x"), map[string]any{"at": time.Now().UTC().Format(time.RFC3339Nano), "agent": "x",
		"subagent": "worker", "provider": "openai", "task_id": "job-0", "interval_ms": 100}, "")
	b.recoverUntil("openai", "x", "the checklist done", func() bool {
		for _, r := range stored[*events.Recovery](b, topology.StreamRecoveries, events.RecoverySubject("openai")) {
			if r.Done {
				return true
			}
		}
		return false
	})
	got := map[string][]int{}
	for _, d := range stored[*events.Dispatch](b, topology.StreamDispatch, events.DispatchSubject("x")) {
		got[d.TaskID] = append(got[d.TaskID], d.Attempt)
		if len(d.Payload) == 0 {
			t.Errorf("%s attempt %d has no payload", d.TaskID, d.Attempt)
		}
	}
	want := map[string][]int{"job-0": {2}, "job-1": {1}, "job-2": {1}, "job-3": {1}}
	for id, w := range want {
		if !slices.Equal(got[id], w) {
			t.Errorf("%s dispatched as attempts %v, want %v", id, got[id], w)
		}
	}
}

// Finding 7: identifiers in recovery records are checked like an
// outcome's: a credential as a subagent, task id, cron or write key, or a
// task's kind (which the bus copies into dispatches), is a dead letter
// whose reason masks it.
func TestIsolationCredentialsInRecoveryRecords(t *testing.T) {
	t.Parallel()
	b := newIsoBus(t, "", nil)
	const key = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
	now := time.Now().UTC().Format(time.RFC3339Nano)
	b.pub(b.nc, events.HeartbeatSubject("a"), map[string]any{"at": now, "agent": "a", "subagent": key}, "")
	b.pub(b.nc, events.HeartbeatSubject("a"), map[string]any{"at": now, "agent": "a", "subagent": "s", "task_id": key}, "")
	b.pub(b.nc, events.CronSpecSubject("a"), map[string]any{"at": now, "agent": "a", "cron": key, "schedule": "@every 1h"}, "")
	b.pub(b.nc, events.WriteSubject("a"), map[string]any{"at": now, "agent": "a", "key": key}, "")
	b.pub(b.nc, events.TaskSubject("openai", "a"), map[string]any{"id": "t1", "agent": "a", "provider": "openai", "kind": key}, "t1")
	b.poll("five dead letters", func() bool {
		return len(b.deadLetters(svc.HeartbeatName, "looks like a credential"))+len(b.deadLetters(svc.ReportName, "looks like a credential"))+
			len(b.deadLetters(svc.TaskName, "looks like a credential")) == 5
	})
	for _, s := range []string{svc.HeartbeatName, svc.ReportName, svc.TaskName} {
		for _, d := range b.deadLetters(s, "") {
			if strings.Contains(d.Reason, "AbCdEfGh") {
				t.Errorf("%s dead letter repeats the key: %s", s, d.Reason)
			}
		}
	}
	if n := len(stored[*events.Dispatch](b, topology.StreamDispatch, ">")); n != 0 {
		t.Errorf("%d dispatches, want none", n)
	}
}

// The acceptance figure of the flood: FAILBUS_FLOOD=500000 go test -run
// TestIsolationFloodFigure ./e2e prints how long another agent's 429
// waits for its decision while one agent floods distinct provider names
// at FAILBUS_FLOOD_RATE outcomes/s (default 2500).
// Skipped without the variable (it takes minutes); it asserts that the
// decision comes, never how fast.
func TestIsolationFloodFigure(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("FAILBUS_FLOOD"))
	if n <= 0 {
		t.Skip("set FAILBUS_FLOOD=<outcomes> to measure a flood (the acceptance figure uses 500000)")
	}
	b := newIsoBus(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	t.Cleanup(cancel)
	b.ctx = ctx
	b.pub(b.nc, events.OutcomeSubject("openai", "b"), outcomeMap("b-ok", "b", "openai", 200, true), "b-ok")
	rate, _ := strconv.Atoi(os.Getenv("FAILBUS_FLOOD_RATE"))
	if rate <= 0 {
		rate = 2500 // the rate the flood was first seen at
	}
	js, _ := jetstream.New(b.nc)
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		for i := range n {
			if ahead := time.Duration(i)*time.Second/time.Duration(rate) - time.Since(start); ahead > 0 {
				time.Sleep(ahead) // paced: a flood at a steady rate, not a burst
			}
			p := fmt.Sprintf("invented-%07d", i)
			o := outcomeMap("flood-"+strconv.Itoa(i), "flood", p, 200, true)
			data, _ := msgpack.Marshal(o)
			m := nats.NewMsg(events.OutcomeSubject(p, "flood"))
			m.Data = data
			if _, err := js.PublishMsgAsync(m); err != nil {
				t.Error(err)
				return
			}
			if i%1000 == 999 {
				<-js.PublishAsyncComplete()
			}
		}
	}()
	var waits []time.Duration
	for k := 0; ; k++ {
		select {
		case <-done:
			slices.Sort(waits)
			t.Logf("flood of %d at %d/s over %v: %d decisions of b, wait p50 %v, p99 %v, max %v; %d of the flood's outcomes dead letters",
				n, rate, time.Since(start).Round(time.Second), len(waits), waits[len(waits)/2], waits[len(waits)*99/100], waits[len(waits)-1],
				len(b.deadLetters("classifier", "limits.")))
			return
		default:
		}
		id := fmt.Sprintf("b-429-%d", k)
		start := time.Now()
		b.pub(b.nc, events.OutcomeSubject("openai", "b"), outcomeMap(id, "b", "openai", 429, false), id)
		b.poll("b's decision "+id, func() bool {
			return len(stored[*events.Decision](b, topology.StreamDecisions, events.DecisionSubject("b"))) == k+1
		})
		waits = append(waits, time.Since(start))
	}
}
