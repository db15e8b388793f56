package cluster

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/testcluster"
	topology "github.com/failbus/failbus/jetstream"
)

// outcomesEnv overrides how many outcomes the node-loss test sends (30,000
// by default).
const outcomesEnv = "FAILBUS_CLUSTER_OUTCOMES"

func outcomes(t *testing.T, def int) int {
	if v := os.Getenv(outcomesEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 100 {
			t.Fatalf("%s=%q: want a number of outcomes, at least 100", outcomesEnv, v)
		}
		return n
	}
	return def
}

// The whole pipeline at R3, every service as its own role: a node is
// SIGKILLed a third of the way through 30,000 outcomes (the leader of
// FAILBUS_OUTCOMES, so the stream everything starts from must elect a new
// one) and restarted at two thirds. Every outcome is classified once,
// every failure decided once, every retry due once, every notification
// delivered once.
func TestClusterPipelineLosesANodeAndNothingElse(t *testing.T) {
	t.Parallel()
	start := time.Now()
	w := workload{n: outcomes(t, 30_000), agents: 20}
	p := startPipeline(t, 12*time.Minute)
	lctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	victimName, err := testcluster.StreamLeader(lctx, p.js, topology.StreamOutcomes)
	cancel()
	if err != nil || victimName == "" {
		t.Fatalf("leader of %s: %q %v", topology.StreamOutcomes, victimName, err)
	}
	victim := p.c.Node(victimName)
	el := p.watchElections(victimName)

	var once1, once2 sync.Once
	var killedAt, restartedAt time.Duration
	failed := p.publish(w, 16, func(acked int64) {
		switch {
		case acked == int64(w.n/3):
			once1.Do(func() {
				killedAt = time.Since(start)
				victim.Kill()
			})
		case acked == int64(2*w.n/3):
			once2.Do(func() {
				restartedAt = time.Since(start)
				victim.Restart()
			})
		}
	})
	published := time.Since(start)
	if err := p.c.WaitHealthy(p.ctx); err != nil {
		t.Fatal(err)
	}
	p.settle()
	r := p.check(w, p.count())
	r.publishRetries = failed
	t.Logf("node loss: SIGKILLed %s (leader of %s) at %s, restarted at %s; all published at %s, settled at %s",
		victimName, topology.StreamOutcomes, killedAt.Round(time.Millisecond), restartedAt.Round(time.Millisecond),
		published.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	t.Logf("node loss: %s", r)
	t.Logf("node loss: leader elections seen: %s", el)
	if el.Stream(topology.StreamOutcomes) == 0 {
		t.Errorf("no new leader of %s was elected after its leader died", topology.StreamOutcomes)
	}
}
