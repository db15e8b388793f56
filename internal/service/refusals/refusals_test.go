package refusals_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/scopestore"
	"github.com/failbus/failbus/internal/service/refusals"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// t0 is the virtual time refusals are dated with; route clocks are set
// relative to it, so no test waits for a re-probe delay.
var t0 = time.Date(2025, 10, 7, 9, 0, 0, 0, time.UTC)

// clock is a settable route clock shared by the replicas of a test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) Set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// bench is one embedded server with the topology applied.
type bench struct {
	t     *testing.T
	ctx   context.Context
	srv   *embedded.Server
	nc    *nats.Conn
	js    jetstream.JetStream
	clock *clock
	cfg   refusal.Config
	store *refusals.Store
}

func setup(t *testing.T) *bench {
	t.Helper()
	t.Parallel()
	bus := bustest.Start(t, 90*time.Second)
	nc := bus.NC
	srv, js, ctx := bus.Srv, bus.JS, bus.Ctx
	store, err := refusals.OpenStore(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	return &bench{
		t: t, ctx: ctx, srv: srv, nc: nc, js: js, clock: &clock{now: t0}, store: store,
		cfg: refusal.Config{ReprobeDelays: []time.Duration{15 * time.Minute, time.Hour, 6 * time.Hour}, MaxRerenders: 2, StateTTL: 7 * 24 * time.Hour},
	}
}

// start runs one replica of the service, on its own connection, until the
// test ends; it returns once the replica is healthy.
func (b *bench) start(mw ...consumer.Middleware) *refusals.Service {
	b.t.Helper()
	js, err := jetstream.New(embedded.ConnectTest(b.t, b.srv))
	if err != nil {
		b.t.Fatal(err)
	}
	s, err := refusals.New(js, refusals.Config{
		Policy: b.cfg,
		Now:    b.clock.Now,
		Runner: consumer.Config{
			FetchWait:  100 * time.Millisecond,
			Backoff:    []time.Duration{20 * time.Millisecond},
			Middleware: mw,
			Registerer: prometheus.NewRegistry(),
		},
	})
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	b.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.t.Errorf("refusals Run: %v", err)
		}
	})
	b.poll("refusal service healthy", func() bool { return s.Healthy() == nil })
	return s
}

func (b *bench) poll(what string, cond func() bool) {
	b.t.Helper()
	for !cond() {
		select {
		case <-b.ctx.Done():
			b.t.Fatalf("timed out waiting for %s", what)
		case <-time.After(10 * time.Millisecond): // poll interval, bounded by b.ctx
		}
	}
}

// refusalOf is a content_refusal classification of provider in s#segment.
func refusalOf(id, agentName, provider, session string, segment, turn int, at time.Time) *events.Classification {
	return &events.Classification{
		OutcomeID: id, At: events.At(at), Agent: agentName, Provider: provider,
		Class: events.ClassContentRefusal, Scope: events.ScopeContent, Rule: "test",
		Session: session, Segment: segment, Turn: turn, RefusalScope: refusal.ScopeHistory,
	}
}

// publish puts a message on the bus the way the classifier does, with
// Nats-Msg-Id msgID.
func (b *bench) publish(subject string, m events.Message, msgID string) {
	b.t.Helper()
	data, hdr, err := events.Encode(m)
	if err != nil {
		b.t.Fatal(err)
	}
	hdr.Set(nats.MsgIdHdr, msgID)
	if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: subject, Header: hdr, Data: data}); err != nil {
		b.t.Fatal(err)
	}
}

func (b *bench) publishRefusal(c *events.Classification) {
	b.t.Helper()
	b.publish(events.ClassifiedSubject(c.Provider, c.Class), c, "classifier:"+c.OutcomeID+":0")
}

// state reads the record of provider in segment; false when there is none.
func (b *bench) state(segment, provider string) (refusal.Record, bool) {
	b.t.Helper()
	e, found, err := b.store.Get(b.ctx, refusals.Key(segment, provider))
	if err != nil {
		b.t.Fatal(err)
	}
	return e.Record, found
}

// waitIdle waits until consumer has acknowledged everything on its stream.
func (b *bench) waitIdle(stream, name string) {
	b.t.Helper()
	b.poll(name+" idle", func() bool {
		ok, err := embedded.CaughtUp(b.ctx, b.js, stream, name)
		if err != nil {
			b.t.Fatal(err)
		}
		return ok
	})
}

