package bench

// The fleet's raw JetStream pipelines, on the bus's own server: the
// fleet's outcomes published to a scratch stream, relayed by a consumer
// to a second (raw/2: two writes per outcome), and by another to a third
// (raw/3: three). Each relay is JetStream at its best: a pull consumer on
// a connection of its own, configured like the classifier's, publishing
// async and acknowledging each message once its copy is stored.
//
// Two more have the bus's own shape, the least any implementation of
// the contract writes and reads: raw/ok is a success's (the outcome, its
// classification, which a second consumer reads: two writes, two reads)
// and raw/429 a retried failure's (the outcome, its classification, and
// from that one read three writes: a ledger entry and a schedule in a
// stream configured like FAILBUS_RETRIES, a decision in one like
// FAILBUS_DECISIONS). Its schedule is a real one: JetStream fires it as
// late as the storm's retries come due, writing the due message and
// removing the schedule, as it does for the bus.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/service/scheduler"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// fleetRaw is the raw pipelines' streams and relays.
type fleetRaw struct {
	js      jetstream.JetStream // the bench's: streams, consumers, load
	streams []string
	relays  [2]*fleetRelay // in → two, two → three (and retries)
	// due is how long after it is written raw/429's schedule fires: the
	// storm's retry-after.
	due     time.Duration
	mu      sync.Mutex
	running fleetRawShape // the pipeline whose relays run (nil: none yet)
}

// relayWrite is one write a relay makes of each message it reads.
type relayWrite uint8

const (
	// writeNext is a copy in the next stream of the pipeline.
	writeNext relayWrite = iota
	// writeLedger is a copy in the retries stream, as a ledger entry.
	writeLedger
	// writeSchedule is a schedule in the retries stream, on a subject of
	// its own, that fires fleetRaw.due later onto a due subject.
	writeSchedule
)

// fleetRawShape is a raw pipeline: for each relay in order, the writes
// it makes of each message it reads (none: it only reads and
// acknowledges).
type fleetRawShape [][]relayWrite

// The raw pipelines.
var (
	rawTwo   = fleetRawShape{{writeNext}}
	rawThree = fleetRawShape{{writeNext}, {writeNext}}
	rawOK    = fleetRawShape{{writeNext}, {}}
	raw429   = fleetRawShape{{writeNext}, {writeLedger, writeSchedule, writeNext}}
)

// equal reports whether s and o are the same pipeline.
func (s fleetRawShape) equal(o fleetRawShape) bool {
	return slices.EqualFunc(s, o, slices.Equal[[]relayWrite])
}

// rawPipelines name each raw pipeline and say what it writes and reads
// per outcome, for the report.
var rawPipelines = []struct {
	shape      fleetRawShape
	name, what string
}{
	{rawTwo, fleetRawTwoName, "publish + one relayed write"},
	{rawThree, fleetRawThrName, "publish + two relayed writes"},
	{rawOK, fleetRawOKName, "publish + one relayed write, read again: a success's"},
	{raw429, fleetRaw429Name, "publish + one relayed write + three from it: a retried failure's"},
}

// name is the pipeline's name in the report.
func (s fleetRawShape) name() string {
	for _, p := range rawPipelines {
		if s.equal(p.shape) {
			return p.name
		}
	}
	return fmt.Sprint("raw", [][]relayWrite(s))
}

// schedules reports whether the pipeline writes schedules that fire
// later.
func (s fleetRawShape) schedules() bool {
	return slices.ContainsFunc(s, func(w []relayWrite) bool { return slices.Contains(w, writeSchedule) })
}

// rawWhat says what the raw pipeline called name writes and reads per
// outcome.
func rawWhat(name string) string {
	for _, p := range rawPipelines {
		if p.name == name {
			return p.what
		}
	}
	return name
}

// fleetRelay is one relay stage: a durable consumer and, while running,
// the loop that relays what it delivers.
type fleetRelay struct {
	name, stream, to string
	cons             jetstream.Consumer
	js               jetstream.JetStream // its own connection's
	nc               *nats.Conn
	cc               jetstream.ConsumeContext // nil while stopped
	done             chan struct{}            // closes the acker
	writes           []relayWrite             // while running
}

// relayed is a message whose copies are being stored.
type relayed struct {
	fs []jetstream.PubAckFuture
	m  jetstream.Msg
}

