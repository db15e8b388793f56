package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/service/classifier"
	"github.com/failbus/failbus/internal/service/scheduler"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy/classify"
	"github.com/failbus/failbus/pkg/policy/retry"
)

// The plumbing: the bus's shape, on failbus's own consumer runner, with the
// policy taken out. Three runners, each on a connection of its own, with
// the consumer settings and concurrency of the stages they stand for:
//
//   - classify: outcomes → classify.Classify → one classification stored
//     (the classifier, which is nearly all plumbing);
//   - decide: a classification → for a class the default policy retries,
//     a ledger entry appended with compare-and-set (waited for: persist
//     before wait), then its schedule (`@at` an hour ahead) and the
//     decision, stored together; otherwise a give_up decision — the
//     scheduler's stream writes and round trips, without the fault scope,
//     the ledger read-back, the budget or the refusal tiers;
//   - read: every decision read and acknowledged (recovery's decisions
//     consumer).
//
// So the row says what JetStream and pkg/consumer cost for the messages an
// outcome needs, measured in the same run: the gap between it and "every
// service caught up" is what failbus's own work costs (the profile's
// services and their KV state), and the gap between it and raw/3 is what
// the plumbing costs.

// Scratch streams of the plumbing, configured like the failbus streams
// they stand for; the ledger and schedules go to benchSchedStream.
const (
	benchPlumbClassified       = "BENCH_PLUMB_CLASSIFIED"
	benchPlumbClassifiedPrefix = "bench.plumb.classified"
	benchPlumbDecisions        = "BENCH_PLUMB_DECISIONS"
	benchPlumbDecisionsPrefix  = "bench.plumb.decision"
	// benchPlumbReadConcurrency is recovery's decisions runner's.
	benchPlumbReadConcurrency = 4
	// benchPlumbScheduleAhead puts the plumbing's schedules out of the run.
	benchPlumbScheduleAhead = time.Hour
)

// benchPlumbStage is one runner of the plumbing.
type benchPlumbStage struct {
	name, stream, like string // consumer name, stream, topology consumer whose settings it copies
	concurrency        int
	key                func(*consumer.Msg) string
	handler            func(js jetstream.JetStream) consumer.Handler
}

