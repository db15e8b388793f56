package recoverer

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/prom"
	"github.com/failbus/failbus/pkg/events"
)

type metrics struct {
	sentTotal     *prometheus.CounterVec
	held          *prometheus.GaugeVec
	down          *prometheus.GaugeVec
	step          *prometheus.GaugeVec
	runs          *prometheus.CounterVec
	probes        *prometheus.CounterVec
	advanceErrors prometheus.Counter
	usageErrors   prometheus.Counter
	quarantined   prometheus.Counter
	refused       *prometheus.CounterVec
	// providers caps the provider label (agents name providers): at most
	// prom.DefaultMaxLabelValues have series, least recently used
	// evicted.
	providers *prom.LabelCap
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
		step: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "failbus_recovery_checklist_step",
			Help: "The checklist step a provider's recovery is at, 1 (confirm) to 7 (release); 0 when none runs.",
		}, []string{"provider"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_recovery_runs_total",
			Help: "Recovery checklists finished (their done record stored), by provider.",
		}, []string{"provider"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_recovery_http_probes_total",
			Help: "Built-in HTTP probes run, by provider and result (ok, failed).",
		}, []string{"provider", "result"}),
		advanceErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "failbus_recovery_step_errors_total",
			Help: "Checklist, release or probe steps that failed (store or publish errors) and were retried.",
		}),
		quarantined: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "failbus_recovery_quarantined_total",
			Help: "Provider records in FAILBUS_RECOVERY that made the service panic while it watched or advanced them: each moved to failbus.dlq.recovery with the reason and removed, so the service goes on.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_limits_refused_total",
			Help: "Agents' records refused because the agent (or all agents) reached a policy limit, by service and limit; each is a dead letter naming the limit and the agent.",
		}, []string{"service", "limit"}),
		usageErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "failbus_recovery_probe_target_errors_total",
			Help: "Probes whose targets could not be read from FAILBUS_OUTCOMES and FAILBUS_DECISIONS (the probe went to an agent that reported itself, or to none).",
		}),
	}
	var err error
	register := func(c prometheus.Collector) prometheus.Collector {
		if err != nil {
			return c
		}
		if rerr := reg.Register(c); rerr != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(rerr, &are) {
				return are.ExistingCollector // another recovery service in this process (tests, two replicas)
			}
			err = fmt.Errorf("recovery metrics: %w", rerr)
		}
		return c
	}
	m.sentTotal = register(m.sentTotal).(*prometheus.CounterVec)
	m.held = register(m.held).(*prometheus.GaugeVec)
	m.down = register(m.down).(*prometheus.GaugeVec)
	m.step = register(m.step).(*prometheus.GaugeVec)
	m.runs = register(m.runs).(*prometheus.CounterVec)
	m.probes = register(m.probes).(*prometheus.CounterVec)
	m.advanceErrors = register(m.advanceErrors).(prometheus.Counter)
	m.usageErrors = register(m.usageErrors).(prometheus.Counter)
	m.quarantined = register(m.quarantined).(prometheus.Counter)
	m.refused = register(m.refused).(*prometheus.CounterVec)
	if err != nil {
		return m, err
	}
	if m.providers, err = prom.NewLabelCap(reg, "provider", 0); err != nil {
		return m, fmt.Errorf("recovery metrics: %w", err)
	}
	m.providers.Track(m.held.MetricVec, m.down.MetricVec, m.step.MetricVec, m.runs.MetricVec).TrackPartial(m.probes.MetricVec)
	return m, nil
}

// kindOf names what a sent message is, for metrics and logs.
func kindOf(msg events.Message) string {
	switch v := msg.(type) {
	case *events.Control:
		return v.Action
	case *events.Recovery:
		return "record"
	}
	return msg.SchemaName()
}

func (m *metrics) httpProbe(provider string, ok bool) {
	r := "failed"
	if ok {
		r = "ok"
	}
	m.probes.WithLabelValues(m.providers.Use(provider), r).Inc()
}