// startRaw creates the scratch streams (deleted by close; on a running
// bus, a leftover of an interrupted run is replaced) and the relays'
// consumers.
func (r *fleetRunner) startRaw(ctx context.Context) (_ *fleetRaw, err error) {
	raw := &fleetRaw{js: r.js, due: r.rawDue}
	if raw.due <= 0 {
		raw.due = fleetStormRetryAfter
	}
	defer func() {
		if err != nil {
			raw.close(ctx)
		}
	}()
	for _, s := range []struct{ from, name, prefix string }{
		{topology.StreamOutcomes, fleetRawIn, fleetRawInPfx},
		{topology.StreamClassified, fleetRawTwo, fleetRawTwoPfx},
		{topology.StreamDecisions, fleetRawThree, fleetRawThrPfx},
		{topology.StreamRetries, fleetRawRetries, fleetRawRetPfx},
	} {
		st, err := r.js.Stream(ctx, s.from)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", s.from, err)
		}
		c := st.CachedInfo().Config
		c.Name, c.Subjects, c.Metadata = s.name, []string{s.prefix + ".>"}, nil
		c.Description = "failbus bench --fleet scratch stream, configured like " + s.from + "; deleted at the end of the run"
		_ = r.js.DeleteStream(ctx, s.name) // an interrupted run's
		if _, err := r.js.CreateStream(ctx, c); err != nil {
			return nil, fmt.Errorf("create %s: %w", s.name, err)
		}
		raw.streams = append(raw.streams, s.name)
	}
	_, cc, ok := topology.Consumer(topology.ConsumerClassifier)
	if !ok {
		return nil, fmt.Errorf("no topology consumer %s", topology.ConsumerClassifier)
	}
	for i, s := range []struct{ name, from, to string }{
		{fleetRelayOne, fleetRawIn, fleetRawTwoPfx},
		{fleetRelayTwo, fleetRawTwo, fleetRawThrPfx},
	} {
		c := cc
		c.Durable, c.Name, c.FilterSubject, c.FilterSubjects = s.name, "", "", nil
		c.DeliverPolicy = jetstream.DeliverNewPolicy
		c.Description = "failbus bench --fleet relay, configured like " + topology.ConsumerClassifier
		cons, err := r.js.CreateConsumer(ctx, s.from, c)
		if err != nil {
			return nil, fmt.Errorf("consumer %s: %w", s.name, err)
		}
		nc, err := r.dial("bench-" + s.name)
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("jetstream: %w", err)
		}
		raw.relays[i] = &fleetRelay{name: s.name, stream: s.from, to: s.to, cons: cons, js: js, nc: nc}
	}
	return raw, nil
}

// use runs the relays of shape and stops the others.
func (raw *fleetRaw) use(shape fleetRawShape) error {
	raw.mu.Lock()
	defer raw.mu.Unlock()
	if raw.running != nil && raw.running.equal(shape) {
		return nil
	}
	for i, rl := range raw.relays {
		want := i < len(shape)
		if rl.cc != nil && (!want || !slices.Equal(rl.writes, shape[i])) {
			rl.stop()
		}
		if want && rl.cc == nil {
			if err := rl.start(shape[i], raw.due); err != nil {
				return err
			}
		}
	}
	raw.running = slices.Clone(shape)
	return nil
}

// start relays what the consumer delivers: writes of each message
// published async, each under its own id, the message acknowledged in
// delivery order once they are stored (no writes: at once). A schedule
// fires due after it is written.
func (rl *fleetRelay) start(writes []relayWrite, due time.Duration) error {
	acks := make(chan relayed, 4096)
	done := make(chan struct{})
	cc, err := rl.cons.Consume(func(m jetstream.Msg) {
		if len(writes) == 0 {
			_ = m.Ack()
			return
		}
		id := m.Headers().Get(events.HeaderMsgID)
		fs := make([]jetstream.PubAckFuture, len(writes))
		for k, w := range writes {
			h := nats.Header{}
			if k == 0 {
				h.Set(events.HeaderMsgID, id)
			} else {
				h.Set(events.HeaderMsgID, id+"-"+strconv.Itoa(k))
			}
			subject := rl.to + ".x"
			switch w {
			case writeLedger:
				subject = fleetRawRetPfx + ".ledger.x"
			case writeSchedule:
				// One schedule per subject, as the bus's retries: the
				// read's stream sequence names it.
				md, err := m.Metadata()
				if err != nil {
					_ = m.Nak()
					return
				}
				subject = fleetRawRetPfx + ".sched." + strconv.FormatUint(md.Sequence.Stream, 10)
				scheduler.SetSchedule(h, time.Now().Add(due), fleetRawDueSubject)
			}
			f, err := rl.js.PublishMsgAsync(&nats.Msg{Subject: subject, Header: h, Data: m.Data()}, benchStall)
			if err != nil {
				_ = m.Nak()
				return
			}
			fs[k] = f
		}
		select {
		case acks <- relayed{fs, m}:
		case <-done:
		}
	}, jetstream.PullMaxMessages(1000))
	if err != nil {
		return fmt.Errorf("relay %s: %w", rl.name, err)
	}
	go func() {
		for {
			select {
			case <-done:
				return
			case x := <-acks:
				ok := true
				for _, f := range x.fs {
					select {
					case <-f.Ok():
					case <-f.Err():
						ok = false
					case <-done:
						return
					}
				}
				if ok {
					_ = x.m.Ack()
				} else {
					_ = x.m.Nak()
				}
			}
		}
	}()
	rl.cc, rl.done, rl.writes = cc, done, slices.Clone(writes)
	return nil
}

