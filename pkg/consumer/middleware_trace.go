package consumer

import (
	"context"
	"errors"

	"github.com/failbus/failbus/internal/tracing"
)

// traceContext is the middleware every runner puts just inside Recover: it
// continues the W3C trace context an input carries (internal/tracing) into the
// handler's context and onto every output, so one LLM call's records form
// one trace.
//
// With tracing on (tracing.Enabled) it records a consumer span "process
// <subject template>" per handler call, the child of the input's trace
// context (a new trace's root when it has none), and the outputs carry
// that span. With tracing off, an input's traceparent and tracestate pass
// to its outputs unchanged and the handler's context carries them (for
// what a handler publishes outside Outputs: tracing.Inject); an input
// without them costs a header lookup.
func traceContext(group string) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, m *Msg, out *Outputs) error {
			if !tracing.Enabled() {
				if !tracing.Has(m.Header) {
					return next(ctx, m, out)
				}
				ctx = tracing.Extract(ctx, m.Header)
				out.trace = tracing.Header(ctx)
				return next(ctx, m, out)
			}
			ctx, span := tracing.StartProcess(ctx, m.Subject, group, m.Header,
				tracing.AttrStream.String(m.Stream), tracing.AttrSeq.Int64(int64(m.Seq)), tracing.AttrDelivered.Int(m.Delivered))
			out.trace = tracing.Header(ctx)
			defer func() {
				if p := recover(); p != nil {
					// Recover, outside, turns it into a dead letter.
					span.SetAttributes(tracing.AttrResult.String(resultDeadLetter))
					tracing.End(span, errors.New("panic"), "panic")
					panic(p)
				}
			}()
			err := next(ctx, m, out)
			var (
				re *retryError
				dl *deadLetterError
			)
			switch {
			case err == nil:
				span.SetAttributes(tracing.AttrResult.String(resultAck))
				tracing.End(span, nil, "")
			case errors.As(err, &re):
				// Asked for later: not a failure of this handling.
				span.SetAttributes(tracing.AttrResult.String(resultRetry))
				tracing.End(span, nil, "")
			case errors.As(err, &dl):
				span.SetAttributes(tracing.AttrResult.String(resultDeadLetter))
				tracing.End(span, err, resultDeadLetter)
			default:
				span.SetAttributes(tracing.AttrResult.String(resultError))
				tracing.End(span, err, "")
			}
			return err
		}
	}
}
