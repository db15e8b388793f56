package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/requeue"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/redact"
)

// handle runs everything before settlement for one delivery: the spare
// delivery check, a requeued copy's skip, the limits pre-scan, decoding and
// the handler. It returns the outputs collected and the handler's verdict.
func (r *Runner) handle(hctx context.Context, m *Msg) (*Outputs, error) {
	svc := r.cfg.Service
	if m.Delivered > 1 {
		r.m.redeliveries.WithLabelValues(svc).Inc()
	}
	m.Last = m.Delivered >= r.maxDeliver
	out := &Outputs{service: svc, inputID: m.ID()}

	var herr error
	if m.Delivered > r.maxDeliver {
		// The spare delivery: the handler already had its last delivery,
		// and that one was never settled (the process died, or the handler
		// outlived AckWait). Running the handler again could die the same
		// way and the server would then drop the message without a dead
		// letter, so dead-letter it without running the handler.
		herr = DeadLetter(fmt.Sprintf("delivery %d exceeds the limit of %d: delivery %d was never settled (the process handling it died, or the handler outlived AckWait)",
			m.Delivered, r.maxDeliver, m.Delivered-1))
	}
	// A dead letter requeued for another service (failbus dlq requeue):
	// this consumer processed the original already, so it only
	// acknowledges the copy.
	skip := herr == nil && requeue.Elsewhere(m.Header, svc)
	if herr == nil && !skip && r.checksLimits(m) {
		// Before any decoder sees it: a payload beyond the limits is
		// rejected without recursion or allocation (events.CheckMsgpack).
		if lerr := events.CheckMsgpack(m.Data, r.cfg.Limits); lerr != nil {
			herr = DeadLetter("input limits: " + lerr.Error())
		}
	}
	// A Key that decoded the input (ValueAs) left its value: it passed the
	// limits just checked, so it is not decoded again.
	if herr == nil && r.cfg.Decode && !skip && m.Value == nil {
		v, derr := events.DecodeLimits(m.Subject, m.Header, m.Data, r.cfg.Limits)
		if derr != nil {
			herr = DeadLetter("decode: " + derr.Error())
		} else {
			m.Value = v
		}
	}
	if herr == nil && !skip {
		herr = r.handler(hctx, m, out)
	}
	return out, herr
}

// settle decides and performs the fate of a message whose handler did not
// succeed with valid outputs (those are published by the pipeline); it
// returns the metrics result and the reason logged.
func (r *Runner) settle(ctx, hctx context.Context, m *Msg, out *Outputs, herr error) (result, reason string) {
	var (
		dl *deadLetterError
		re *retryError
	)
	last := m.Delivered >= r.maxDeliver
	switch {
	case herr == nil && out.err != nil:
		return r.deadLetter(ctx, m, "invalid output: "+out.err.Error())
	case herr == nil:
		return r.ack(m)
	case errors.As(herr, &dl):
		return r.deadLetter(ctx, m, dl.Reason)
	case errors.As(herr, &re):
		if last {
			return r.deadLetter(ctx, m, fmt.Sprintf("gave up after %d deliveries: %s", m.Delivered, re.Reason))
		}
		return r.nak(m, re.After, resultRetry, re.Reason)
	case hctx.Err() != nil && errors.Is(herr, hctx.Err()):
		// Cut off by the end of a drain: not the message's fault.
		return r.nak(m, 0, resultRetry, "shutdown: "+herr.Error())
	default:
		r.stored(herr) // the handler's own writes, if that is why it failed
		return r.fail(ctx, m, herr, last)
	}
}

// fail handles a failed delivery: backoff, or a dead letter on the last one.
func (r *Runner) fail(ctx context.Context, m *Msg, err error, last bool) (string, string) {
	if last {
		return r.deadLetter(ctx, m, fmt.Sprintf("failed %d deliveries, last error: %v", m.Delivered, err))
	}
	return r.nak(m, r.cfg.backoff(m.Delivered), resultError, err.Error())
}

func (r *Runner) nak(m *Msg, delay time.Duration, result, reason string) (string, string) {
	if err := m.raw.NakWithDelay(delay); err != nil {
		return resultError, reason + "; nak failed (redelivered after AckWait): " + err.Error()
	}
	return result, reason
}

// logResult writes one line per settled message: acks at debug level,
// retries at info, failures and dead letters at warn. It logs identities
// and reasons, never bodies, and what it logs of the input (id, subject,
// a reason quoting a field) is masked by redact.String and bounded.
func (r *Runner) logResult(m *Msg, result, reason string, herr error, elapsed time.Duration) {
	var ev *zerolog.Event
	switch result {
	case resultAck:
		ev = r.log.Debug()
	case resultRetry:
		ev = r.log.Info()
	default:
		ev = r.log.Warn()
	}
	if !ev.Enabled() {
		return // acks at info level: nothing to build (two allocations a message)
	}
	ev = ev.Str("result", result).Str("id", logText(m.ID())).Str("subject", logText(m.Subject)).
		Str("stream", m.Stream).Uint64("seq", m.Seq).Int("delivered", m.Delivered).
		Float64("took_ms", float64(elapsed.Microseconds())/1000)
	if reason != "" {
		ev = ev.Str("reason", logText(reason))
	}
	var dl *deadLetterError
	if errors.As(herr, &dl) && dl.Stack != "" {
		ev = ev.Str("stack", dl.Stack)
	}
	ev.Msg("message " + result)
}

// checksLimits reports whether m is pre-scanned against Config.Limits: a
// msgpack payload (its Content-Type says so) or, without a Content-Type, a
// payload on a failbus subject that starts like a msgpack map (agents may
// publish a bare map). Anything else is left to the decoder, which says
// what it is not.
func (r *Runner) checksLimits(m *Msg) bool {
	if ct := m.Header.Get(events.HeaderContentType); ct != "" {
		return strings.HasPrefix(ct, events.ContentTypeMsgpack)
	}
	if len(m.Data) == 0 || !strings.HasPrefix(m.Subject, events.Prefix+".") {
		return false
	}
	c := m.Data[0]
	return c >= 0x80 && c <= 0x8f || c == 0xde || c == 0xdf
}

// logText is input as a log line or a dead letter's reason may show it:
// credentials masked (redact.String), at most MaxReasonBytes.
func logText(s string) string { return boundText(redact.String(s), MaxReasonBytes) }
