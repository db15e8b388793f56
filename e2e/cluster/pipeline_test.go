// Package cluster holds failbus's tests on a 3-node NATS cluster (issue
// 12): the whole pipeline at R3 under the users of `failbus auth init`,
// with nodes SIGKILLed and restarted under it, counted on the streams
// themselves.
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/servicespec"
	"github.com/failbus/failbus/internal/testcluster"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/notify"
	"github.com/failbus/failbus/pkg/policy"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

// Replicas is the replication of every stream and bucket in these tests.
const replicas = 3

// pipeline is a 3-node cluster with the users of auth init, the topology
// applied by the admin at R3, every service running as its own role with
// every node's URL, and a webhook sink counting deliveries.
type pipeline struct {
	t       *testing.T
	ctx     context.Context
	c       *testcluster.Cluster
	set     *auth.Set
	admin   *connect.Conn
	js      jetstream.JetStream // the admin's
	sink    *sink
	svcConn []*connect.Conn
	stop    context.CancelFunc
	wg      sync.WaitGroup
	errs    chan error
}

// pipelinePolicy: retries due within seconds (a retry-after up to 60 s is
// taken as is), every notification sent (no daily budget in the way) to
// the test's webhook.
const pipelinePolicy = `
retry:
  initial_delay: 1s
  max_delay: 60s
notify:
  daily_budget: 1000000
  sinks:
    - name: hook
      type: webhook
      url: %s
      idempotent: true
`

