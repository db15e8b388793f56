package consumer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/prom"
)

// Result label values of failbus_consumer_messages_total.
const (
	// resultAck: outputs published, input acknowledged.
	resultAck = "ack"
	// resultRetry: the handler returned Retry, or the message was handed
	// back during shutdown.
	resultRetry = "retry"
	// resultDeadLetter: the input went to the dead-letter subject.
	resultDeadLetter = "dead_letter"
	// resultError: the handler or an output publish failed; the input is
	// redelivered after the backoff.
	resultError = "error"
)

type metrics struct {
	messages     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	outputs      *prometheus.CounterVec
	redeliveries *prometheus.CounterVec
	inFlight     *prometheus.GaugeVec
	fetchErrors  *prometheus.CounterVec

	deadLettersTruncated *prometheus.CounterVec
	recreated            *prometheus.CounterVec
	keptAlive            *prometheus.CounterVec
	storeFailures        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_consumer_messages_total",
			Help: "Input messages handled, by service and result (ack, retry, dead_letter, error).",
		}, []string{"service", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "failbus_consumer_handle_seconds",
			Help:    "Time from receiving an input to settling it (handler, output publishes, ack).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10),
		}, []string{"service"}),
		outputs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_consumer_outputs_published_total",
			Help: "Outputs stored by JetStream, by service; duplicate=true when the stream already had the Nats-Msg-Id (a redelivery re-published it).",
		}, []string{"service", "duplicate"}),
		redeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_consumer_redeliveries_total",
			Help: "Inputs received with a delivery count above 1.",
		}, []string{"service"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "failbus_consumer_in_flight",
			Help: "Inputs being handled right now.",
		}, []string{"service"}),
		fetchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_consumer_fetch_errors_total",
			Help: "Pull requests that failed (server unreachable, consumer missing).",
		}, []string{"service"}),
		deadLettersTruncated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_consumer_dead_letters_truncated_total",
			Help: "Dead letters that kept only a prefix of their input (it would not fit in one message whole); the input stays in its stream at the recorded sequence.",
		}, []string{"service"}),
		keptAlive: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_consumer_queued_kept_alive_total",
			Help: "Progress signals (+WPI) sent for inputs still waiting in the runner's window for a free worker, so their AckWait does not run out before a handler starts them.",
		}, []string{"service"}),
		recreated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_consumer_recreated_total",
			Help: "Durable consumers the runner found deleted and recreated.",
		}, []string{"service"}),
		storeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "failbus_consumer_store_failures_total",
			Help: "Messages whose writes (outputs, dead letter, the handler's own) JetStream did not store: no acknowledgement in time, no responder, or a stream out of room. /healthz fails from the first until a message's writes are stored again.",
		}, []string{"service"}),
	}
	var err error
	if m.storeFailures, err = prom.Register(reg, m.storeFailures); err != nil {
		return nil, err
	}
	if m.deadLettersTruncated, err = prom.Register(reg, m.deadLettersTruncated); err != nil {
		return nil, err
	}
	if m.recreated, err = prom.Register(reg, m.recreated); err != nil {
		return nil, err
	}
	if m.keptAlive, err = prom.Register(reg, m.keptAlive); err != nil {
		return nil, err
	}
	if m.messages, err = prom.Register(reg, m.messages); err != nil {
		return nil, err
	}
	if m.duration, err = prom.Register(reg, m.duration); err != nil {
		return nil, err
	}
	if m.outputs, err = prom.Register(reg, m.outputs); err != nil {
		return nil, err
	}
	if m.redeliveries, err = prom.Register(reg, m.redeliveries); err != nil {
		return nil, err
	}
	if m.inFlight, err = prom.Register(reg, m.inFlight); err != nil {
		return nil, err
	}
	if m.fetchErrors, err = prom.Register(reg, m.fetchErrors); err != nil {
		return nil, err
	}
	return m, nil
}
