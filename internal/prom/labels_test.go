package prom_test

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/prom"
)

// TestLabelCapEvictsTheLeastRecentlyUsed: 5,000 provider names leave at
// most Max series on every tracked vector, the names in use keep theirs,
// and every eviction is counted.
func TestLabelCapEvictsTheLeastRecentlyUsed(t *testing.T) {
	reg := prometheus.NewRegistry()
	outage := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "test_outage", Help: "h"}, []string{"provider"})
	probes := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_probes_total", Help: "h"}, []string{"provider", "result"})
	reg.MustRegister(outage, probes)
	c, err := prom.NewLabelCap(reg, "provider", 100)
	if err != nil {
		t.Fatal(err)
	}
	c.Track(outage.MetricVec).TrackPartial(probes.MetricVec)
	for i := range 5_000 {
		p := c.Use(fmt.Sprintf("p-%05d", i))
		outage.WithLabelValues(p).Set(1)
		probes.WithLabelValues(p, "ok").Inc()
		probes.WithLabelValues(p, "failed").Inc()
		// One provider stays busy throughout: it is never the oldest.
		outage.WithLabelValues(c.Use("busy")).Set(0)
	}
	if n := testutilCount(t, reg, "test_outage"); n != 100 {
		t.Errorf("%d outage series, want 100", n)
	}
	if n := testutilCount(t, reg, "test_probes_total"); n > 200 {
		t.Errorf("%d probe series, want at most 200", n)
	}
	if got := counterValue(t, reg, "failbus_metric_label_values_evicted_total", map[string]string{"label": "provider"}); got != 5_000+1-100 {
		t.Errorf("evicted %v, want %d", got, 5_000+1-100)
	}
	found := false
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				found = found || lp.GetValue() == "busy"
			}
		}
	}
	if !found {
		t.Error("the provider in use lost its series")
	}
	if _, err := prom.NewLabelCap(reg, "provider", -1); err == nil {
		t.Error("a negative cap was accepted")
	}
}

func testutilCount(t *testing.T, g prometheus.Gatherer, name string) int {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// counterValue is the value of the counter name with labels in g.
func counterValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
