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
// from that one read three writes: ledger entry, schedule, decision).

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// fleetRaw is the raw pipelines' streams and relays.
type fleetRaw struct {
	js      jetstream.JetStream // the bench's: streams, consumers, load
	streams []string
	relays  [2]*fleetRelay // in → two, two → three
	mu      sync.Mutex
	running fleetRawShape // the pipeline whose relays run (nil: none yet)
}

// fleetRawShape is a raw pipeline: for each relay in order, how many
// copies it writes of each message it reads (0: it only reads and
// acknowledges).
type fleetRawShape []int

// The raw pipelines.
var (
	rawTwo   = fleetRawShape{1}
	rawThree = fleetRawShape{1, 1}
	rawOK    = fleetRawShape{1, 0}
	raw429   = fleetRawShape{1, 3}
)

// name is the pipeline's name in the report.
func (s fleetRawShape) name() string {
	switch {
	case slices.Equal(s, rawTwo):
		return fleetRawTwoName
	case slices.Equal(s, rawThree):
		return fleetRawThrName
	case slices.Equal(s, rawOK):
		return fleetRawOKName
	case slices.Equal(s, raw429):
		return fleetRaw429Name
	}
	return fmt.Sprint("raw", []int(s))
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
	copies           int                      // while running
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
	raw := &fleetRaw{js: r.js}
	defer func() {
		if err != nil {
			raw.close(ctx)
		}
	}()
	for _, s := range []struct{ from, name, prefix string }{
		{topology.StreamOutcomes, fleetRawIn, fleetRawInPfx},
		{topology.StreamClassified, fleetRawTwo, fleetRawTwoPfx},
		{topology.StreamDecisions, fleetRawThree, fleetRawThrPfx},
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
	if slices.Equal(raw.running, shape) {
		return nil
	}
	for i, rl := range raw.relays {
		want := i < len(shape)
		if rl.cc != nil && (!want || rl.copies != shape[i]) {
			rl.stop()
		}
		if want && rl.cc == nil {
			if err := rl.start(shape[i]); err != nil {
				return err
			}
		}
	}
	raw.running = slices.Clone(shape)
	return nil
}

// start relays what the consumer delivers: copies of each message
// published async to the next stream, each under its own id,
// acknowledged in delivery order once they are stored (copies 0: at
// once).
func (rl *fleetRelay) start(copies int) error {
	acks := make(chan relayed, 4096)
	done := make(chan struct{})
	cc, err := rl.cons.Consume(func(m jetstream.Msg) {
		if copies == 0 {
			_ = m.Ack()
			return
		}
		id := m.Headers().Get(events.HeaderMsgID)
		fs := make([]jetstream.PubAckFuture, copies)
		for k := range fs {
			h := nats.Header{}
			if k == 0 {
				h.Set(events.HeaderMsgID, id)
			} else {
				h.Set(events.HeaderMsgID, id+"-"+strconv.Itoa(k))
			}
			f, err := rl.js.PublishMsgAsync(&nats.Msg{Subject: rl.to + ".x", Header: h, Data: m.Data()}, benchStall)
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
	rl.cc, rl.done, rl.copies = cc, done, copies
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
			// streams small.
			for _, s := range raw.streams {
				if st, err := raw.js.Stream(ctx, s); err == nil {
					_ = st.Purge(ctx)
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
