package bench

// Decision latency at fixed rates, and retry lateness and memory with many
// retries pending: the figures the goals name beside their raw JetStream
// counterparts, measured in the same run on the same server.

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/streamread"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// benchLatency is the publish → stored latency at one fixed rate.
type benchLatency struct {
	// Rate is the outcomes (raw: messages) published per second, paced.
	Rate int `json:"rate_per_s"`
	// Raw: a raw JetStream relay (pull consumer, async publish of the
	// message to a second stream, ack once stored): publish → relayed
	// copy stored.
	Raw benchPercentiles `json:"raw"`
	// Failbus: an outcome published → its decision stored on
	// failbus.decision.<agent> (classifier, then scheduler: fault scope,
	// ledger, schedule, decision).
	Failbus benchPercentiles `json:"failbus"`
	// AchievedPerS is the rate the failbus outcomes were published at.
	AchievedPerS float64 `json:"achieved_per_s"`
	// Hops splits Failbus by where the time went, each outcome's stored
	// times read back from the streams after the run (nothing reads them
	// during it): publish → outcome stored, → its classification stored
	// (the classifier), → its decision stored (the scheduler).
	Hops *benchHops `json:"hops,omitempty"`
	// CoresNeeded is the CPU the whole process (server, every service,
	// the load) needs to keep up with Rate: Rate × the failbus CPU per
	// outcome of the throughput rounds (median). Above GOMAXPROCS the
	// decisions' queue can only grow for as long as the rate lasts, so
	// p99 measures the run's length more than the bus.
	CoresNeeded float64 `json:"cores_needed"`
}

// benchHops is a decision's latency by hop, from the stored times of the
// outcome, its classification and its decision.
type benchHops struct {
	Publish    benchPercentiles `json:"publish"`    // publish → outcome stored
	Classifier benchPercentiles `json:"classifier"` // outcome stored → classification stored
	Scheduler  benchPercentiles `json:"scheduler"`  // classification stored → decision stored
}

// benchPending is the run with many retries pending.
type benchPending struct {
	// N retries pending through failbus, and N raw @at schedules pending
	// in a scratch stream, all due long after the run.
	N int `json:"n"`
	// DecidedPerS is how fast the N retries were decided and scheduled.
	DecidedPerS float64 `json:"decided_per_s"`
	// RSSBeforeMiB, RSSRawMiB and RSSAfterMiB are the whole process's
	// resident set (nats-server, every service, the bench) before, after
	// the N raw schedules are stored, and once the N failbus retries are
	// scheduled too; the Heap figures the Go heap in use after a GC. The
	// bench's own copies of the messages are released before each
	// measurement. The scheduler runs in this process, so its growth is a
	// part of the failbus step (After − Raw), which also holds the
	// server's state for the outcomes, classifications, ledger entries,
	// schedules and decisions the N retries wrote.
	RSSBeforeMiB  float64 `json:"rss_before_mib"`
	RSSRawMiB     float64 `json:"rss_raw_mib"`
	RSSAfterMiB   float64 `json:"rss_after_mib"`
	HeapBeforeMiB float64 `json:"heap_before_mib"`
	HeapRawMiB    float64 `json:"heap_raw_mib"`
	HeapAfterMiB  float64 `json:"heap_after_mib"`
	// HeapByOwner splits the Go heap in use at the same three points by
	// who allocated it (the heap profile's stacks: nats-server, the
	// scheduler, the consumer runner, other failbus services, the bench,
	// other), so the scheduler's share of the growth is a figure, not a
	// reading of a profile by hand.
	HeapByOwner []benchHeapOwner `json:"heap_by_owner"`
	// Lateness is the K-retry lateness measured with the N pending.
	Lateness benchLateness `json:"lateness"`
}

// benchHeapOwner is one owner's estimated heap in use (MiB) before, after
// the raw schedules and after the failbus retries (heapByOwner).
type benchHeapOwner struct {
	Owner     string  `json:"owner"`
	BeforeMiB float64 `json:"before_mib"`
	RawMiB    float64 `json:"raw_mib"`
	AfterMiB  float64 `json:"after_mib"`
}

// heapOwnerTable lines up three heapByOwner snapshots.
func heapOwnerTable(before, raw, after map[string]float64) []benchHeapOwner {
	out := make([]benchHeapOwner, 0, len(heapOwners))
	for _, o := range heapOwners {
		out = append(out, benchHeapOwner{Owner: o, BeforeMiB: before[o], RawMiB: raw[o], AfterMiB: after[o]})
	}
	return out
}

