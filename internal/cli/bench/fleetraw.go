package bench

// The fleet's raw JetStream pipelines, on the bus's own server: the
// fleet's outcomes published to a scratch stream, relayed by a consumer
// to a second (raw/2: two writes per outcome), and by another to a third
// (raw/3: three). Each relay is JetStream at its best: a pull consumer on
// a connection of its own, configured like the classifier's, publishing
// async and acknowledging each message once its copy is stored.

import (
	"context"
	"fmt"
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
	writes  int // the pipeline running: 2 or 3 (0: none yet)
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
}

// relayed is a message whose copy is being stored.
type relayed struct {
	f jetstream.PubAckFuture
	m jetstream.Msg
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

// use runs the relays of the pipeline with writes stream writes per
// outcome: the first relay for 2, both for 3.
func (raw *fleetRaw) use(writes int) error {
	raw.mu.Lock()
	defer raw.mu.Unlock()
	if raw.writes == writes {
		return nil
	}
	for i, rl := range raw.relays {
		want := i+2 <= writes
		switch {
		case want && rl.cc == nil:
			if err := rl.start(); err != nil {
				return err
			}
		case !want && rl.cc != nil:
			rl.stop()
		}
	}
	raw.writes = writes
	return nil
}

// start relays what the consumer delivers: each message published async
// to the next stream under its own id, acknowledged in delivery order
// once its copy is stored.
func (rl *fleetRelay) start() error {
	acks := make(chan relayed, 4096)
	done := make(chan struct{})
	cc, err := rl.cons.Consume(func(m jetstream.Msg) {
		h := nats.Header{}
		h.Set(events.HeaderMsgID, m.Headers().Get(events.HeaderMsgID))
		f, err := rl.js.PublishMsgAsync(&nats.Msg{Subject: rl.to + ".x", Header: h, Data: m.Data()}, benchStall)
		if err != nil {
			_ = m.Nak()
			return
		}
		select {
		case acks <- relayed{f, m}:
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
				select {
				case <-x.f.Ok():
					_ = x.m.Ack()
				case <-x.f.Err():
					_ = x.m.Nak()
				case <-done:
					return
				}
			}
		}
	}()
	rl.cc, rl.done = cc, done
	return nil
}

func (rl *fleetRelay) stop() {
	rl.cc.Stop()
	<-rl.cc.Closed()
	close(rl.done)
	rl.cc = nil
}

// pipeline is raw/2 or raw/3: the fleet's mix, its bytes published to
// the scratch stream, the backlog of the relays running.
func (raw *fleetRaw) pipeline(r *fleetRunner, writes int) fleetPipeline {
	name := fleetRawTwoName
	if writes == 3 {
		name = fleetRawThrName
	}
	return fleetPipeline{
		name:    name,
		prepare: func() error { return raw.use(writes) },
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
			for _, rl := range raw.relays[:writes-1] {
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
	p := raw.pipeline(r, 3)
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
