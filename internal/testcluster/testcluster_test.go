package testcluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/testcluster"
	topology "github.com/failbus/failbus/jetstream"
)

func TestMain(m *testing.M) { testcluster.Main(m) }

// The failbus topology at R3 on a 3-node cluster: every stream and bucket
// has three replicas; a SIGKILLed stream leader is replaced, acknowledged
// messages stay, and the node catches up after its restart.
func TestTopologyAtR3SurvivesALeaderKill(t *testing.T) {
	t.Parallel()
	// In process here: e2e/cluster runs child-process nodes all the time.
	for _, inProcess := range []bool{true} {
		t.Run(fmt.Sprintf("in process %v", inProcess), func(t *testing.T) {
			c := testcluster.Start(t, testcluster.Options{InProcess: inProcess})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			if err := topology.Apply(ctx, js, topology.Options{Replicas: 3}); err != nil {
				t.Fatalf("Apply R3: %v", err)
			}
			for _, s := range topology.Streams() {
				st, err := js.Stream(ctx, s.Name)
				if err != nil {
					t.Fatal(err)
				}
				if r := st.CachedInfo().Config.Replicas; r != 3 {
					t.Errorf("%s: %d replicas", s.Name, r)
				}
			}
			for _, b := range topology.Buckets() {
				kv, err := js.KeyValue(ctx, b.Bucket)
				if err != nil {
					t.Fatal(err)
				}
				st, err := kv.Status(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas != 3 {
					t.Errorf("bucket %s not at 3 replicas", b.Bucket)
				}
			}

			// Watch elections from a node that stays up.
			leader, err := testcluster.StreamLeader(ctx, js, topology.StreamOutcomes)
			if err != nil || leader == "" {
				t.Fatalf("leader %q %v", leader, err)
			}
			var watcher *testcluster.Node
			for _, n := range c.Nodes() {
				if n.Name() != leader {
					watcher = n
				}
			}
			wc, err := nats.Connect(watcher.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer wc.Close()
			el, err := testcluster.WatchElections(wc)
			if err != nil {
				t.Fatal(err)
			}
			defer el.Stop()

			const n = 200
			for i := range n {
				if i == n/2 {
					c.Node(leader).Kill()
				}
				msg := &nats.Msg{Subject: "failbus.outcome.p.a", Data: []byte("x"), Header: nats.Header{"Nats-Msg-Id": {fmt.Sprint(i)}}}
				for {
					pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
					_, err := js.PublishMsg(pctx, msg)
					pcancel()
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						t.Fatalf("publish %d: %v", i, err)
					}
				}
			}
			c.Node(leader).Restart()
			if err := c.WaitHealthy(ctx); err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(ctx, topology.StreamOutcomes)
			if err != nil {
				t.Fatal(err)
			}
			if got := st.CachedInfo().State.Msgs; got != n {
				t.Errorf("%d messages stored, want %d", got, n)
			}
			newLeader, _ := testcluster.StreamLeader(ctx, js, topology.StreamOutcomes)
			if newLeader == leader {
				t.Errorf("leader still %s", leader)
			}
			if el.Stream(topology.StreamOutcomes) < 1 {
				t.Errorf("no election of a new %s leader seen: %s", topology.StreamOutcomes, el)
			}
			t.Logf("killed %s (leader of %s); new leader %s; %s", leader, topology.StreamOutcomes, newLeader, el)
		})
	}
}

// A node's file store limit is failbus's own default, not the server's 75%
// of the free disk: the topology's reservations (7.6 GB per node at
// R3) place on a machine whatever it has free, as on a failbus dev bus.
func TestNodesHoldTheTopologysReservationsWhateverTheDiskHasFree(t *testing.T) {
	t.Parallel()
	c := testcluster.Start(t, testcluster.Options{Standalone: true, InProcess: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Nodes()[0].MonitorURL()+"/jsz", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var jsz struct {
		Config struct {
			MaxStorage int64 `json:"max_storage"`
		} `json:"config"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil {
		t.Fatal(err)
	}
	if jsz.Config.MaxStorage != embedded.DefaultMaxStore {
		t.Errorf("max_storage %d, want embedded.DefaultMaxStore %d", jsz.Config.MaxStorage, embedded.DefaultMaxStore)
	}
	if need := topology.DefaultReservedBytes; jsz.Config.MaxStorage < need {
		t.Errorf("max_storage %d holds less than the topology reserves, %d", jsz.Config.MaxStorage, need)
	}
}