// latencyAt measures the raw relay and failbus at rate for secs seconds.
func (r *benchRunner) latencyAt(ctx context.Context, rate int, secs float64) (benchLatency, error) {
	out := benchLatency{Rate: rate}
	n := max(int(float64(rate)*secs), 1)
	raw, err := r.rawRelayLatency(ctx, rate, n)
	if err != nil {
		return out, fmt.Errorf("raw relay at %d/s: %w", rate, err)
	}
	fb, hops, achieved, err := r.failbusDecisionLatency(ctx, rate, n)
	if err != nil {
		return out, fmt.Errorf("failbus at %d/s: %w", rate, err)
	}
	out.Raw, out.Failbus, out.Hops, out.AchievedPerS = percentiles(raw), percentiles(fb), hops, achieved
	return out, nil
}

// pace publishes msgs at rate per second (async, window cfg.window),
// calling sent with each message's index and publish time, and returns
// the rate achieved.
func (r *benchRunner) pace(ctx context.Context, msgs []*nats.Msg, rate int, sent func(i int, at time.Time)) (float64, error) {
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for i, m := range msgs {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait) // pacing the load generator, not a test
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		sent(i, time.Now())
		if _, err := r.js.PublishMsgAsync(m, benchStall); err != nil {
			return 0, fmt.Errorf("publish to %s: %w", m.Subject, err)
		}
	}
	return float64(len(msgs)) / time.Since(start).Seconds(), nil
}

// collector gathers stored − sent for messages identified by an id. Once
// full, sent and storedAt hold each message's publish and stored time
// (nothing writes them after: a copy stored again is not counted).
type collector struct {
	mu       sync.Mutex
	sent     map[string]time.Time
	storedAt map[string]time.Time
	samples  []time.Duration
	want     int
	full     chan struct{}
}

func newCollector(want int) *collector {
	size := max(want, 0)
	return &collector{sent: make(map[string]time.Time, size), storedAt: make(map[string]time.Time, size), want: want, full: make(chan struct{})}
}

func (c *collector) markSent(id string, at time.Time) {
	c.mu.Lock()
	c.sent[id] = at
	c.mu.Unlock()
}

// stored records id's stored time, and reports whether it counted (sent
// and not stored before).
func (c *collector) stored(id string, at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.sent[id]
	if _, again := c.storedAt[id]; !ok || again {
		return false
	}
	c.storedAt[id] = at
	c.samples = append(c.samples, at.Sub(t))
	if len(c.samples) == c.want {
		close(c.full)
	}
	return true
}

// byMsgID is a watch handler: each message recorded at its stored time
// under its Nats-Msg-Id (a raw relay's copies).
func (c *collector) byMsgID(m jetstream.Msg) error {
	if meta, err := m.Metadata(); err == nil {
		c.stored(m.Headers().Get(events.HeaderMsgID), meta.Timestamp)
	}
	return nil
}

// byDecision is a watch handler: each decision recorded at its stored
// time under its outcome id; counted, when set, is called with each one
// that counted (stored).
func (c *collector) byDecision(counted func(*events.Decision)) func(jetstream.Msg) error {
	return func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return nil
		}
		d, err := events.DecodeAs[*events.Decision](m.Subject(), m.Headers(), m.Data())
		if err == nil && c.stored(d.OutcomeID, meta.Timestamp) && counted != nil {
			counted(d)
		}
		return nil
	}
}

// count is how many stored times were recorded, expected how many were
// sent, collected a copy of the samples so far: for a collector whose
// count is not known ahead (want -1, never full).
func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.samples)
}

func (c *collector) expected() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sent)
}

func (c *collector) collected() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.samples)
}

func (c *collector) wait(ctx context.Context) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, benchWait)
	defer cancel()
	select {
	case <-c.full:
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.samples, nil
	case <-ctx.Done():
		c.mu.Lock()
		defer c.mu.Unlock()
		return nil, fmt.Errorf("%d of %d stored: %w", len(c.samples), c.want, ctx.Err())
	}
}

