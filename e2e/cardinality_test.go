package e2e

// Acceptance of the cardinality rule: agents name providers, and
// 20,000 provider names must not become 20,000 metric series or state that
// is never released. Every service of `failbus dev` runs; the series of
// every provider-labelled metric stay within the configured cap, the
// evictions are counted, and the heap after the run stays within a bound.

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/internal/service/classifier"
	"github.com/failbus/failbus/internal/service/scheduler"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// cardinalityHeapBound is how much the live heap (after a GC) may grow
// while the classifications of 20,000 providers go through every service
// (the same traffic from one provider grows it by about as much: the
// stream's dedupe window and the scheduler's memory of recent outcome ids
// grow with messages, not names; the fault scope is in FAILBUS_SCOPE).
const cardinalityHeapBound = 64 << 20

func TestTwentyThousandProviderNames(t *testing.T) {
	const providers = 20_000
	b, err := devbus.Start(devbus.Options{
		Server: embedded.Options{Dir: t.TempDir()},
		Log:    zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	nc, err := b.Srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	start := time.Now()
	at := time.Now().UTC()
	// Classifications as the classifier writes them: the services that
	// keep per-provider state (fault scope, health, recovery) read those;
	// the classifier's own metrics are by class. Skipping it halves what
	// the test costs under -race.
	for i := range providers {
		id := fmt.Sprintf("card-%05d", i)
		c := &events.Classification{OutcomeID: id, At: events.At(at), Agent: "bot", Provider: fmt.Sprintf("prov-%05d", i),
			Model: "m", Profile: "p", Class: events.ClassOK, Rule: "ok"}
		data, hdr, err := events.Encode(c)
		if err != nil {
			t.Fatal(err)
		}
		hdr.Set(nats.MsgIdHdr, msgid.Output(classifier.Name, id, "0"))
		if err := nc.PublishMsg(&nats.Msg{Subject: events.ClassifiedSubject(c.Provider, c.Class), Header: hdr, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitAllCaughtUp(ctx, t, b.JS)
	elapsed := time.Since(start)
	after := heap()

	series := map[string]int{}
	mfs, err := b.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "provider" {
					series[mf.GetName()]++
				}
			}
		}
	}
	growth := int64(after) - int64(before)
	t.Logf("%d providers in %v: provider series %v; live heap %d MiB -> %d MiB (%+d MiB, bound %d MiB)",
		providers, elapsed.Round(time.Millisecond), series, before>>20, after>>20, growth>>20, cardinalityHeapBound>>20)
	if len(series) == 0 {
		t.Fatal("no provider-labelled series at all: the test measures nothing")
	}
	for name, n := range series {
		if n > scheduler.DefaultMaxProviders {
			t.Errorf("%s has %d provider series, want at most %d", name, n, scheduler.DefaultMaxProviders)
		}
	}
	evicted := counterValue(t, b.Registry, "failbus_metric_label_values_evicted_total", map[string]string{"label": "provider"})
	if want := float64(providers - scheduler.DefaultMaxProviders); evicted < want {
		t.Errorf("%v series evicted, want at least %v", evicted, want)
	}
	// The fault scope is not in the scheduler's memory but in FAILBUS_SCOPE
	// (the fault scope's bucket): one small record per provider, expiring with the bucket's
	// TTL, far from the bucket's max_bytes.
	kv, err := b.JS.KeyValue(ctx, topology.BucketScope)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Values() < providers || st.TTL() <= 0 || st.Bytes() > uint64(topology.DefaultBucketMaxBytes/4) {
		t.Errorf("FAILBUS_SCOPE holds %d records in %d bytes with TTL %v; want one per provider, expiring, within a quarter of its %d bytes",
			st.Values(), st.Bytes(), st.TTL(), topology.DefaultBucketMaxBytes)
	}
	t.Logf("FAILBUS_SCOPE: %d provider records, %d KiB", st.Values(), st.Bytes()>>10)
	if growth > cardinalityHeapBound {
		t.Errorf("live heap grew by %d MiB, bound %d MiB", growth>>20, cardinalityHeapBound>>20)
	}
}