func startPipeline(t *testing.T, timeout time.Duration) *pipeline {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	set, err := auth.Init(filepath.Join(t.TempDir(), "auth"), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &pipeline{t: t, ctx: ctx, set: set, sink: newSink(t), errs: make(chan error, 16)}
	p.c = testcluster.Start(t, testcluster.Options{AuthConf: set.ConfPath()})
	p.admin = p.connect(auth.RoleAdmin)
	if p.js, err = jetstream.New(p.admin.Conn); err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse(fmt.Appendf(nil, pipelinePolicy, p.sink.srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(ctx, p.js, daemon.TopologyOptions(pol, replicas, 0)); err != nil {
		t.Fatalf("the admin applies the topology at R%d: %v", replicas, err)
	}
	sctx, stop := context.WithCancel(ctx)
	p.stop = stop
	for _, spec := range servicespec.All() {
		// Each publish waits for a quorum of three: more in flight keeps
		// the classifier up with the agents (a deployment sets the same).
		if spec.Flags != nil && spec.Name == "classifier" {
			fs := flag.NewFlagSet(spec.Name, flag.ContinueOnError)
			spec.Flags(fs)
			if err := fs.Parse([]string{"--concurrency", "16"}); err != nil {
				t.Fatal(err)
			}
		}
		nc := p.connect(spec.Name)
		p.svcConn = append(p.svcConn, nc)
		js, err := jetstream.New(nc.Conn)
		if err != nil {
			t.Fatal(err)
		}
		svc, err := spec.Build(sctx, daemon.Env{JS: js, Policy: pol, Log: zerolog.Nop(), Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatalf("%s: %v", spec.Name, nc.Explain(err))
		}
		p.wg.Go(func() {
			if err := svc.Run(sctx); err != nil || sctx.Err() == nil {
				p.errs <- fmt.Errorf("%s stopped: %w", spec.Name, err)
			}
		})
	}
	t.Cleanup(p.shutdown)
	return p
}

// connect logs in as role with every node's URL, reconnecting quickly.
func (p *pipeline) connect(role string) *connect.Conn {
	p.t.Helper()
	nc, err := connect.Connect(connect.Options{Servers: p.c.URLs(), Nkey: p.set.Seed(role)}, "test-"+role,
		connect.WithNATS(nats.ReconnectWait(250*time.Millisecond), nats.ReconnectJitter(100*time.Millisecond, 0)))
	if err != nil {
		p.t.Fatalf("connect as %s: %v", role, err)
	}
	p.t.Cleanup(nc.Close)
	return nc
}

func (p *pipeline) shutdown() {
	p.stop()
	p.wg.Wait()
}

// failed reports a service that stopped on its own.
func (p *pipeline) failed() error {
	select {
	case err := <-p.errs:
		return err
	default:
		return nil
	}
}

// denials are the permission violations any service connection saw.
func (p *pipeline) denials() []connect.Denial {
	var out []connect.Denial
	for _, c := range p.svcConn {
		out = append(out, c.Denials()...)
	}
	return out
}

// sink is the webhook the notifier delivers to, an idempotent receiver (the
// policy marks it so): it drops a request whose Idempotency-Key it has
// already taken, as such a receiver does, and counts each dedupe key it
// took. The notifier promises exactly once to such a sink; a re-send after
// a send whose answer was lost in the node loss is allowed, and counted in
// resent, but must carry the key it was first sent with.
type sink struct {
	srv    *httptest.Server
	mu     sync.Mutex
	keys   map[string]int
	taken  map[string]string // idempotency key → dedupe key
	resent int
}

func newSink(t *testing.T) *sink {
	s := &sink{keys: map[string]int{}, taken: map[string]string{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var n struct {
			DedupeKey string `json:"dedupe_key"`
		}
		idem := r.Header.Get(notify.HeaderIdempotencyKey)
		if err := json.Unmarshal(body, &n); err != nil || n.DedupeKey == "" || idem == "" {
			http.Error(w, "bad payload or no Idempotency-Key", http.StatusBadRequest)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if k, ok := s.taken[idem]; ok && k == n.DedupeKey {
			s.resent++ // already taken: dropped, as an idempotent receiver does
			return
		}
		s.taken[idem] = n.DedupeKey
		s.keys[n.DedupeKey]++
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *sink) delivered() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.keys))
	for k, v := range s.keys {
		out[k] = v
	}
	return out
}

// workload is what the agents report: n outcomes over agents. The mix is
// mostly successes, with retryable failures (3%% rate limits, 1%% server
// errors, each its own turn, so each is retried), terminal failures (1%%)
// and content refusals of accepted history (2%%, two per segment: the
// first of each segment is notified). With retryAfter, every outcome is a
// rate limit whose retry-after (45-54 s) sets when it comes due: counted
// from the outcome's time (the scheduler decides at the outcome's time, as
// simulate does), so it must outlast the pipeline catching up on the
// cluster for the retries to be pending after it.
type workload struct {
	n, agents  int
	retryAfter bool
}

func (w workload) outcome(i int) *events.Outcome {
	a := fmt.Sprintf("agent-%02d", i%w.agents)
	o := &events.Outcome{ID: fmt.Sprintf("o-%06d", i), Agent: a, Provider: "openai", Model: "gpt", Turn: i, Step: 1, Session: "s-" + a, Segment: 1}
	if w.retryAfter {
		o.Status = 429
		o.Headers = map[string]string{"retry-after": strconv.Itoa(45 + i%10)}
		return o
	}
	switch i % 100 {
	case 0, 1, 2:
		o.Status = 429
	case 3:
		o.Status = 503
	case 4:
		o.Status, o.Body = 400, `{"error":{"message":"Invalid value for 'temperature'"}}`
	case 5, 6:
		o.Provider, o.OK, o.Status, o.StopReason, o.RefusalScope = "strict", true, 200, "refusal", "history"
		o.Session, o.Segment = "refused", i/100
	default:
		o.OK, o.Status = true, 200
	}
	return o
}

// publish reports every outcome of w through n agents, each outcome
// retried with the same id until the stream acknowledges it (a retry that
// finds it stored is a duplicate, as the contract says). at is called with
// the number acknowledged so far after each one. It returns the number of
// publish attempts that failed (and were retried).
func (p *pipeline) publish(w workload, workers int, at func(acked int64)) int64 {
	p.t.Helper()
	ac := p.connect(auth.RoleAgent)
	var next, acked, failed atomic.Int64
	var wg sync.WaitGroup
	ags := map[string]*agent.Agent{}
	for a := range w.agents {
		name := fmt.Sprintf("agent-%02d", a)
		ag, err := agent.New(ac.Conn, name)
		if err != nil {
			p.t.Fatal(err)
		}
		ags[name] = ag
	}
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= w.n || p.ctx.Err() != nil {
					return
				}
				o := w.outcome(i)
				for {
					pctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
					err := ags[o.Agent].Report(pctx, o)
					cancel()
					if err == nil {
						break
					}
					failed.Add(1)
					if p.ctx.Err() != nil {
						p.t.Errorf("outcome %s not acknowledged: %v", o.ID, ac.Explain(err))
						return
					}
				}
				if at != nil {
					at(acked.Add(1))
				}
			}
		})
	}
	wg.Wait()
	if d := ac.Denials(); len(d) > 0 {
		p.t.Errorf("the agent was denied: %v", d)
	}
	return failed.Load()
}