// rawRelayLatency: n messages paced at rate into the raw stream; a relay
// consumes each, publishes it async to the relay stream and acks it once
// stored (the pipelined runner's shape, without failbus); latency is the
// relayed copy's stored time − the publish time.
func (r *benchRunner) rawRelayLatency(ctx context.Context, rate, n int) ([]time.Duration, error) {
	tag := "lat" + strconv.Itoa(rate)
	col := newCollector(n)
	w, err := watch.Start(ctx, r.js, watch.Config{Stream: benchRelayStream, Filters: []string{benchRelayPrefix + "." + tag + ".>"}, Follow: true}, col.byMsgID)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	cons, err := r.js.CreateConsumer(ctx, benchRawStream, jetstream.ConsumerConfig{
		Name: "bench-" + tag, AckPolicy: jetstream.AckExplicitPolicy, FilterSubject: benchRawPrefix + "." + tag + ".>",
		DeliverPolicy: jetstream.DeliverNewPolicy, MaxAckPending: 1000,
	})
	if err != nil {
		return nil, fmt.Errorf("relay consumer: %w", err)
	}
	defer func() { _ = r.js.DeleteConsumer(context.WithoutCancel(ctx), benchRawStream, "bench-"+tag) }()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		id := m.Headers().Get(events.HeaderMsgID)
		h := nats.Header{}
		h.Set(events.HeaderMsgID, id)
		f, err := r.js.PublishMsgAsync(&nats.Msg{Subject: benchRelayPrefix + "." + tag + ".x", Header: h, Data: m.Data()}, benchStall)
		if err != nil {
			return
		}
		go func() {
			select {
			case <-f.Ok():
				_ = m.Ack()
			case <-f.Err():
			case <-ctx.Done():
			}
		}()
	}, jetstream.PullMaxMessages(256))
	if err != nil {
		return nil, err
	}
	defer cc.Stop()
	msgs := make([]*nats.Msg, n)
	for i := range msgs {
		h := nats.Header{}
		h.Set(events.HeaderMsgID, tag+"-"+strconv.Itoa(i))
		msgs[i] = &nats.Msg{Subject: benchRawPrefix + "." + tag + ".x", Header: h, Data: []byte("bench latency")}
	}
	if _, err := r.pace(ctx, msgs, rate, func(i int, at time.Time) { col.markSent(msgs[i].Header.Get(events.HeaderMsgID), at) }); err != nil {
		return nil, err
	}
	return col.wait(ctx)
}

// failbusDecisionLatency: n failures (each its own step, a 429 asking for a
// retry after a minute) paced at rate; latency is the decision's stored
// time − the outcome's publish time, also split by hop (hopsOf).
func (r *benchRunner) failbusDecisionLatency(ctx context.Context, rate, n int) ([]time.Duration, *benchHops, float64, error) {
	agent := "bench-lat-" + strconv.Itoa(rate)
	col := newCollector(n)
	w, err := watch.Start(ctx, r.js, watch.Config{Stream: topology.StreamDecisions, Filters: []string{events.DecisionSubject(agent)}, Follow: true}, col.byDecision(nil))
	if err != nil {
		return nil, nil, 0, err
	}
	defer func() { _ = w.Stop() }()
	msgs, ids, err := failures(agent, n, 30*time.Second)
	if err != nil {
		return nil, nil, 0, err
	}
	classified, err := streamread.LastSeq(ctx, r.js, topology.StreamClassified, benchClassified)
	if err != nil {
		return nil, nil, 0, err
	}
	achieved, err := r.pace(ctx, msgs, rate, func(i int, at time.Time) { col.markSent(ids[i], at) })
	if err != nil {
		return nil, nil, 0, err
	}
	samples, err := col.wait(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	hops, err := r.hopsOf(ctx, agent, classified+1, col.sent, col.storedAt)
	if err != nil {
		// The split is a diagnosis: the run's figures stand without it.
		fmt.Fprintf(r.progress, "latency at %d/s: no split by hop: %v\n", rate, err)
		hops = nil
	}
	return samples, hops, achieved, nil
}

// benchClassified filters the classifications of the bench's provider,
// whatever their class.
var benchClassified = events.ClassifiedPrefix + "." + events.Token(benchProvider) + ".*"

// benchHopStall bounds a read-back of hopsOf waiting for its next
// message.
const benchHopStall = 30 * time.Second

// hopsOf reads back, once the run is over, when each of agent's outcomes
// and their classifications (from stream sequence fromClassified on) were
// stored, and splits each outcome's latency from sent (publish time) to
// decided (its decision's stored time) into its three hops.
func (r *benchRunner) hopsOf(ctx context.Context, agent string, fromClassified uint64, sent, decided map[string]time.Time) (*benchHops, error) {
	outcome, classified, err := storedTimes(ctx, r.js,
		watch.Config{Filters: []string{events.OutcomeSubject(benchProvider, agent)}},
		watch.Config{Filters: []string{benchClassified}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, StartSeq: fromClassified},
		sent)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", agent, err)
	}
	h, _, err := splitHops(sent, outcome, classified, decided)
	return h, err
}

