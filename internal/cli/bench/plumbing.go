package bench

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/jspub"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/service/classifier"
	"github.com/failbus/failbus/internal/service/scheduler"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// The plumbing: the bus's shape, on failbus's own consumer runner, with the
// policy taken out. Two runners, each on a connection of its own, with
// the consumer settings and concurrency of the stages they stand for:
//
//   - classify: outcomes → classify.Classify → one classification stored
//     (the classifier, which is nearly all plumbing);
//   - decide: a classification → for a class the default policy retries,
//     a ledger entry appended with compare-and-set (waited for: persist
//     before wait), then its schedule (`@at` an hour ahead) and the
//     decision, stored together; otherwise a give_up decision — the
//     scheduler's stream writes and round trips, without the fault scope,
//     the ledger read-back, the budget or the refusal tiers.
//
// (Nothing reads the decisions: the recovery service reads the few it
// needs when a probe is due, not each as it is stored.)
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

// benchPlumbStages are the plumbing's two runners.
var benchPlumbStages = []benchPlumbStage{
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
		concurrency: scheduler.DefaultConcurrency, key: scheduler.BudgetLane,
		handler: func(js jetstream.JetStream) consumer.Handler {
			pol := retry.Default().Resolve("")
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
}

// plumbing publishes msgs (copies of the round's outcomes under ids of
// their own) to the raw scratch stream and returns the time until a
// decision of each is stored and both stages have acknowledged
// everything, and what the process spent meanwhile.
func (r *benchRunner) plumbing(ctx context.Context, msgs []*nats.Msg) (elapsed time.Duration, use usage, err error) {
	rctx, stop := context.WithCancel(ctx)
	finished := make(chan struct{}) // closed once every runner has returned
	var (
		conns   []*nats.Conn
		runners []ops.Runnable
		cons    []jetstream.Consumer
		running bool // RunAll started: finished closes
		runErr  error
	)
	defer func() {
		stop()
		if running {
			<-finished
		}
		for _, nc := range conns {
			nc.Close()
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, s := range benchPlumbStages {
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
	for _, s := range benchPlumbStages {
		_, cc, ok := topology.Consumer(s.like)
		if !ok {
			return 0, use, fmt.Errorf("plumbing: no topology consumer %s", s.like)
		}
		st, err := r.js.Stream(ctx, s.stream)
		if err != nil {
			return 0, use, fmt.Errorf("plumbing: %s: %w", s.stream, err)
		}
		// From the stream's next message: each round's consumer is new.
		last := st.CachedInfo().State.LastSeq
		cc.Durable, cc.Name, cc.FilterSubject, cc.FilterSubjects = s.name, "", "", nil
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, last+1
		cc.Description = "failbus bench plumbing, configured like " + s.like
		c, err := r.js.CreateConsumer(ctx, s.stream, cc)
		if err != nil {
			return 0, use, fmt.Errorf("plumbing: consumer %s: %w", s.name, err)
		}
		cons = append(cons, c)
		nc, err := r.b.Srv.Connect(nats.Name("failbus-" + s.name))
		if err != nil {
			return 0, use, fmt.Errorf("plumbing: connect: %w", err)
		}
		conns = append(conns, nc)
		js, err := jetstream.New(nc)
		if err != nil {
			return 0, use, fmt.Errorf("plumbing: %w", err)
		}
		run, err := consumer.New(js, consumer.Config{
			Service: s.name, Stream: s.stream, Consumer: s.name,
			Concurrency: s.concurrency, Key: s.key,
		}, s.handler(js))
		if err != nil {
			return 0, use, fmt.Errorf("plumbing: %w", err)
		}
		runners = append(runners, run)
	}
	go func() {
		runErr = ops.RunAll(rctx, runners...)
		close(finished)
	}()
	running = true

	decisionsBefore, err := r.streamMsgs(ctx, benchPlumbDecisions)
	if err != nil {
		return 0, use, err
	}
	m := startMeter()
	t0 := time.Now()
	if err := r.publishAll(ctx, msgs); err != nil {
		return 0, use, fmt.Errorf("plumbing publish: %w", err)
	}
	want := decisionsBefore + uint64(len(msgs))
	if err := r.poll(ctx, "the plumbing to decide every outcome", func() (bool, error) {
		select {
		case <-finished:
			return false, fmt.Errorf("the plumbing's runners stopped: %w", runErr)
		default:
		}
		// One decision per outcome (their ids deduplicate), every stage
		// caught up.
		if got, err := r.streamMsgs(ctx, benchPlumbDecisions); err != nil || got < want {
			return false, err
		}
		for i, s := range benchPlumbStages {
			if ok, err := embedded.ConsumerCaughtUp(ctx, r.js, s.stream, cons[i]); err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	}); err != nil {
		return 0, use, err
	}
	elapsed = time.Since(t0)
	return elapsed, m.since(), nil
}

// plumbRetry stores a retry the way the scheduler does, without deciding
// it: the ledger entry first (compare-and-set on its subject, waited for),
// then the schedule and the decision, sent together and waited for.
func plumbRetry(ctx context.Context, js jetstream.JetStream, id string, d *events.Decision, subject string) error {
	d.Action, d.RetryID = events.ActionRetry, "plumb-"+id
	due := events.RetryDue{RetryID: d.RetryID, Agent: d.Agent, OutcomeID: d.OutcomeID, DueAt: events.At(time.Now().Add(benchPlumbScheduleAhead))}
	if _, err := jspub.Publish(ctx, js, benchSchedPrefix+".plumb.ledger."+events.Token(id), &due, "bench-plumb:"+id+":ledger", nil,
		jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		return err
	}
	hdr := nats.Header{}
	scheduler.SetSchedule(hdr, due.DueAt.Time, benchSchedPrefix+".plumb.due."+events.Token(d.Agent))
	sched, err := jspub.NewMsg(benchSchedPrefix+".plumb.schedule."+events.Token(id), &due, "bench-plumb:"+id+":schedule", hdr)
	if err != nil {
		return err
	}
	dec, err := jspub.NewMsg(subject, d, "bench-plumb:"+id+":decision", nil)
	if err != nil {
		return err
	}
	var fs []jetstream.PubAckFuture
	for _, m := range []*nats.Msg{sched, dec} {
		f, err := js.PublishMsgAsync(m, benchStall)
		if err != nil {
			return fmt.Errorf("plumbing publish %s: %w", m.Subject, err)
		}
		fs = append(fs, f)
	}
	for _, f := range fs {
		if err := jspub.AwaitPub(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// plumbMsgs are copies of the round's raw outcomes under ids of their own.
func plumbMsgs(raw []*nats.Msg) []*nats.Msg {
	out := make([]*nats.Msg, len(raw))
	for i, m := range raw {
		h := maps.Clone(m.Header)
		h.Set(events.HeaderMsgID, "plumb-"+m.Header.Get(events.HeaderMsgID))
		out[i] = &nats.Msg{Subject: m.Subject, Header: h, Data: m.Data}
	}
	return out
}