// read returns the decoded messages of stream matching filter, in order.
func read[T events.Message](b *bench, stream, filter string) []T {
	b.t.Helper()
	s, err := b.js.Stream(b.ctx, stream)
	if err != nil {
		b.t.Fatal(err)
	}
	info, err := s.Info(b.ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		b.t.Fatal(err)
	}
	n := 0
	for _, c := range info.State.Subjects {
		n += int(c)
	}
	var out []T
	if n == 0 {
		return out
	}
	oc, err := s.OrderedConsumer(b.ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		b.t.Fatal(err)
	}
	for len(out) < n {
		batch, err := oc.Fetch(n-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			v, err := events.DecodeAs[T](m.Subject(), m.Headers(), m.Data())
			if err != nil {
				b.t.Fatalf("%s: %v", m.Subject(), err)
			}
			out = append(out, v)
			got++
		}
		if got == 0 {
			b.t.Fatalf("%s: read %d of %d messages", filter, len(out), n)
		}
	}
	return out
}

func (b *bench) route(agentName, session string, segment int, providers ...string) events.RouteRecord {
	b.t.Helper()
	rec, err := agent.RequestRoute(b.ctx, b.nc, events.RouteRequest{Agent: agentName, Session: session, Segment: segment, Providers: providers})
	if err != nil {
		b.t.Fatalf("route: %v", err)
	}
	return rec
}

// Two agents (and two service replicas, four handlers each) report refusals
// of one (segment, provider) at once: every one is counted, and the
// notifications are exactly the first refusal and the freeze.
func TestConcurrentRefusalsOfOneKeyNeverLoseACount(t *testing.T) {
	b := setup(t)
	b.start()
	b.start()
	const perAgent = 25
	var wg sync.WaitGroup
	for _, a := range []string{"agent-a", "agent-b"} {
		wg.Go(func() {
			for i := range perAgent {
				b.publishRefusal(refusalOf(fmt.Sprintf("%s-%d", a, i), a, "strict", "s", 1, i, t0.Add(time.Duration(i)*time.Second)))
			}
		})
	}
	wg.Wait()
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)

	rec, ok := b.state("s#1", "strict")
	if !ok || rec.State.Refusals != 2*perAgent {
		t.Fatalf("state %+v (found %v): want %d refusals", rec.State, ok, 2*perAgent)
	}
	if got := read[*events.Decision](b, topology.StreamDecisions, events.DecisionPrefix+".>"); len(got) != 2*perAgent {
		t.Errorf("%d decisions, want one per refusal (%d)", len(got), 2*perAgent)
	}
	notes := read[*events.Notification](b, topology.StreamNotify, events.NotifyPrefix+".>")
	var keys []string
	for _, n := range notes {
		keys = append(keys, n.Severity+" "+n.DedupeKey)
	}
	// Their order on the stream is the order their handlers published, not
	// the order of the refusals: the first refusal's handler may publish
	// after the freezing one's.
	slices.Sort(keys)
	want := []string{"critical provider-refusal:s#1:3:strict", "normal provider-refusal:s#1:0:strict"}
	if !slices.Equal(keys, want) {
		t.Errorf("notifications %q, want %q", keys, want)
	}
}

// A refusal whose handler ran (state written) but whose delivery then failed
// is redelivered: it is recognised by its outcome id, counted once, and its
// decision and notification are published once, as the first run worded
// them.
func TestRedeliveredRefusalCountsOnceAndPublishesOnce(t *testing.T) {
	b := setup(t)
	var mu sync.Mutex
	runs := map[uint64]int{}
	crashAfterHandler := func(next consumer.Handler) consumer.Handler {
		return func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
			err := next(ctx, m, out)
			mu.Lock()
			defer mu.Unlock()
			runs[m.Seq]++
			if err == nil && m.Stream == topology.StreamClassified && m.Delivered == 1 {
				return errors.New("crash after the state was written, before publishing")
			}
			return err
		}
	}
	b.start(crashAfterHandler)
	b.publishRefusal(refusalOf("o-1", "agent-a", "strict", "s", 1, 1, t0))
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)
	b.publishRefusal(refusalOf("o-2", "agent-a", "strict", "s", 1, 2, t0.Add(time.Hour)))
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)

	mu.Lock()
	for seq, n := range runs {
		if n != 2 {
			t.Errorf("classification %d handled %d times, want 2 (the failed delivery and its redelivery)", seq, n)
		}
	}
	mu.Unlock()
	rec, _ := b.state("s#1", "strict")
	if rec.State.Refusals != 2 || !rec.State.RefusedAt.Equal(t0.Add(time.Hour)) {
		t.Errorf("state %+v: want 2 refusals, the latest at +1h", rec.State)
	}
	ds := read[*events.Decision](b, topology.StreamDecisions, events.DecisionSubject("agent-a"))
	slices.SortFunc(ds, func(x, y *events.Decision) int { return strings.Compare(x.OutcomeID, y.OutcomeID) })
	if len(ds) != 2 || ds[0].OutcomeID != "o-1" || ds[1].OutcomeID != "o-2" {
		for _, d := range ds {
			t.Logf("decision %+v", *d)
		}
		t.Fatalf("%d decisions: want one for o-1 and one for o-2", len(ds))
	}
	if !ds[0].DueAt.Equal(t0.Add(15*time.Minute)) || !ds[1].DueAt.Equal(t0.Add(2*time.Hour)) {
		t.Errorf("due_at %v, %v: want +15m after the first refusal and +1h after the second", ds[0].DueAt, ds[1].DueAt)
	}
	if ns := read[*events.Notification](b, topology.StreamNotify, events.NotifyPrefix+".>"); len(ns) != 1 || ns[0].DedupeKey != "provider-refusal:s#1:0:strict" {
		t.Errorf("notifications %+v: want only the first refusal's", ns)
	}
}