// storedTimes reads back, once a run is over, when each outcome of sent
// and its classification were stored: the outcomes as out selects them
// on FAILBUS_OUTCOMES (headers only), the classifications as cls does on
// FAILBUS_CLASSIFIED. The first time each: a copy stored again later
// (past the duplicate window) is not what the decision waited for.
func storedTimes(ctx context.Context, js jetstream.JetStream, out, cls watch.Config, sent map[string]time.Time) (outcome, classified map[string]time.Time, err error) {
	outcome = make(map[string]time.Time, len(sent))
	classified = make(map[string]time.Time, len(sent))
	first := func(at map[string]time.Time, id string, t time.Time) {
		if _, want := sent[id]; !want {
			return
		}
		if _, seen := at[id]; !seen {
			at[id] = t
		}
	}
	out.Stream, out.HeadersOnly, out.Stall = topology.StreamOutcomes, true, benchHopStall
	err = watch.Read(ctx, js, out, func(m jetstream.Msg) error {
		if meta, err := m.Metadata(); err == nil {
			first(outcome, m.Headers().Get(events.HeaderMsgID), meta.Timestamp)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read back the outcomes: %w", err)
	}
	cls.Stream, cls.Stall = topology.StreamClassified, benchHopStall
	err = watch.Read(ctx, js, cls, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return nil
		}
		if c, err := events.DecodeAs[*events.Classification](m.Subject(), m.Headers(), m.Data()); err == nil {
			first(classified, c.OutcomeID, meta.Timestamp)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read back the classifications: %w", err)
	}
	return outcome, classified, nil
}

// hopsOfOne is one outcome's latency by hop.
type hopsOfOne struct {
	sent                 time.Time
	total, pub, cls, sch time.Duration
}

// splitHops splits each outcome's latency, from sent (publish time) to
// decided (its decision's stored time), into its three hops by the
// stored times of the outcome and of its classification; it also
// returns each outcome's split, slowest last.
func splitHops(sent, outcome, classified, decided map[string]time.Time) (*benchHops, []hopsOfOne, error) {
	each := make([]hopsOfOne, 0, len(sent))
	for id, at := range sent {
		o, ok1 := outcome[id]
		c, ok2 := classified[id]
		d, ok3 := decided[id]
		if !ok1 || !ok2 || !ok3 {
			return nil, nil, fmt.Errorf("outcome %s: stored %v, classified %v, decided %v", id, ok1, ok2, ok3)
		}
		each = append(each, hopsOfOne{sent: at, total: d.Sub(at), pub: o.Sub(at), cls: c.Sub(o), sch: d.Sub(c)})
	}
	slices.SortFunc(each, func(a, b hopsOfOne) int { return cmp.Compare(a.total, b.total) })
	hop := func(of func(hopsOfOne) time.Duration) benchPercentiles {
		d := make([]time.Duration, len(each))
		for i, h := range each {
			d[i] = of(h)
		}
		return percentiles(d)
	}
	return &benchHops{
		Publish:    hop(func(h hopsOfOne) time.Duration { return h.pub }),
		Classifier: hop(func(h hopsOfOne) time.Duration { return h.cls }),
		Scheduler:  hop(func(h hopsOfOne) time.Duration { return h.sch }),
	}, each, nil
}

// failures builds n rate-limited outcomes of agent, each the first failure
// of its own step, asking for a retry after delay.
func failures(agent string, n int, delay time.Duration) ([]*nats.Msg, []string, error) {
	msgs, ids := make([]*nats.Msg, n), make([]string, n)
	now := events.At(time.Now())
	for i := range n {
		o := &events.Outcome{
			ID: agent + "-" + strconv.Itoa(i), At: now, Agent: agent, Session: agent + "-" + strconv.Itoa(i%benchSessions),
			Provider: benchProvider, Model: "bench-model", Profile: "key-1", Turn: i + 1, Step: 1, Status: 429,
			Headers: map[string]string{classify.HintRetryAfterMS: strconv.FormatInt(delay.Milliseconds(), 10)},
			Body:    `{"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}}`,
		}
		data, hdr, err := events.Encode(o)
		if err != nil {
			return nil, nil, err
		}
		hdr.Set(events.HeaderMsgID, o.ID)
		msgs[i], ids[i] = &nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: hdr, Data: data}, o.ID
	}
	return msgs, ids, nil
}

// pending puts N retries through failbus and N raw @at schedules in the
// scratch stream, all due an hour after the run, measures memory before and
// after, and then the K-retry lateness with them pending.
func (r *benchRunner) pending(ctx context.Context, n int) (benchPending, error) {
	out := benchPending{N: n}
	out.RSSBeforeMiB, out.HeapBeforeMiB = memory()
	ownersBefore := heapByOwner()

	// Raw: N @at schedules an hour ahead.
	due := time.Now().Add(time.Hour)
	raw := make([]*nats.Msg, n)
	for i := range raw {
		id := "bench-pending-raw-" + strconv.Itoa(i)
		data, hdr, err := events.Encode(&events.RetryDue{RetryID: id, OutcomeID: id, Agent: benchRetryAgent, Retry: 1, DueAt: events.At(due)})
		if err != nil {
			return out, err
		}
		hdr.Set(events.HeaderMsgID, id)
		scheduler.SetSchedule(hdr, due, benchSchedPrefix+".pending-due")
		raw[i] = &nats.Msg{Subject: benchSchedPrefix + ".pending." + strconv.Itoa(i), Header: hdr, Data: data}
	}
	if err := r.publishAll(ctx, raw); err != nil {
		return out, fmt.Errorf("raw schedules: %w", err)
	}
	raw = nil //nolint:ineffassign // released before measuring
	out.RSSRawMiB, out.HeapRawMiB = memory()
	ownersRaw := heapByOwner()

	// failbus: N failures asking for a retry in an hour (the bench's
	// policy allows it), each its own step.
	agent := "bench-pending"
	col := newCollector(n)
	w, err := watch.Start(ctx, r.js, watch.Config{Stream: topology.StreamDecisions, Filters: []string{events.DecisionSubject(agent)}, Follow: true}, func(m jetstream.Msg) error {
		if d, err := events.DecodeAs[*events.Decision](m.Subject(), m.Headers(), m.Data()); err == nil {
			col.stored(d.OutcomeID, time.Now())
		}
		return nil
	})
	if err != nil {
		return out, err
	}
	msgs, ids, err := failures(agent, n, benchPendingDelay)
	if err != nil {
		_ = w.Stop()
		return out, err
	}
	start := time.Now()
	for _, id := range ids {
		col.markSent(id, start)
	}
	if err := r.publishAll(ctx, msgs); err != nil {
		_ = w.Stop()
		return out, err
	}
	msgs, ids = nil, nil //nolint:ineffassign // released before measuring
	if _, err := col.wait(ctx); err != nil {
		_ = w.Stop()
		return out, fmt.Errorf("failbus retries decided: %w", err)
	}
	_ = w.Stop()
	out.DecidedPerS = float64(n) / time.Since(start).Seconds()
	if err := r.poll(ctx, "the services to catch up", func() (bool, error) { return r.settled(ctx) }); err != nil {
		return out, err
	}
	out.RSSAfterMiB, out.HeapAfterMiB = memory()
	out.HeapByOwner = heapOwnerTable(ownersBefore, ownersRaw, heapByOwner())
	lat, err := r.lateness(ctx)
	if err != nil {
		return out, err
	}
	out.Lateness = lat
	return out, nil
}

// benchPendingDelay is how far ahead the pending retries are due: beyond
// any run, within the bench policy's max_delay.
const benchPendingDelay = 50 * time.Minute

// memory is the process's resident set (VmRSS, Linux; 0 elsewhere) and
// the Go heap in use after a GC, in MiB.
func memory() (rss, heap float64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heap = float64(ms.HeapInuse) / (1 << 20)
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, heap
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, heap
		}
	}
	return 0, heap
}

