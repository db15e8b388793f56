package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/testcluster"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// One server with sync_interval always (failbus dev --sync-always), its
// process SIGKILLed at 10 points while agents publish outcomes and wait for
// each acknowledgement: every acknowledged outcome is in the stream after
// the restarts, and an outcome re-published after a failed publish (same
// id) is stored once, never twice.
//
// What this does not show: a SIGKILL of the server process leaves what it
// wrote in the operating system's page cache, so it survives with or
// without fsync. Losing power (or the kernel) is what the default 2-minute
// fsync interval risks and sync always closes; simulating that needs a
// fault-injecting file system or a VM (Jepsen used LazyFS), not a process.
func TestSingleServerSyncAlwaysSIGKILLedTenTimes(t *testing.T) {
	t.Parallel()
	const kills = 10
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	c := testcluster.Start(t, testcluster.Options{Standalone: true, SyncAlways: true})
	node := c.Nodes()[0]
	nc, err := nats.Connect(node.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := topology.Apply(ctx, js, topology.Options{}); err != nil {
		t.Fatal(err)
	}

	var (
		mu         sync.Mutex
		acked      = map[string]bool{}
		republish  atomic.Int64 // publishes made again after one failed
		duplicates atomic.Int64 // of those, ones the stream already held
		next       atomic.Int64
		stop       = make(chan struct{})
		wg         sync.WaitGroup
	)
	for w := range 4 {
		name := fmt.Sprintf("agent-%d", w)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := next.Add(1)
				o := &events.Outcome{ID: fmt.Sprintf("d-%06d", i), At: events.At(time.Now()), Agent: name, Provider: "openai", Status: 429}
				data, hdr, err := events.Encode(o)
				if err != nil {
					t.Error(err)
					return
				}
				hdr.Set(events.HeaderMsgID, o.ID)
				msg := &nats.Msg{Subject: events.OutcomeSubject(o.Provider, name), Header: hdr, Data: data}
				for again := false; ; again = true {
					pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
					ack, err := js.PublishMsg(pctx, msg)
					pcancel()
					if err == nil {
						if again {
							republish.Add(1)
							if ack.Duplicate {
								duplicates.Add(1)
							}
						}
						break
					}
					if ctx.Err() != nil {
						t.Errorf("%s never acknowledged: %v", o.ID, err)
						return
					}
				}
				mu.Lock()
				acked[o.ID] = true
				mu.Unlock()
			}
		})
	}
	ackedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	rng := rand.New(rand.NewPCG(10, 10))
	for k := range kills {
		target := ackedCount() + 100 + rng.IntN(400)
		for ackedCount() < target {
			select {
			case <-ctx.Done():
				t.Fatalf("kill %d: publishing stalled at %d acknowledged", k+1, ackedCount())
			case <-time.After(5 * time.Millisecond): // poll interval, bounded by ctx
			}
		}
		node.Kill()
		node.Restart()
		if err := c.WaitHealthy(ctx); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()

	// Every acknowledged outcome is stored, once.
	st, err := js.Stream(ctx, topology.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	oc, err := js.OrderedConsumer(ctx, topology.StreamOutcomes, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]int{}
	total := st.CachedInfo().State.Msgs
	for uint64(len(stored)) < total {
		m, err := oc.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("read back after %d of %d: %v", len(stored), total, err)
		}
		stored[m.Headers().Get(events.HeaderMsgID)]++
	}
	lost, doubled := 0, 0
	for id := range acked {
		if stored[id] == 0 {
			lost++
			if lost <= 5 {
				t.Errorf("%s was acknowledged and is not in the stream", id)
			}
		}
	}
	for id, n := range stored {
		if n > 1 {
			doubled++
			t.Errorf("%s stored %d times", id, n)
		}
	}
	if republish.Load() == 0 {
		t.Errorf("no publish failed across %d kills: the kills did not land while agents published", kills)
	}
	t.Logf("sync always, %d SIGKILLs: %d outcomes acknowledged, %d stored, %d lost, %d doubled; %d re-published after a failed publish, %d of them already stored (deduplicated by id)",
		kills, len(acked), len(stored), lost, doubled, republish.Load(), duplicates.Load())
}