// When a re-probe comes due, agents asking at once (through two replicas)
// get it exactly once; the holder may ask again; its refusal ends the claim.
func TestRouteClaimsADueReprobeForExactlyOneAgent(t *testing.T) {
	b := setup(t)
	b.start()
	b.start()
	b.publishRefusal(refusalOf("o-1", "agent-0", "strict", "s", 1, 1, t0))
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)

	b.clock.Set(t0.Add(15*time.Minute - time.Second))
	for _, r := range []events.RouteRecord{b.route("agent-0", "s", 1, "strict", "spare"), b.route("agent-1", "s", 1, "strict", "spare")} {
		if !slices.Equal(r.Allowed, []string{"spare"}) || len(r.Skipped) != 1 || r.Skipped[0].NextProbeAt == nil || !r.Skipped[0].NextProbeAt.Equal(t0.Add(15*time.Minute)) {
			t.Fatalf("before the re-probe: %+v; want strict skipped until +15m", r)
		}
	}

	b.clock.Set(t0.Add(15 * time.Minute))
	const agents = 8
	answers := make([]events.RouteRecord, agents)
	var wg sync.WaitGroup
	for i := range agents {
		wg.Go(func() { answers[i] = b.route(fmt.Sprintf("agent-%d", i), "s", 1, "strict", "spare") })
	}
	wg.Wait()
	holder := -1
	for i, r := range answers {
		switch {
		case slices.Equal(r.Allowed, []string{"strict", "spare"}):
			if holder >= 0 {
				t.Fatalf("agents %d and %d were both allowed the re-probe", holder, i)
			}
			holder = i
		case slices.Equal(r.Allowed, []string{"spare"}):
			if s := r.Skipped[0]; !strings.Contains(s.Reason, "in flight") || s.NextProbeAt == nil || s.Frozen {
				t.Errorf("agent %d: skip %+v; want the claim's reason and its end", i, s)
			}
		default:
			t.Fatalf("agent %d: %+v", i, r)
		}
	}
	if holder < 0 {
		t.Fatal("no agent was allowed the due re-probe")
	}
	name := fmt.Sprintf("agent-%d", holder)
	if r := b.route(name, "s", 1, "strict"); !slices.Equal(r.Allowed, []string{"strict"}) {
		t.Errorf("the holder asking again: %+v; want allowed", r)
	}
	if rec, _ := b.state("s#1", "strict"); rec.Claim.Agent != name || rec.State.Refusals != 1 {
		t.Errorf("record %+v: want %s's claim and the count untouched", rec, name)
	}

	b.publishRefusal(refusalOf("o-2", name, "strict", "s", 1, 2, t0.Add(15*time.Minute)))
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)
	rec, _ := b.state("s#1", "strict")
	if rec.Claim != (refusal.Claim{}) || rec.State.Refusals != 2 {
		t.Errorf("after the holder's refusal: %+v; want no claim and 2 refusals", rec)
	}
	r := b.route("agent-x", "s", 1, "strict")
	if len(r.Allowed) != 0 || r.Skipped[0].NextProbeAt == nil || !r.Skipped[0].NextProbeAt.Equal(t0.Add(75*time.Minute)) {
		t.Errorf("after the refused re-probe: %+v; want strict skipped until +15m+1h", r)
	}
}