// settle waits until every consumer has acknowledged everything, no retry
// schedule is pending, and every notification requested was delivered.
func (p *pipeline) settle() {
	p.t.Helper()
	for {
		if err := p.failed(); err != nil {
			p.t.Fatal(err)
		}
		done, why, err := p.settled()
		if err != nil {
			p.t.Logf("settle: %v", err) // a node may be electing; ask again
		}
		if done {
			return
		}
		select {
		case <-p.ctx.Done():
			p.t.Fatalf("not settled: %s; denials %v", why, p.denials())
		case <-time.After(250 * time.Millisecond): // poll interval, bounded by ctx
		}
	}
}

func (p *pipeline) settled() (bool, string, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	for _, c := range topology.Consumers() {
		stream, _, _ := topology.Consumer(c)
		ok, err := embedded.CaughtUp(ctx, p.js, stream, c)
		if err != nil {
			return false, c, err
		}
		if !ok {
			return false, "consumer " + c + " behind", nil
		}
	}
	n, err := pendingSchedules(ctx, p)
	if err != nil {
		return false, "retries", err
	}
	if n > 0 {
		return false, fmt.Sprintf("%d retry schedules pending", n), nil
	}
	requested, err := p.notifyKeys(ctx)
	if err != nil {
		return false, "notify", err
	}
	got := p.sink.delivered()
	for k := range requested {
		if got[k] == 0 {
			return false, "notification " + k + " not delivered yet", nil
		}
	}
	return true, "", nil
}

// notifyKeys reads the dedupe keys requested on FAILBUS_NOTIFY.
func (p *pipeline) notifyKeys(ctx context.Context) (map[string]int, error) {
	keys := map[string]int{}
	err := p.read(ctx, topology.StreamNotify, events.NotifyPrefix+".>", func(data []byte) error {
		var n events.Notification
		if err := events.Unmarshal(data, &n); err != nil {
			return err
		}
		keys[n.DedupeKey]++
		return nil
	})
	return keys, err
}

// read calls fn with the data of every message on filter in stream, as
// the admin. It is the test's measuring instrument: a read that fails
// part-way (a JetStream API request unanswered — "no responders" — while
// the node the admin is connected to, just back, catches up) is logged and
// made again from the start every 250 ms until ctx ends. Three immediate
// attempts were not enough once the pipeline settled within moments of the
// restart: all three landed before the node's JetStream was current.
func (p *pipeline) read(ctx context.Context, stream, filter string, fn func(data []byte) error) error {
	for attempt := 1; ; attempt++ {
		all, err := p.readOnce(ctx, stream, filter)
		if err == nil {
			for i, d := range all {
				if err := fn(d); err != nil {
					return fmt.Errorf("%s message %d: %w", stream, i+1, err)
				}
			}
			return nil
		}
		p.t.Logf("read %s (attempt %d): %v", stream, attempt, err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("read %s: %w (after %d attempts)", stream, err, attempt)
		case <-time.After(250 * time.Millisecond): // poll interval, bounded by ctx
		}
	}
}