func (rl *fleetRelay) stop() {
	rl.cc.Stop()
	<-rl.cc.Closed()
	close(rl.done)
	rl.cc = nil
}

// pipeline is a raw pipeline of shape: the fleet's mix, its bytes
// published to the scratch stream, the backlog of the relays running.
func (raw *fleetRaw) pipeline(r *fleetRunner, shape fleetRawShape) fleetPipeline {
	return fleetPipeline{
		name:    shape.name(),
		retries: shape.schedules(),
		prepare: func() error { return raw.use(shape) },
		next: func(tag string, i int, at events.Time) (*nats.Msg, string, fleetKind, error) {
			m, id, kind, err := r.gen.msg(loadMix, tag, i, at)
			if err != nil {
				return nil, "", kind, err
			}
			id = "raw-" + id
			m.Subject = fleetRawInPfx + ".x"
			m.Header.Set(events.HeaderMsgID, id)
			return m, id, kind, nil
		},
		backlog: func(ctx context.Context) (int, error) {
			var cs []fleetConsumer
			for _, rl := range raw.relays[:len(shape)] {
				cs = append(cs, fleetConsumer{stream: rl.stream, c: rl.cons})
			}
			return backlogOf(ctx, cs)
		},
		reset: func(ctx context.Context) {
			// Drained: nothing here is read again; keep the scratch
			// streams small. Schedules not yet fired stay: JetStream
			// fires them as it fires the bus's (fleetRaw.due).
			for _, s := range raw.streams {
				st, err := raw.js.Stream(ctx, s)
				if err != nil {
					continue
				}
				if s != fleetRawRetries {
					_ = st.Purge(ctx)
					continue
				}
				for _, subj := range []string{fleetRawRetPfx + ".ledger.x", fleetRawDueSubject} {
					_ = st.Purge(ctx, jetstream.WithPurgeSubject(subj))
				}
			}
		},
	}
}

// latency runs raw/3 at rate for --latency-hold: publish → the second
// relayed copy stored.
func (raw *fleetRaw) latency(ctx context.Context, r *fleetRunner, rate int) ([]time.Duration, error) {
	p := raw.pipeline(r, rawThree)
	col := newCollector(-1)
	w, err := watch.Start(ctx, raw.js, watch.Config{Stream: fleetRawThree, Follow: true, DeliverPolicy: jetstream.DeliverNewPolicy, HeadersOnly: true}, col.byMsgID)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	r.steps++
	tag := r.run + "-raw-lat-" + fmt.Sprint(r.steps)
	if _, _, err := r.publish(ctx, p, tag, rate, r.cfg.latencyHold, nil, func(id string, _ fleetKind, at time.Time) { col.markSent(id, at) }); err != nil {
		return nil, err
	}
	if _, err := r.drain(ctx, p, time.Now()); err != nil {
		return nil, err
	}
	want := col.expected()
	if err := waitFor(ctx, benchWait, func() bool { return col.count() >= want }); err != nil {
		return nil, fmt.Errorf("%d of %d relayed copies read: %w", col.count(), want, err)
	}
	p.reset(ctx)
	return col.collected(), nil
}

// close stops the relays and deletes the consumers and scratch streams.
func (raw *fleetRaw) close(ctx context.Context) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	for _, rl := range raw.relays {
		if rl == nil {
			continue
		}
		if rl.cc != nil {
			rl.stop()
		}
		rl.nc.Close()
	}
	for _, s := range raw.streams {
		_ = raw.js.DeleteStream(dctx, s)
	}
}
