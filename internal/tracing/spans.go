package tracing

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Messaging operation names (messaging.operation.name), the first word of
// a messaging span's name.
const (
	OperationSend    = "send"
	OperationProcess = "process"
)

// Attribute keys failbus adds to the conventions' own.
const (
	// AttrStream and AttrSeq say where a processed record is stored.
	AttrStream = attribute.Key("failbus.stream")
	AttrSeq    = attribute.Key("failbus.seq")
	// AttrDelivered counts deliveries of a processed record (1: first).
	AttrDelivered = attribute.Key("failbus.delivered")
	// AttrResult is how handling a record ended: ack, retry, dead_letter,
	// error.
	AttrResult = attribute.Key("failbus.result")
)

// StartProcess starts the span of handling one record read from subject
// (kind consumer, "process <template>"), the child of the trace context
// the record carries in h (or a new trace's root when it carries none).
// group is the consumer that read it (messaging.consumer.group.name).
func StartProcess(ctx context.Context, subject, group string, h nats.Header, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx = Extract(ctx, h)
	tmpl := Template(subject)
	base := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(MessagingSystem),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName(OperationProcess),
		semconv.MessagingDestinationName(subject),
		semconv.MessagingDestinationTemplate(tmpl),
	}
	if group != "" {
		base = append(base, semconv.MessagingConsumerGroupName(group))
	}
	if id := h.Get(nats.MsgIdHdr); id != "" {
		base = append(base, semconv.MessagingMessageID(id))
	}
	return Tracer().Start(ctx, OperationProcess+" "+tmpl,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(append(base, attrs...)...))
}

// StartSend starts the span of publishing one record to subject (kind
// producer, "send <template>"), the child of ctx's span; Inject the
// returned context into the record's headers.
func StartSend(ctx context.Context, subject, msgID string) (context.Context, trace.Span) {
	tmpl := Template(subject)
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemKey.String(MessagingSystem),
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName(OperationSend),
		semconv.MessagingDestinationName(subject),
		semconv.MessagingDestinationTemplate(tmpl),
	}
	if msgID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(msgID))
	}
	return Tracer().Start(ctx, OperationSend+" "+tmpl,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
}

// End ends span; a non-nil err marks it failed, with errType as its
// error.type ("" for "_OTHER").
func End(span trace.Span, err error, errType string) {
	if err != nil {
		if errType == "" {
			errType = semconv.ErrorTypeOther.Value.AsString()
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(errType))
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