// Peek answers without claiming, so a dashboard cannot take a re-probe from
// an agent.
func TestRoutePeekDoesNotClaim(t *testing.T) {
	b := setup(t)
	s := b.start()
	b.publishRefusal(refusalOf("o-1", "agent-0", "strict", "s", 1, 1, t0))
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)
	b.clock.Set(t0.Add(time.Hour))
	r, err := s.Route(b.ctx, events.RouteRequest{Agent: "ops", Session: "s", Segment: 1, Providers: []string{"strict"}}, true)
	if err != nil || !slices.Equal(r.Allowed, []string{"strict"}) {
		t.Fatalf("peek = %+v, %v", r, err)
	}
	if rec, _ := b.state("s#1", "strict"); rec.Claim != (refusal.Claim{}) {
		t.Errorf("peek claimed: %+v", rec.Claim)
	}
	body, _ := json.Marshal(map[string]any{"agent": "ops", "session": "s", "segment": 1, "providers": []string{"strict"}, "peek": true})
	msg, err := b.nc.RequestWithContext(b.ctx, events.RefusalRouteSubject, body)
	if err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "" {
		t.Fatalf("peek over NATS: %v %v", err, msg.Header)
	}
	if rec, _ := b.state("s#1", "strict"); rec.Claim != (refusal.Claim{}) {
		t.Errorf("peek over NATS claimed: %+v", rec.Claim)
	}
}

// A boundary retires the session's earlier segments, whoever reported them,
// and leaves the new and later segments and other sessions alone.
func TestBoundaryRetiresEarlierSegmentsOfTheSessionOnly(t *testing.T) {
	b := setup(t)
	b.start()
	for i, k := range []struct {
		session  string
		segment  int
		provider string
	}{
		{"s", 0, "strict"}, {"s", 1, "strict"}, {"s", 1, "other"}, {"s", 2, "strict"}, {"s", 3, "strict"},
		{"s.x", 1, "strict"}, {"s2", 1, "strict"},
	} {
		b.publishRefusal(refusalOf(fmt.Sprintf("o-%d", i), fmt.Sprintf("agent-%d", i%2), k.provider, k.session, k.segment, i, t0))
	}
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)
	bd := &events.Boundary{At: events.At(t0), Agent: "agent-1", Session: "s", Segment: 2, Reason: "tool surface changed"}
	b.publish(events.SegmentSubject(bd.Agent), bd, "boundary:1")
	b.waitIdle(topology.StreamOutcomes, topology.ConsumerRefusalBoundaries)

	for _, k := range []struct {
		segment, provider string
		live              bool
	}{
		{"s#0", "strict", false}, {"s#1", "strict", false}, {"s#1", "other", false},
		{"s#2", "strict", true}, {"s#3", "strict", true}, {"s.x#1", "strict", true}, {"s2#1", "strict", true},
	} {
		if _, found := b.state(k.segment, k.provider); found != k.live {
			t.Errorf("%s/%s: live %v, want %v", k.segment, k.provider, found, k.live)
		}
	}
	// A repeated (or late) boundary changes nothing more.
	b.publish(events.SegmentSubject(bd.Agent), bd, "boundary:again")
	b.waitIdle(topology.StreamOutcomes, topology.ConsumerRefusalBoundaries)
	if _, found := b.state("s#2", "strict"); !found {
		t.Error("a repeated boundary retired the new segment")
	}
}

// A route that reads a state older than half the TTL rewrites it unchanged,
// so a segment in use keeps its state; the refusal clock does not move.
func TestRouteRefreshesTheTTLOfStateInUse(t *testing.T) {
	b := setup(t)
	b.cfg = refusal.Config{ReprobeDelays: []time.Duration{time.Millisecond}, MaxRerenders: 2, StateTTL: 3 * time.Second}
	b.start()
	b.publishRefusal(refusalOf("o-1", "agent-0", "strict", "s", 1, 1, t0))
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)
	// The TTL is long enough that a loaded machine cannot let the entry
	// expire between the write and this read; the refresh comes after half
	// of it.
	first, found, err := b.store.Get(b.ctx, refusals.Key("s#1", "strict"))
	if err != nil || !found {
		t.Fatalf("state after the refusal: found=%v err=%v", found, err)
	}
	b.poll("a route to refresh the state", func() bool {
		b.route("agent-0", "s", 1, "spare", "strict")
		e, _, err := b.store.Get(b.ctx, refusals.Key("s#1", "strict"))
		if err != nil {
			t.Fatal(err)
		}
		return e.Revision != first.Revision
	})
	e, _, _ := b.store.Get(b.ctx, refusals.Key("s#1", "strict"))
	if !refusal.TouchDue(first.Written, e.Written, b.cfg) {
		t.Errorf("rewritten %v after the last write; want at least half the TTL", e.Written.Sub(first.Written))
	}
	if string(e.Raw) != string(first.Raw) {
		t.Errorf("the refresh changed the value:\n%+v\n%+v", first.Record, e.Record)
	}
}

