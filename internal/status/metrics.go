package status

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/cli/lag"
)

// lagScrapeTimeout bounds reading the consumers' lag on a scrape.
const lagScrapeTimeout = 5 * time.Second

// LagCollector exports durable consumers' lag as Prometheus gauges, read
// from the server at each scrape (consumer info, and a direct get for the
// oldest unprocessed message's age, as `failbus lag`): what the alert on
// a consumer falling behind watches.
type LagCollector struct {
	js        jetstream.JetStream
	consumers []string

	pending, ackPending, oldest, waiting, errors *prometheus.Desc
}

// NewLagCollector reads the lag of the named durable consumers (none: all
// of them) through js.
func NewLagCollector(js jetstream.JetStream, consumers ...string) *LagCollector {
	labels := []string{"stream", "consumer"}
	return &LagCollector{
		js: js, consumers: consumers,
		pending:    prometheus.NewDesc("failbus_consumer_pending_messages", "Messages matching a durable consumer's filter not yet delivered to it (read from the server at scrape).", labels, nil),
		ackPending: prometheus.NewDesc("failbus_consumer_ack_pending_messages", "Messages delivered to a durable consumer and not yet acknowledged (read from the server at scrape).", labels, nil),
		oldest:     prometheus.NewDesc("failbus_consumer_oldest_unprocessed_age_seconds", "Age (store time) of the oldest message a durable consumer has not processed; 0 when caught up (read from the server at scrape).", labels, nil),
		waiting:    prometheus.NewDesc("failbus_consumer_waiting_pulls", "Pull requests waiting on a durable consumer: 0 means no process is reading it (read from the server at scrape).", labels, nil),
		errors:     prometheus.NewDesc("failbus_consumer_lag_read_errors", "1 when the consumers' lag could not be read at this scrape, else 0.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *LagCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.ackPending, c.oldest, c.waiting, c.errors} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *LagCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), lagScrapeTimeout)
	defer cancel()
	lags, err := lag.Read(ctx, c.js, lag.Options{Consumers: c.consumers}, time.Now())
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.GaugeValue, failed)
	for _, l := range lags {
		if l.Retired {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(l.Pending), l.Stream, l.Durable)
		ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(l.AckPending), l.Stream, l.Durable)
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, float64(l.OldestAgeMS)/1000, l.Stream, l.Durable)
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(l.Waiting), l.Stream, l.Durable)
	}
}
