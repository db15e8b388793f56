// Package tracing carries one LLM call's trace across the bus: W3C trace
// context (the `traceparent` and `tracestate` headers) in the headers of
// every record that follows from the call — the agent's outcome, its
// classification, the decision, the due retry, a dispatch — so a tracing
// backend shows the call's whole story as one trace.
//
// Spans are recorded only when a TracerProvider is installed globally
// (otel.SetTracerProvider): by the services when OTEL_EXPORTER_OTLP_ENDPOINT
// is set, by an agent's own application, or by a test. Without one
// (Enabled false) nothing is recorded and nothing is allocated; a record
// that arrives with a traceparent passes it on unchanged to what follows
// from it, so a service without tracing does not cut the trace.
//
// Span names follow the OpenTelemetry conventions: messaging spans are
// "<operation> <destination template>" ("process
// failbus.outcome.{provider}.{agent}"), with messaging.system "nats"; the
// LLM call and its attempts are GenAI spans "<operation> <model>" ("chat
// gpt-4o").
//
// What is not guaranteed: a record published with no trace context in its
// context (a held task released after a recovery, a health change) starts
// no trace and joins none.
package tracing

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/failbus/failbus/pkg/events"
)

// W3C trace context header names, as failbus writes them on the bus
// (lower case, as the W3C recommendation spells them; Extract also finds
// them capitalised, "Traceparent").
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// InstrumentationName names failbus's tracer (the instrumentation scope of
// every span it records).
const InstrumentationName = "github.com/failbus/failbus"

// MessagingSystem is the messaging.system attribute of failbus's messaging
// spans.
const MessagingSystem = "nats"

// defaultProvider is the global TracerProvider before anyone installs one:
// while it is still the global, tracing is off.
var defaultProvider = otel.GetTracerProvider()

// propagator writes and reads traceparent and tracestate.
var propagator = propagation.TraceContext{}

// Enabled reports whether spans are recorded: a TracerProvider other than
// OpenTelemetry's default has been installed globally. It costs an atomic
// load.
func Enabled() bool { return otel.GetTracerProvider() != defaultProvider }

// Tracer is failbus's tracer from the global TracerProvider.
func Tracer() trace.Tracer { return otel.GetTracerProvider().Tracer(InstrumentationName) }

// carrier is a nats.Header as a propagation.TextMapCarrier: the names as
// given, found also capitalised as an HTTP client writes them
// ("Traceparent"). Two map lookups at most: this runs for every message.
type carrier nats.Header

func (c carrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	var alt string
	switch key {
	case HeaderTraceparent:
		alt = "Traceparent"
	case HeaderTracestate:
		alt = "Tracestate"
	default:
		return ""
	}
	if v := c[alt]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c carrier) Set(key, value string) { c[key] = []string{value} }

func (c carrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// Inject writes the span context of ctx (a span of this process, or one
// Extract read from a record) into h as traceparent and tracestate. It
// does nothing when ctx carries no valid span context or h is nil.
func Inject(ctx context.Context, h nats.Header) {
	if h == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, carrier(h))
}

// Header is the trace context of ctx as a new header (nil when ctx carries
// none): for a publish whose headers are built elsewhere.
func Header(ctx context.Context) nats.Header {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	h := nats.Header{}
	propagator.Inject(ctx, carrier(h))
	return h
}

// Extract returns ctx carrying the remote span context of h's traceparent
// (and tracestate), the parent of what is done with the record; ctx
// unchanged when h has none or it is malformed.
func Extract(ctx context.Context, h nats.Header) context.Context {
	if carrier(h).Get(HeaderTraceparent) == "" {
		return ctx
	}
	return propagator.Extract(ctx, carrier(h))
}

// Has reports whether h carries a traceparent.
func Has(h nats.Header) bool { return carrier(h).Get(HeaderTraceparent) != "" }

// templates are the destination templates of failbus's subjects, for span
// names: the subject with its variable tokens named. Longer prefixes
// first.
var templates = []struct{ prefix, template string }{
	{events.OutcomePrefix + ".", events.OutcomePrefix + ".{provider}.{agent}"},
	{events.SegmentPrefix + ".", events.SegmentPrefix + ".{agent}"},
	{events.ClassifiedPrefix + ".", events.ClassifiedPrefix + ".{provider}.{class}"},
	{events.HealthPrefix + ".", events.HealthPrefix + ".{provider}"},
	{events.DecisionPrefix + ".", events.DecisionPrefix + ".{agent}"},
	{events.RetryPrefix + ".due.", events.RetryPrefix + ".due.{agent}"},
	{events.RetryPrefix + ".sched.", events.RetryPrefix + ".sched.{agent}.{retry_id}"},
	{events.RetryPrefix + ".ledger.", events.RetryPrefix + ".ledger.{budget}"},
	{events.RetryPrefix + ".started.", events.RetryPrefix + ".started.{agent}"},
	{events.RetryPrefix + ".cancel.", events.RetryPrefix + ".cancel.{agent}"},
	{events.NotifyPrefix + ".", events.NotifyPrefix + ".{severity}"},
	{events.ControlPrefix + ".", events.ControlPrefix + ".{agent}"},
	{events.TaskPrefix + ".", events.TaskPrefix + ".{provider}.{agent}"},
	{events.HeartbeatPrefix + ".", events.HeartbeatPrefix + ".{agent}"},
	{events.CronSpecPrefix + ".", events.CronSpecPrefix + ".{agent}"},
	{events.CronRunPrefix + ".", events.CronRunPrefix + ".{agent}"},
	{events.WritePrefix + ".", events.WritePrefix + ".{agent}"},
	{events.DispatchPrefix + ".", events.DispatchPrefix + ".{agent}"},
	{events.RecoveryPrefix + ".", events.RecoveryPrefix + ".{provider}"},
	{events.DLQPrefix + ".", events.DLQPrefix + ".{service}"},
}

// Template is the destination template of subject, the low-cardinality
// half of a messaging span's name: failbus.outcome.openai.bot is
// failbus.outcome.{provider}.{agent}. A subject outside failbus's families
// keeps its first two tokens and names the rest "*".
func Template(subject string) string {
	for _, t := range templates {
		if strings.HasPrefix(subject, t.prefix) {
			return t.template
		}
	}
	parts := strings.SplitN(subject, ".", 3)
	if len(parts) < 3 {
		return subject
	}
	return parts[0] + "." + parts[1] + ".*"
}
