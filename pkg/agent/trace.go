package agent

import (
	"context"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/failbus/failbus/internal/tracing"
	"github.com/failbus/failbus/pkg/events"
)

// One Call is one trace (internal/tracing): a GenAI span "chat <model>" for the
// logical call, a child "chat <model>" span (kind client) per attempt, a
// "send" span for each outcome the call reports, which carries the trace
// to the bus in its headers; the services' "process" spans follow from
// it, and the decision and due retry the call receives come back in it.
// Nothing here records anything unless tracing.Enabled.

// Attribute keys of the call's spans beside the GenAI conventions' own.
const (
	attrAgent     = attribute.Key("failbus.agent")
	attrAttempt   = attribute.Key("failbus.attempt")
	attrAttempts  = attribute.Key("failbus.attempts")
	attrOutcomeID = attribute.Key("failbus.outcome_id")
	attrProbe     = attribute.Key("failbus.probe")
	attrAction    = attribute.Key("failbus.action")
	attrClass     = attribute.Key("failbus.class")
	attrRule      = attribute.Key("failbus.rule")
	attrRetryID   = attribute.Key("failbus.retry_id")
	attrDelayMS   = attribute.Key("failbus.delay_ms")
)

// noSpan is the span of a context without one: records nothing.
var noSpan = trace.SpanFromContext(context.Background())

// genAIOperation is the gen_ai.operation.name of a Call: a chat call.
const genAIOperation = "chat"

// spanName is a GenAI span's name: "chat <model>", or "chat" without one.
func spanName(model string) string {
	if model == "" {
		return genAIOperation
	}
	return genAIOperation + " " + model
}

// startCall starts the span of one logical call; the returned span is a
// no-op when tracing is off.
func (a *Agent) startCall(ctx context.Context, req *Request) (context.Context, trace.Span) {
	if !tracing.Enabled() {
		return ctx, noSpan
	}
	attrs := []attribute.KeyValue{
		semconv.GenAIOperationNameKey.String(genAIOperation),
		semconv.GenAIProviderNameKey.String(req.Provider),
		attrAgent.String(a.name),
	}
	if req.Model != "" {
		attrs = append(attrs, semconv.GenAIRequestModel(req.Model))
	}
	if req.Session != "" {
		attrs = append(attrs, semconv.GenAIConversationID(events.SegmentKey(req.Session, req.Segment)))
	}
	return tracing.Tracer().Start(ctx, spanName(req.Model), trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
}

// endCall ends the call's span after attempts attempts.
func endCall(span trace.Span, attempts int, err error) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrAttempts.Int(attempts))
	tracing.End(span, err, errorType(err))
}

// decided notes a decision on the call's span, as an event.
func decided(span trace.Span, d *events.Decision) {
	if !span.IsRecording() || d == nil {
		return
	}
	attrs := []attribute.KeyValue{attrOutcomeID.String(d.OutcomeID), attrAction.String(d.Action), attrClass.String(d.Class), attrRule.String(d.Rule)}
	if d.RetryID != "" {
		attrs = append(attrs, attrRetryID.String(d.RetryID), attrDelayMS.Int64(d.DelayMS))
	}
	span.AddEvent("failbus.decision", trace.WithAttributes(attrs...))
}

// startAttempt starts the span of one attempt (kind client), the child of
// the call's span.
func startAttempt(ctx context.Context, at *Attempt) (context.Context, trace.Span) {
	if !tracing.Enabled() {
		return ctx, noSpan
	}
	attrs := []attribute.KeyValue{
		semconv.GenAIOperationNameKey.String(genAIOperation),
		semconv.GenAIProviderNameKey.String(at.Provider),
		attrAttempt.Int(at.N),
	}
	if at.Model != "" {
		attrs = append(attrs, semconv.GenAIRequestModel(at.Model))
	}
	if at.Probe {
		attrs = append(attrs, attrProbe.Bool(true))
	}
	return tracing.Tracer().Start(ctx, spanName(at.Model), trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// endAttempt ends an attempt's span with what its outcome says: a failure
// has error.type its HTTP status, or "transport" when no response came.
func endAttempt(span trace.Span, o *events.Outcome) {
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrOutcomeID.String(o.ID))
	if o.RequestTokens > 0 {
		span.SetAttributes(semconv.GenAIUsageInputTokens(o.RequestTokens))
	}
	if o.OK {
		tracing.End(span, nil, "")
		return
	}
	why, kind := o.TransportError, "transport"
	if o.Status != 0 {
		why, kind = "status "+strconv.Itoa(o.Status), strconv.Itoa(o.Status)
	}
	if o.StopReason != "" {
		why, kind = "stop reason "+o.StopReason, o.StopReason
	}
	tracing.End(span, errString(why), kind)
}

// errorType is a Call's error.type: the decision's action for a
// DecisionError, else "_OTHER".
func errorType(err error) string {
	if de, ok := err.(*DecisionError); ok {
		return de.Action()
	}
	return ""
}

type errString string

func (e errString) Error() string { return string(e) }

// sendSpan starts the span of publishing one record (a no-op when
// tracing is off); the caller injects ctx into the record's headers.
func sendSpan(ctx context.Context, subject, msgID string) (context.Context, trace.Span) {
	if !tracing.Enabled() {
		return ctx, noSpan
	}
	return tracing.StartSend(ctx, subject, msgID)
}

// received records that the agent took a record (a decision, a due
// retry) from the bus: a "process" span in the record's trace.
func (a *Agent) received(m jetstream.Msg) {
	if !tracing.Enabled() || !tracing.Has(m.Headers()) {
		return
	}
	_, span := tracing.StartProcess(context.Background(), m.Subject(), a.name, m.Headers())
	span.End()
}
