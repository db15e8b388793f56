package recovery

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/pkg/events"
)

type metrics struct {
	sentTotal     *prometheus.CounterVec
	held          *prometheus.GaugeVec
	down          *prometheus.GaugeVec
	probes        *prometheus.CounterVec
	advanceErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		sentTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_recovery_sent_total",
			Help: "Messages recovery stored, by kind (dispatch, kill, run_cron, check_write, probe, record, notification); duplicate=true when the stream had the Nats-Msg-Id already.",
		}, []string{"kind", "duplicate"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "failbus_recovery_held_tasks",
			Help: "Tasks held in FAILBUS_TASKS for a provider, waiting for its recovery.",
		}, []string{"provider"}),
		down: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "failbus_recovery_provider_down",
			Help: "1 while recovery holds a provider as down (outage, or recovering from one).",
		}, []string{"provider"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_recovery_http_probes_total",
			Help: "Built-in HTTP probes run, by provider and result (ok, failed).",
		}, []string{"provider", "result"}),
		advanceErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "failbus_recovery_step_errors_total",
			Help: "Checklist, release or probe steps that failed (store or publish errors) and were retried.",
		}),
	}
	for _, c := range []prometheus.Collector{m.sentTotal, m.held, m.down, m.probes, m.advanceErrors} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, fmt.Errorf("recovery metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) sent(msg events.Message, duplicate bool) {
	kind := msg.SchemaName()
	switch v := msg.(type) {
	case *events.Control:
		kind = v.Action
	case *events.Recovery:
		kind = "record"
	}
	m.sentTotal.WithLabelValues(kind, fmt.Sprint(duplicate)).Inc()
}

func (m *metrics) httpProbe(provider string, ok bool) {
	r := "failed"
	if ok {
		r = "ok"
	}
	m.probes.WithLabelValues(provider, r).Inc()
}
