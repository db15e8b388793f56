package cluster

import (
	"math/rand/v2"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/testcluster"
)

// chaosEnv turns on the long chaos run: FAILBUS_CHAOS=1 (or a duration,
// e.g. 3m, for how long to bounce nodes; 1m by default).
const chaosEnv = "FAILBUS_CHAOS"

// Nodes are bounced while every service runs and agents publish (the
// shape of nats-server's own chaos tests): every few seconds one or two
// nodes are SIGKILLed and brought back a moment later, for a minute. The
// same counts hold: every outcome classified once, every failure decided
// once, every retry due once, every notification delivered once.
//
// It takes minutes under -race on two cores, so it runs only with
// FAILBUS_CHAOS set; the node-loss test is its short form in CI.
func TestClusterPipelineWhileNodesBounce(t *testing.T) {
	v := os.Getenv(chaosEnv)
	if v == "" {
		t.Skip("set " + chaosEnv + "=1 (or a duration) to bounce nodes for a minute under the whole pipeline")
	}
	chaos := time.Minute
	if d, err := time.ParseDuration(v); err == nil {
		chaos = d
	}
	start := time.Now()
	w := workload{n: outcomes(t, 30_000), agents: 20}
	p := startPipeline(t, chaos+20*time.Minute)
	el := p.watchElections("")

	// The election watcher is connected to some node; bounce the others
	// and it, too, so no node is spared. Advisories sent while the
	// watcher reconnects are missed; the count is a lower bound.
	var bounces, doubles atomic.Int64
	stopChaos := make(chan struct{})
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		rng := rand.New(rand.NewPCG(12, uint64(start.UnixNano())))
		deadline := time.Now().Add(chaos)
		for time.Now().Before(deadline) {
			nodes := p.c.Nodes()
			k := 1 + rng.IntN(2)
			victims := make([]*testcluster.Node, 0, k)
			for _, i := range rng.Perm(len(nodes))[:k] {
				victims = append(victims, nodes[i])
			}
			for _, n := range victims {
				n.Kill()
			}
			bounces.Add(1)
			if k == 2 {
				doubles.Add(1)
			}
			select {
			case <-stopChaos:
			case <-time.After(time.Duration(500+rng.IntN(2000)) * time.Millisecond): // down for 0.5-2.5 s
			}
			for _, n := range victims {
				n.Restart()
			}
			select {
			case <-stopChaos:
				return
			case <-time.After(time.Duration(2000+rng.IntN(3000)) * time.Millisecond): // up for 2-5 s
			}
		}
	}()
	failed := p.publish(w, 16, nil)
	published := time.Since(start)
	<-chaosDone
	close(stopChaos)
	if err := p.c.WaitHealthy(p.ctx); err != nil {
		t.Fatal(err)
	}
	p.settle()
	r := p.check(w, p.count())
	r.publishRetries = failed
	t.Logf("bounce: %d bounces in %s (%d of two nodes at once); all published at %s, settled at %s",
		bounces.Load(), chaos, doubles.Load(), published.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	t.Logf("bounce: %s", r)
	t.Logf("bounce: leader elections seen (lower bound): %s", el)
}