// printLatency writes the latency and pending tables.
func printLatency(w io.Writer, rep *benchReport) {
	if len(rep.Latency) > 0 {
		fmt.Fprintln(w)
		t := benchTable{align: "lrrrrrrr"}
		t.add("DECISION LATENCY (publish → stored)", "rate", "achieved", "raw p50", "raw p99", "failbus p50", "failbus p99", "cores needed")
		for _, l := range rep.Latency {
			t.add("", strconv.Itoa(l.Rate)+"/s", human(l.AchievedPerS)+"/s", fmtMS(l.Raw.P50MS), fmtMS(l.Raw.P99MS), fmtMS(l.Failbus.P50MS), fmtMS(l.Failbus.P99MS),
				coresNeeded(l.CoresNeeded, rep.Machine.GOMAXPROCS))
		}
		t.write(w)
		fmt.Fprintln(w, "raw: a relay (pull, async publish to a second stream, ack once stored); failbus: outcome → classifier → scheduler → decision stored.")
		h := benchTable{align: "lrrrrrrr"}
		h.add("FAILBUS BY HOP (p50 / p99)", "rate", "publish → outcome", "→ classified", "→ decided")
		for _, l := range rep.Latency {
			if l.Hops == nil {
				continue
			}
			pp := func(p benchPercentiles) string { return fmtMS(p.P50MS) + " / " + fmtMS(p.P99MS) }
			h.add("", strconv.Itoa(l.Rate)+"/s", pp(l.Hops.Publish), pp(l.Hops.Classifier), pp(l.Hops.Scheduler))
		}
		h.write(w)
		fmt.Fprintln(w, "each outcome's stored times read back from the streams after the run: the classifier's hop and the scheduler's (fault scope, ledger, schedule, decision);")
		fmt.Fprintln(w, "each hop's percentiles are its own: they do not add up to the whole's.")
		fmt.Fprintln(w, "cores needed: the rate × failbus CPU per outcome in the throughput rounds (median; batches there are larger than at a paced rate,")
		fmt.Fprintln(w, "so it is a floor), for the server, every service and the load together: at or above GOMAXPROCS the decisions queue for as long as the rate lasts.")
	}
	if p := rep.Pending; p != nil {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "WITH %d RETRIES PENDING (failbus) AND %d RAW @at SCHEDULES (due in %v), decided at %s/s\n", p.N, p.N, benchPendingDelay, human(p.DecidedPerS))
		fmt.Fprintf(w, "process RSS (nats-server, every service, the bench): %.0f MiB, %+.0f MiB with the raw schedules, %+.0f MiB more with the failbus retries\n",
			p.RSSBeforeMiB, p.RSSRawMiB-p.RSSBeforeMiB, p.RSSAfterMiB-p.RSSRawMiB)
		fmt.Fprintf(w, "Go heap in use: %.0f MiB, %+.0f MiB with the raw schedules, %+.0f MiB more with the failbus retries\n",
			p.HeapBeforeMiB, p.HeapRawMiB-p.HeapBeforeMiB, p.HeapAfterMiB-p.HeapRawMiB)
		if len(p.HeapByOwner) > 0 {
			parts := make([]string, 0, len(p.HeapByOwner))
			total := 0.0
			for _, o := range p.HeapByOwner {
				parts = append(parts, fmt.Sprintf("%s %+.1f", o.Owner, o.AfterMiB-o.RawMiB))
				total += o.AfterMiB - o.RawMiB
			}
			fmt.Fprintf(w, "  the failbus step's live objects by who allocated them (heap profile): %+.0f MiB, of it %s\n", total, strings.Join(parts, ", "))
		}
		l := p.Lateness
		t := benchTable{align: "lrrrrr"}
		t.add(fmt.Sprintf("LATENESS WITH THEM PENDING (%d each)", l.K), "n", "p50", "p99", "min", "max")
		lrow := func(name string, s benchPercentiles) {
			t.add(name, strconv.Itoa(s.N), fmtMS(s.P50MS), fmtMS(s.P99MS), fmtMS(s.MinMS), fmtMS(s.MaxMS))
		}
		lrow("raw JetStream @at: stored − due", l.Raw)
		lrow("failbus scheduler: stored − due_at", l.Failbus)
		t.add("failbus − raw", "", fmtSignedMS(l.DiffP50MS), fmtSignedMS(l.DiffP99MS), "", "")
		t.write(w)
	}
}

// writeProfile writes the runtime profile name ("heap" after a GC, or
// "block") to path, while the bus still holds what the run left pending.
func writeProfile(path, name string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("%s profile: %w", name, err)
	}
	defer f.Close()
	if name == "heap" {
		runtime.GC() // what is in use, not what awaits collection
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		return fmt.Errorf("%s profile: %w", name, err)
	}
	return nil
}

// coresNeeded shows a rate's CPU need against GOMAXPROCS; "n/a" where the
// process's CPU time is not measured (not unix).
func coresNeeded(cores float64, procs int) string {
	if cores <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f of %d", cores, procs)
}
