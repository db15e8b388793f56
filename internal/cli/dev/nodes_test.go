package dev

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli/clitest"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// TestCLIDevThreeNodes: `failbus dev --nodes 3` is a cluster of three
// servers in one process, every stream at 3 replicas and every consumer
// leasing a first delivery for 5 s; stopping the node that leads the
// classifier's consumer while agents publish (through the ops endpoint)
// loses no outcome and classifies none twice, and the node comes back.
func TestCLIDevThreeNodes(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "store")
	begin := time.Now()
	phase := func(what string) { t.Logf("%s at %s", what, time.Since(begin).Round(10*time.Millisecond)) }
	url, ops, stop := startDevInProcess(t, "--nodes", "3", "--port", "0", "--data", data, "--ops-addr", "127.0.0.1:0")
	if n := strings.Count(url, "nats://"); n != 3 {
		t.Fatalf("NATS_URL %s: want the three nodes' URLs", url)
	}
	call := func(method, path string) string {
		t.Helper()
		req, _ := http.NewRequest(method, ops+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %s %s", method, path, resp.Status, body)
		}
		return string(body)
	}
	if got := call("GET", "/nodes"); strings.Count(got, " running ") != 3 {
		t.Fatalf("GET /nodes:\n%s", got)
	}
	phase("started")
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	js, _ := jetstream.New(nc)
	s, err := js.Stream(ctx, topology.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(ctx, topology.StreamOutcomes, topology.ConsumerClassifier)
	if err != nil {
		t.Fatal(err)
	}
	ci := c.CachedInfo()
	if s.CachedInfo().Config.Replicas != 3 || ci.Config.AckWait != ClusterAckWait || ci.Config.BackOff[0] != ClusterAckWait || ci.Cluster == nil {
		t.Fatalf("replicas %d, ack wait %v, backoff %v: want 3 replicas and a 5s first lease", s.CachedInfo().Config.Replicas, ci.Config.AckWait, ci.Config.BackOff)
	}
	leader := ci.Cluster.Leader[strings.LastIndex(ci.Cluster.Leader, "-")+1:] // failbus-dev-n2 → n2

	bot, err := agent.New(nc, "bot")
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	for i := range n {
		if i == n/2 {
			if got := call("POST", "/nodes/"+leader+"/stop"); !strings.Contains(got, "stopped") {
				t.Fatalf("stop %s: %s", leader, got)
			}
		}
		o := &events.Outcome{ID: fmt.Sprintf("c-%d", i), Provider: "openai", Status: 500, Turn: i}
		for { // an agent publishes an unacknowledged outcome again, same id
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			err := bot.Report(rctx, o)
			rcancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("report %s: %v", o.ID, err)
			}
		}
	}
	phase("published")
	classified := map[string]int{}
	clitest.WaitFor(t, "every outcome classified", func() bool {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		defer rcancel()
		cs, err := js.Stream(rctx, topology.StreamClassified)
		if err != nil {
			return false
		}
		info, err := cs.Info(rctx)
		return err == nil && info.State.Msgs >= n
	})
	phase("classified")
	// Read them back (the client may still be moving off the stopped
	// node: a read that fails is read again whole).
	clitest.WaitFor(t, "the classifications read back", func() bool {
		clear(classified)
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		defer rcancel()
		cons, err := js.OrderedConsumer(rctx, topology.StreamClassified, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return false
		}
		for range n {
			m, err := cons.Next(jetstream.FetchContext(rctx))
			if err != nil {
				return false
			}
			c, err := events.DecodeAs[*events.Classification](m.Subject(), m.Headers(), m.Data())
			if err != nil {
				t.Fatal(err)
			}
			classified[c.OutcomeID]++
		}
		return true
	})
	for i := range n {
		if got := classified[fmt.Sprintf("c-%d", i)]; got != 1 {
			t.Errorf("c-%d classified %d times", i, got)
		}
	}
	phase("read back")
	if got := call("POST", "/nodes/"+leader+"/start"); !strings.Contains(got, "started") {
		t.Fatalf("start %s: %s", leader, got)
	}
	if got := call("GET", "/nodes"); strings.Count(got, " running ") != 3 {
		t.Fatalf("after the restart, GET /nodes:\n%s", got)
	}
	phase("restarted")
	nc.Close()
	defer phase("stopped")
	if code := stop(); code != 0 {
		t.Fatalf("dev exit %d after cancel", code)
	}
}
