package prom

import (
	"container/list"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxLabelValues is how many values of an input-controlled label
// (a provider, model or profile name) keep a series of their own by
// default: 1000. Agents name providers; 20,000 names must not become
// 20,000 series on /metrics and in memory.
const DefaultMaxLabelValues = 1000

// LabelCap bounds the distinct values of one label that an input
// controls, across the metric vectors that carry it: at most Max values
// have series at a time; when a new value comes past that, the least
// recently used value's series are deleted from every vector (evicted) and
// failbus_metric_label_values_evicted_total{label} counts it. A value seen
// again later starts a new series. It is safe for concurrent use.
//
// What is not kept: the evicted series' values (a counter of an evicted
// provider starts again from 0; Prometheus' rate() handles the reset).
type LabelCap struct {
	label   string
	max     int
	evicted prometheus.Counter

	mu      sync.Mutex
	vecs    []*prometheus.MetricVec  // the label is their only one
	partial []*prometheus.MetricVec  // the label is one of several
	order   *list.List               // front: most recently used
	pos     map[string]*list.Element // value -> its element
}

// NewLabelCap caps label at max values (0 selects DefaultMaxLabelValues)
// and registers its eviction counter with reg. Several caps of one label
// (services sharing a registry in failbus dev) share the counter.
func NewLabelCap(reg prometheus.Registerer, label string, max int) (*LabelCap, error) {
	if label == "" {
		return nil, errors.New("invalid config: LabelCap needs a label name")
	}
	switch {
	case max < 0:
		return nil, fmt.Errorf("invalid config: LabelCap %s: max %d must be positive (0 selects %d)", label, max, DefaultMaxLabelValues)
	case max == 0:
		max = DefaultMaxLabelValues
	}
	vec, err := Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "failbus_metric_label_values_evicted_total",
		Help: "Values of an input-controlled label (provider, model, profile) whose series were deleted to keep the label within its cap, by label.",
	}, []string{"label"}))
	if err != nil {
		return nil, err
	}
	return &LabelCap{label: label, max: max, evicted: vec.WithLabelValues(label), order: list.New(), pos: map[string]*list.Element{}}, nil
}

// Track adds vectors whose only label is the capped one (a *GaugeVec's or
// *CounterVec's MetricVec), so an eviction deletes their series.
func (c *LabelCap) Track(vecs ...*prometheus.MetricVec) *LabelCap {
	c.mu.Lock()
	c.vecs = append(c.vecs, vecs...)
	c.mu.Unlock()
	return c
}

// TrackPartial adds vectors that carry the capped label among others; an
// eviction deletes every series with the evicted value (a scan of the
// vector, so keep their other labels few).
func (c *LabelCap) TrackPartial(vecs ...*prometheus.MetricVec) *LabelCap {
	c.mu.Lock()
	c.partial = append(c.partial, vecs...)
	c.mu.Unlock()
	return c
}

// Use records that value is about to be written as the label and makes
// room for it; it returns value. Call it before each WithLabelValues that
// carries the label. (A write racing with the eviction of its own value
// can leave one series beyond Max until that value is evicted again.)
// A value that is not valid UTF-8, which Prometheus refuses by panicking,
// is returned with each invalid byte replaced by U+FFFD: the gate on
// agents' records refuses such names, and a label must never be the way
// one that got past it into stored state crashes a service.
func (c *LabelCap) Use(value string) string {
	if !utf8.ValidString(value) {
		value = strings.ToValidUTF8(value, "\uFFFD")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.pos[value]; ok {
		c.order.MoveToFront(e)
		return value
	}
	for c.order.Len() >= c.max {
		oldest := c.order.Back()
		v := c.order.Remove(oldest).(string)
		delete(c.pos, v)
		for _, vec := range c.vecs {
			vec.DeleteLabelValues(v)
		}
		for _, vec := range c.partial {
			vec.DeletePartialMatch(prometheus.Labels{c.label: v})
		}
		c.evicted.Inc()
	}
	c.pos[value] = c.order.PushFront(value)
	return value
}

// Len is the number of values that have series now.
func (c *LabelCap) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
