package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/testcluster"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Retries are JetStream schedules in FAILBUS_RETRIES. With a thousand of
// them pending (due 45-54 s after their outcomes), the stream's leader is SIGKILLed: the new
// leader fires each schedule once, none is lost, and none fires again when
// the old leader comes back.
func TestClusterRetriesLeaderKilledWithSchedulesPending(t *testing.T) {
	t.Parallel()
	start := time.Now()
	w := workload{n: 1000, agents: 10, retryAfter: true}
	p := startPipeline(t, 8*time.Minute)
	published := time.Now() // the first outcome's time: its retry is due 45 s after it
	failed := p.publish(w, 8, nil)

	// Every retry decided (the scheduler caught up), so every schedule is
	// written; most are not due yet.
	for {
		ok, err := scheduledAll(p.ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		select {
		case <-p.ctx.Done():
			t.Fatal("the scheduler did not catch up")
		case <-time.After(100 * time.Millisecond): // poll interval, bounded by ctx
		}
	}
	pending, err := pendingSchedules(p.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	leader, err := testcluster.StreamLeader(lctx, p.js, topology.StreamRetries)
	cancel()
	if err != nil || leader == "" {
		t.Fatalf("leader of %s: %q %v", topology.StreamRetries, leader, err)
	}
	el := p.watchElections(leader)
	p.c.Node(leader).Kill()
	killedAt := time.Since(start)
	killedAfter := time.Since(published)

	// Back after a new leader was elected.
	for {
		lctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
		now, err := testcluster.StreamLeader(lctx, p.js, topology.StreamRetries)
		cancel()
		if err == nil && now != "" && now != leader {
			break
		}
		select {
		case <-p.ctx.Done():
			t.Fatal("no new leader of FAILBUS_RETRIES")
		case <-time.After(100 * time.Millisecond): // poll interval, bounded by ctx
		}
	}
	lctx, cancel = context.WithTimeout(p.ctx, 10*time.Second)
	newLeader, _ := testcluster.StreamLeader(lctx, p.js, topology.StreamRetries)
	cancel()
	p.c.Node(leader).Restart()
	restartedAt := time.Since(start)
	if err := p.c.WaitHealthy(p.ctx); err != nil {
		t.Fatal(err)
	}
	p.settle()
	r := p.check(w, p.count())
	r.publishRetries = failed
	t.Logf("retries leader: %d schedules pending when %s (leader of %s) was SIGKILLed at %s (%s after publishing began); new leader %s; restarted at %s; settled at %s",
		pending, leader, topology.StreamRetries, killedAt.Round(time.Millisecond), killedAfter.Round(time.Millisecond), newLeader,
		restartedAt.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	t.Logf("retries leader: %s", r)
	t.Logf("retries leader: leader elections seen: %s", el)
	if pending < w.n/2 {
		t.Errorf("only %d of %d schedules were pending at the kill; the test did not kill with schedules pending", pending, w.n)
	}
	if el.Stream(topology.StreamRetries) == 0 {
		t.Errorf("no election of a new %s leader seen", topology.StreamRetries)
	}
}

// scheduledAll reports whether the scheduler acknowledged every
// classification.
func scheduledAll(ctx context.Context, p *pipeline) (bool, error) {
	c, err := p.js.Consumer(ctx, topology.StreamClassified, topology.ConsumerScheduler)
	if err != nil {
		return false, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, err
	}
	cls, err := p.js.Consumer(ctx, topology.StreamOutcomes, topology.ConsumerClassifier)
	if err != nil {
		return false, err
	}
	cinfo, err := cls.Info(ctx)
	if err != nil {
		return false, err
	}
	return cinfo.NumPending == 0 && cinfo.NumAckPending == 0 && info.NumPending == 0 && info.NumAckPending == 0 &&
		info.AckFloor.Stream > 0, nil
}

// pendingSchedules counts the retry schedules not fired yet.
func pendingSchedules(ctx context.Context, p *pipeline) (int, error) {
	s, err := p.js.Stream(ctx, topology.StreamRetries)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(events.RetryPrefix+".sched.>"))
	if err != nil {
		return 0, err
	}
	return len(info.State.Subjects), nil
}