// The bucket TTL is the backstop for state no boundary retires: a frozen
// segment that nobody routes or refuses any more expires, and the provider
// may receive the (abandoned) segment again.
func TestBucketTTLRetiresStateNoBoundaryRetires(t *testing.T) {
	b := setup(t)
	if err := topology.Apply(b.ctx, b.js, topology.Options{
		BucketTTL: map[string]time.Duration{topology.BucketRefusals: time.Second},
	}); err != nil {
		t.Fatalf("apply topology with a short refusal TTL: %v", err)
	}
	b.start()
	for i := range 1 + b.cfg.MaxReprobes() {
		b.publishRefusal(refusalOf(fmt.Sprintf("o-%d", i), "agent-0", "strict", "s", 1, i, t0.Add(time.Duration(i)*7*time.Hour)))
	}
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)
	if rec, ok := b.state("s#1", "strict"); !ok || !rec.State.Frozen(b.cfg) {
		t.Fatalf("state %+v (found %v): want frozen", rec.State, ok)
	}
	// No route and no boundary: only the TTL can retire it.
	b.poll("the bucket TTL to retire the state", func() bool {
		_, ok := b.state("s#1", "strict")
		return !ok
	})
	b.clock.Set(t0.Add(1000 * time.Hour))
	if r := b.route("agent-0", "s", 1, "strict", "spare"); !slices.Equal(r.Allowed, []string{"strict", "spare"}) {
		t.Fatalf("route after the TTL: %+v", r)
	}
}

// A value an operator put by hand without a refusal count is frozen, and a
// junk classification is dead-lettered while the service goes on.
func TestLegacyValueIsFrozenAndJunkIsDeadLettered(t *testing.T) {
	b := setup(t)
	b.start()
	key := refusals.Key("s#1", "strict")
	if _, err := b.store.KV().Put(b.ctx, key, []byte(`{"segment":"s#1","provider":"strict","refused_at":"2025-10-07T09:00:00Z"}`)); err != nil {
		t.Fatal(err)
	}
	b.clock.Set(t0.Add(1000 * time.Hour))
	r := b.route("agent-0", "s", 1, "strict", "spare")
	if !slices.Equal(r.Allowed, []string{"spare"}) || !r.Skipped[0].Frozen || !strings.Contains(r.Skipped[0].Reason, "without a usable refusal count") {
		t.Errorf("legacy value: %+v; want strict frozen", r)
	}

	b.publish(events.ClassifiedSubject("strict", events.ClassContentRefusal), &events.Classification{OutcomeID: "x", Class: events.ClassContentRefusal, Rule: "r"}, "junk-1")
	hdr := nats.Header{}
	hdr.Set(nats.MsgIdHdr, "junk-2")
	if _, err := b.js.PublishMsg(b.ctx, &nats.Msg{Subject: events.ClassifiedSubject("strict", events.ClassContentRefusal), Header: hdr, Data: []byte("\xc1 not msgpack")}); err != nil {
		t.Fatal(err)
	}
	b.publishRefusal(refusalOf("o-ok", "agent-0", "fine", "s", 1, 1, t0))
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)
	dl := read[*events.DeadLetter](b, topology.StreamDLQ, events.DLQSubject(refusals.Name))
	if len(dl) != 2 {
		t.Fatalf("%d dead letters, want 2: %+v", len(dl), dl)
	}
	if _, found := b.state("s#1", "fine"); !found {
		t.Error("the good refusal after the junk was not applied")
	}
}