// plumbing publishes msgs (copies of the round's outcomes under ids of
// their own) to the raw scratch stream and returns the time until the
// three stages have handled and acknowledged every one, and the CPU time
// the process spent meanwhile (zero where cpuTime reports nothing).
func (r *benchRunner) plumbing(ctx context.Context, msgs []*nats.Msg) (elapsed, cpu time.Duration, err error) {
	pol := retry.Default().Resolve("")
	// Decisions read, by outcome: a redelivery (a starved process) is
	// read again but counts once.
	var (
		readMu sync.Mutex
		read   = make(map[string]struct{}, len(msgs))
	)
	stages := []benchPlumbStage{
		{name: "bench-plumb-classify", stream: benchRawStream, like: topology.ConsumerClassifier,
			concurrency: classifier.DefaultConcurrency,
			handler: func(jetstream.JetStream) consumer.Handler {
				return func(_ context.Context, m *consumer.Msg, out *consumer.Outputs) error {
					o, err := consumer.ValueAs[*events.Outcome](m)
					if err != nil {
						return consumer.DeadLetter(err.Error())
					}
					c := classify.Classify(o)
					out.Publish(benchPlumbClassifiedPrefix+"."+events.Token(o.Provider)+"."+events.Token(c.Class), &c, "")
					return nil
				}
			}},
		{name: "bench-plumb-decide", stream: benchPlumbClassified, like: topology.ConsumerScheduler,
			concurrency: scheduler.DefaultConcurrency,
			key: func(m *consumer.Msg) string {
				c, err := consumer.ValueAs[*events.Classification](m)
				if err != nil {
					return ""
				}
				return c.Agent + "\x00" + c.Session + "\x00" + c.Provider
			},
			handler: func(js jetstream.JetStream) consumer.Handler {
				return func(ctx context.Context, m *consumer.Msg, out *consumer.Outputs) error {
					c, err := consumer.ValueAs[*events.Classification](m)
					if err != nil {
						return consumer.DeadLetter(err.Error())
					}
					d := events.Decision{OutcomeID: c.OutcomeID, At: c.At, Agent: c.Agent, Provider: c.Provider, Class: c.Class, Action: events.ActionGiveUp}
					subject := benchPlumbDecisionsPrefix + "." + events.Token(c.Agent)
					if !pol.IsRetryable(c.Class) {
						out.Publish(subject, &d, "decision")
						return nil
					}
					return plumbRetry(ctx, js, m.ID(), &d, subject)
				}
			}},
		{name: "bench-plumb-read", stream: benchPlumbDecisions, like: topology.ConsumerRecoveryDecisions,
			concurrency: benchPlumbReadConcurrency,
			handler: func(jetstream.JetStream) consumer.Handler {
				return func(_ context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
					d, err := consumer.ValueAs[*events.Decision](m)
					if err != nil {
						return consumer.DeadLetter(err.Error())
					}
					readMu.Lock()
					read[d.OutcomeID] = struct{}{}
					readMu.Unlock()
					return nil
				}
			}},
	}

	rctx, stop := context.WithCancel(ctx)
	defer stop()
	// Runners started, and those seen to stop early (runnerStopped).
	done := make(chan error, len(stages))
	started, stopped := 0, 0
	runnerStopped := func() error {
		select {
		case err := <-done:
			stopped++
			return fmt.Errorf("a plumbing runner stopped: %v", err)
		default:
			return nil
		}
	}
	var conns []*nats.Conn
	defer func() {
		stop()
		for ; stopped < started; stopped++ {
			<-done
		}
		for _, nc := range conns {
			nc.Close()
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, s := range stages {
			_ = r.js.DeleteConsumer(dctx, s.stream, s.name)
		}
		// Nothing of the plumbing stays for later measurements (its
		// schedules would be pending through them).
		for _, p := range []struct{ stream, subject string }{
			{benchRawStream, benchRawPrefix + ".>"}, {benchPlumbClassified, ">"}, {benchPlumbDecisions, ">"}, {benchSchedStream, benchSchedPrefix + ".plumb.>"},
		} {
			if st, err := r.js.Stream(dctx, p.stream); err == nil {
				_ = st.Purge(dctx, jetstream.WithPurgeSubject(p.subject))
			}
		}
	}()
	var watched []jetstream.Consumer
	for _, s := range stages {
		_, cc, ok := topology.Consumer(s.like)
		if !ok {
			return 0, 0, fmt.Errorf("plumbing: no topology consumer %s", s.like)
		}
		st, err := r.js.Stream(ctx, s.stream)
		if err != nil {
			return 0, 0, fmt.Errorf("plumbing: %s: %w", s.stream, err)
		}
		// From the stream's next message: each round's consumer is new.
		cc.Durable, cc.Name, cc.FilterSubject, cc.FilterSubjects = s.name, "", "", nil
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, st.CachedInfo().State.LastSeq+1
		cc.Description = "failbus bench plumbing, configured like " + s.like
		nc, err := r.b.Srv.Connect(nats.Name("failbus-" + s.name))
		if err != nil {
			return 0, 0, fmt.Errorf("plumbing: connect: %w", err)
		}
		conns = append(conns, nc)
		js, err := jetstream.New(nc)
		if err != nil {
			return 0, 0, fmt.Errorf("plumbing: %w", err)
		}
		run, err := consumer.New(js, consumer.Config{
			Service: s.name, Stream: s.stream, Consumer: s.name, ConsumerConfig: &cc,
			Concurrency: s.concurrency, Key: s.key,
		}, s.handler(js))
		if err != nil {
			return 0, 0, fmt.Errorf("plumbing: %w", err)
		}
		go func() { done <- run.Run(rctx) }()
		started++
	}
	// The consumers exist once each runner has bound it.
	if err := r.poll(ctx, "the plumbing's consumers", func() (bool, error) {
		if err := runnerStopped(); err != nil {
			return false, err
		}
		for _, s := range stages[len(watched):] {
			c, err := r.js.Consumer(ctx, s.stream, s.name)
			if err != nil {
				return false, nil
			}
			watched = append(watched, c)
		}
		return true, nil
	}); err != nil {
		return 0, 0, err
	}

	cpu0, _ := cpuTime()
	t0 := time.Now()
	if err := r.publishAll(ctx, msgs); err != nil {
		return 0, 0, fmt.Errorf("plumbing publish: %w", err)
	}
	want := len(msgs)
	if err := r.poll(ctx, "the plumbing to read every decision", func() (bool, error) {
		if err := runnerStopped(); err != nil {
			return false, err
		}
		readMu.Lock()
		n := len(read)
		readMu.Unlock()
		if n < want {
			return false, nil
		}
		for i, s := range stages {
			if ok, err := embedded.ConsumerCaughtUp(ctx, r.js, s.stream, watched[i]); err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	}); err != nil {
		return 0, 0, err
	}
	elapsed = time.Since(t0)
	if cpu1, ok := cpuTime(); ok {
		cpu = cpu1 - cpu0
	}
	return elapsed, cpu, nil
}

// plumbRetry stores a retry the way the scheduler does, without deciding
// it: the ledger entry first (compare-and-set on its subject, waited for),
// then the schedule and the decision, sent together and waited for.
func plumbRetry(ctx context.Context, js jetstream.JetStream, id string, d *events.Decision, subject string) error {
	d.Action, d.RetryID = events.ActionRetry, "plumb-"+id
	due := events.RetryDue{RetryID: d.RetryID, Agent: d.Agent, OutcomeID: d.OutcomeID, DueAt: events.At(time.Now().Add(benchPlumbScheduleAhead))}
	ledger, err := consumer.NewMsg(benchSchedPrefix+".plumb.ledger."+events.Token(id), &due, "bench-plumb:"+id+":ledger", nil)
	if err != nil {
		return err
	}
	if _, err := js.PublishMsg(ctx, ledger, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		return fmt.Errorf("plumbing ledger: %w", err)
	}
	hdr := nats.Header{}
	hdr.Set(scheduler.HeaderSchedule, scheduler.ScheduleHeader(due.DueAt.Time))
	hdr.Set(scheduler.HeaderScheduleTarget, benchSchedPrefix+".plumb.due."+events.Token(d.Agent))
	hdr.Set(scheduler.HeaderTTL, "never")
	sched, err := consumer.NewMsg(benchSchedPrefix+".plumb.schedule."+events.Token(id), &due, "bench-plumb:"+id+":schedule", hdr)
	if err != nil {
		return err
	}
	dec, err := consumer.NewMsg(subject, d, "bench-plumb:"+id+":decision", nil)
	if err != nil {
		return err
	}
	var fs []jetstream.PubAckFuture
	for _, m := range []*nats.Msg{sched, dec} {
		f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(benchStallWait))
		if err != nil {
			return fmt.Errorf("plumbing publish %s: %w", m.Subject, err)
		}
		fs = append(fs, f)
	}
	for _, f := range fs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("plumbing publish %s: %w", f.Msg().Subject, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// plumbMsgs are copies of the round's raw outcomes under ids of their own.
func plumbMsgs(raw []*nats.Msg) []*nats.Msg {
	out := make([]*nats.Msg, len(raw))
	for i, m := range raw {
		h := nats.Header{}
		for k, v := range m.Header {
			h[k] = v
		}
		h.Set(events.HeaderMsgID, "plumb-"+m.Header.Get(events.HeaderMsgID))
		out[i] = &nats.Msg{Subject: m.Subject, Header: h, Data: m.Data}
	}
	return out
}