func (p *pipeline) readOnce(ctx context.Context, stream, filter string) ([][]byte, error) {
	c, err := p.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, err
	}
	defer func() {
		if info := c.CachedInfo(); info != nil {
			_ = p.js.DeleteConsumer(context.WithoutCancel(ctx), stream, info.Name)
		}
	}()
	var out [][]byte
	pending := c.CachedInfo().NumPending
	for uint64(len(out)) < pending {
		batch, err := c.Fetch(int(min(pending-uint64(len(out)), 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		for m := range batch.Messages() {
			out = append(out, m.Data())
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
	}
	return out, nil
}

// counts is what the streams hold after a run.
type counts struct {
	classified map[string]int               // outcome id → classifications
	decisions  map[string][]events.Decision // outcome id → decisions
	due        map[string]int               // retry id → due messages
	notify     map[string]int               // dedupe key → requests
	delivered  map[string]int               // dedupe key → webhook deliveries
}

func (p *pipeline) count() counts {
	p.t.Helper()
	c := counts{classified: map[string]int{}, decisions: map[string][]events.Decision{}, due: map[string]int{}}
	must := func(err error) {
		if err != nil {
			p.t.Fatal(err)
		}
	}
	must(p.read(p.ctx, topology.StreamClassified, events.ClassifiedPrefix+".>", func(data []byte) error {
		var cl events.Classification
		if err := events.Unmarshal(data, &cl); err != nil {
			return err
		}
		c.classified[cl.OutcomeID]++
		return nil
	}))
	must(p.read(p.ctx, topology.StreamDecisions, events.DecisionPrefix+".>", func(data []byte) error {
		var d events.Decision
		if err := events.Unmarshal(data, &d); err != nil {
			return err
		}
		c.decisions[d.OutcomeID] = append(c.decisions[d.OutcomeID], d)
		return nil
	}))
	must(p.read(p.ctx, topology.StreamRetries, events.RetryPrefix+".due.>", func(data []byte) error {
		var r events.RetryDue
		if err := events.Unmarshal(data, &r); err != nil {
			return err
		}
		c.due[r.RetryID]++
		return nil
	}))
	var err error
	c.notify, err = p.notifyKeys(p.ctx)
	must(err)
	c.delivered = p.sink.delivered()
	return c
}

// report is one cluster test's figures.
type report struct {
	sent, classified, lost, doubled          int
	decisions, decisionsDoubled, noDecision  int
	retries, due, dueLost, dueDoubled        int
	notifications, delivered, deliveredTwice int
	refusals, refusedSegments                int
	publishRetries                           int64
}

// check compares the streams with the workload: every outcome classified
// once, every failure decided once, every retry due once, every
// notification delivered once. It fails the test on any difference and
// returns the figures.
func (p *pipeline) check(w workload, c counts) report {
	p.t.Helper()
	var r report
	r.sent = w.n
	for i := range w.n {
		o := w.outcome(i)
		switch n := c.classified[o.ID]; {
		case n == 0:
			r.lost++
			if r.lost <= 5 {
				p.t.Errorf("%s was never classified", o.ID)
			}
		case n > 1:
			r.doubled++
			if r.doubled <= 5 {
				p.t.Errorf("%s classified %d times", o.ID, n)
			}
		}
		r.classified += min(c.classified[o.ID], 1)
		ds := c.decisions[o.ID]
		if !o.OK || o.StopReason != "" {
			r.decisions += min(len(ds), 1)
			if len(ds) == 0 {
				r.noDecision++
				if r.noDecision <= 5 {
					p.t.Errorf("%s (status %d) got no decision", o.ID, o.Status)
				}
			}
		}
		if len(ds) > 1 {
			r.decisionsDoubled++
			if r.decisionsDoubled <= 5 {
				p.t.Errorf("%s got %d decisions: %+v", o.ID, len(ds), ds)
			}
		}
		for _, d := range ds {
			if d.Action != "retry" {
				continue
			}
			r.retries++
			switch n := c.due[d.RetryID]; {
			case n == 0:
				r.dueLost++
				if r.dueLost <= 5 {
					p.t.Errorf("retry %s of %s never came due", d.RetryID, o.ID)
				}
			case n > 1:
				r.dueDoubled++
				if r.dueDoubled <= 5 {
					p.t.Errorf("retry %s of %s came due %d times", d.RetryID, o.ID, n)
				}
			}
			r.due += min(c.due[d.RetryID], 1)
		}
	}
	// Refusal notifications (the refusal tiers): one at
	// the first refusal of a segment and one at freezing, which needs three
	// failed re-probes hours apart and never comes in this run — so one
	// per refused segment, whatever its number of refusals.
	refused := map[string]bool{}
	for i := range w.n {
		if o := w.outcome(i); o.StopReason == "refusal" {
			r.refusals++
			refused[events.SegmentKey(o.Session, o.Segment)] = true
		}
	}
	r.refusedSegments = len(refused)
	for seg := range refused {
		if key := "provider-refusal:" + seg + ":0:strict"; c.notify[key] != 1 {
			p.t.Errorf("refused segment %s: %d notification requests %s, want 1", seg, c.notify[key], key)
		}
	}
	if len(c.notify) != len(refused) {
		p.t.Errorf("%d notifications requested for %d refused segments (%d refusals), want one per segment", len(c.notify), len(refused), r.refusals)
	}
	for k := range c.notify {
		r.notifications++
		switch n := c.delivered[k]; {
		case n == 0:
			p.t.Errorf("notification %s never delivered", k)
		case n > 1:
			r.deliveredTwice++
			p.t.Errorf("notification %s delivered %d times", k, n)
		}
		r.delivered += min(c.delivered[k], 1)
	}
	for k := range c.delivered {
		if c.notify[k] == 0 {
			p.t.Errorf("delivered %s, which nobody requested", k)
		}
	}
	if r.retries == 0 || (r.notifications == 0 && !w.retryAfter) {
		p.t.Errorf("the workload made %d retries and %d notifications; it should exercise both", r.retries, r.notifications)
	}
	if d := p.denials(); len(d) > 0 {
		p.t.Errorf("services were denied: %v", d)
	}
	return r
}

func (r report) String() string {
	return fmt.Sprintf("outcomes sent %d, classified %d, lost %d, doubled %d; failures decided %d (none missing: %v, doubled %d); "+
		"retries %d, due %d (lost %d, doubled %d); refusals %d in %d segments; notifications %d, delivered %d (twice %d); publish attempts retried %d",
		r.sent, r.classified, r.lost, r.doubled, r.decisions, r.noDecision == 0, r.decisionsDoubled,
		r.retries, r.due, r.dueLost, r.dueDoubled, r.refusals, r.refusedSegments, r.notifications, r.delivered, r.deliveredTwice, r.publishRetries)
}

// watchElections counts leader elections from a node other than avoid.
func (p *pipeline) watchElections(avoid string) *testcluster.Elections {
	p.t.Helper()
	for _, n := range p.c.Nodes() {
		if n.Name() == avoid {
			continue
		}
		nc, err := connect.Connect(connect.Options{Servers: n.URL(), Nkey: p.set.Seed(auth.RoleOperator)}, "test-elections")
		if err != nil {
			p.t.Fatal(err)
		}
		p.t.Cleanup(nc.Close)
		el, err := testcluster.WatchElections(nc.Conn)
		if err != nil {
			p.t.Fatal(err)
		}
		p.t.Cleanup(el.Stop)
		return el
	}
	p.t.Fatal("no node to watch from")
	return nil
}