// `nats micro ls` / `nats micro info` find the route service and its
// endpoint; bad requests get micro error answers.
func TestRouteServiceIsDiscoverableAndRejectsBadRequests(t *testing.T) {
	b := setup(t)
	b.start()
	subj, err := micro.ControlSubject(micro.InfoVerb, refusals.ServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := b.nc.RequestWithContext(b.ctx, subj, nil)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	if info.Name != refusals.ServiceName || len(info.Endpoints) != 1 || info.Endpoints[0].Name != refusals.RouteEndpoint ||
		info.Endpoints[0].Subject != events.RefusalRouteSubject || info.Metadata["rule"] != refusal.Rule(b.cfg) {
		t.Errorf("service info %+v", info)
	}
	// `nats micro ls` asks every service at once ($SRV.INFO, $SRV.PING
	// without a name): the route service answers those too.
	for _, verb := range []micro.Verb{micro.PingVerb, micro.InfoVerb} {
		all, err := micro.ControlSubject(verb, "", "")
		if err != nil {
			t.Fatal(err)
		}
		msg, err := b.nc.RequestWithContext(b.ctx, all, nil)
		if err != nil {
			t.Fatalf("%s: %v", all, err)
		}
		var id micro.ServiceIdentity
		if err := json.Unmarshal(msg.Data, &id); err != nil {
			t.Fatalf("%s: %v", all, err)
		}
		if id.Name != refusals.ServiceName || id.Version != refusals.ServiceVersion || id.ID == "" {
			t.Errorf("%s answered %s", all, msg.Data)
		}
	}

	for _, tt := range []struct {
		name string
		body string
	}{
		{"not JSON", "\x00"},
		{"no agent", `{"session":"s","segment":1,"providers":["p"]}`},
		{"no providers", `{"agent":"a","session":"s","segment":1}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			msg, err := b.nc.RequestWithContext(b.ctx, events.RefusalRouteSubject, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got := msg.Header.Get(micro.ErrorCodeHeader); got != "400" {
				t.Errorf("error code %q (%s), want 400", got, msg.Header.Get(micro.ErrorHeader))
			}
		})
	}
	_, err = agent.RequestRoute(b.ctx, b.nc, events.RouteRequest{Session: "s", Providers: []string{"p"}})
	var re *agent.RouteError
	if !errors.As(err, &re) || re.Code != "400" {
		t.Errorf("RequestRoute without an agent: %v; want a 400 RouteError", err)
	}
}

// A provider whose fault scope (FAILBUS_SCOPE, written by the scheduler)
// says outage is skipped by route, as in simulate, without claiming its due
// re-probe; once it recovered, the segment's refusal state decides again.
func TestRouteSkipsAProviderInAnOutageWithoutClaiming(t *testing.T) {
	b := setup(t)
	b.cfg = refusal.Config{ReprobeDelays: []time.Duration{time.Minute}, MaxRerenders: 2, StateTTL: time.Hour}
	b.start()
	b.publishRefusal(refusalOf("o-1", "agent-0", "strict", "s", 1, 1, t0))
	b.waitIdle(topology.StreamClassified, topology.ConsumerRefusals)
	b.clock.Set(t0.Add(2 * time.Minute)) // the re-probe is due

	b.setOutage("strict", true, "every profile fails at the network layer")
	r := b.route("agent-0", "s", 1, "strict", "spare")
	if !slices.Equal(r.Allowed, []string{"spare"}) || len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0].Reason, "provider outage: every profile fails") {
		t.Fatalf("during the outage: %+v; want strict skipped for the outage", r)
	}
	if rec, _ := b.state("s#1", "strict"); rec.Claim.Agent != "" {
		t.Errorf("the outage skip claimed the re-probe for %q", rec.Claim.Agent)
	}

	b.setOutage("strict", false, "")
	r = b.route("agent-1", "s", 1, "strict", "spare")
	if !slices.Equal(r.Allowed, []string{"strict", "spare"}) {
		t.Fatalf("after recovery: %+v; want the due re-probe of strict allowed", r)
	}
	if rec, _ := b.state("s#1", "strict"); rec.Claim.Agent != "agent-1" {
		t.Errorf("re-probe claimed by %q, want agent-1", rec.Claim.Agent)
	}
}

// setOutage writes provider's fault scope as the scheduler would: in an
// outage for reason, or recovered.
func (b *bench) setOutage(provider string, down bool, reason string) {
	b.t.Helper()
	st, err := scopestore.Open(b.ctx, b.js, scopestore.Options{})
	if err != nil {
		b.t.Fatal(err)
	}
	err = st.Update(b.ctx, provider, func(rec *engine.ProviderRecord) (bool, error) {
		rec.State.Outage, rec.State.OutageReason = down, reason
		if down {
			rec.State.OutageSince = events.At(t0)
		} else {
			rec.State.OutageSince = events.Time{}
		}
		return true, nil
	})
	if err != nil {
		b.t.Fatal(err)
	}
}
