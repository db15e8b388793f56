package consumer

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/pkg/events"
)

const w3cExample = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// With tracing off (no TracerProvider installed in this test binary), an
// input's trace context passes to every output unchanged, and an input
// without one gives outputs without one.
func TestTraceContextPassesToOutputsWhenOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   nats.Header
		want string
	}{
		{"with a traceparent", nats.Header{"traceparent": {w3cExample}, "tracestate": {"rojo=1"}}, w3cExample},
		{"without", nats.Header{"Nats-Msg-Id": {"o-1"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Msg{Subject: events.OutcomeSubject("openai", "bot"), Header: tc.in}
			out := &Outputs{service: "svc", inputID: "o-1"}
			h := traceContext("svc")(func(ctx context.Context, m *Msg, out *Outputs) error {
				out.Publish(events.DecisionSubject("bot"), &events.Decision{OutcomeID: "o-1", Agent: "bot", Action: events.ActionGiveUp}, "d")
				return nil
			})
			if err := h(context.Background(), m, out); err != nil {
				t.Fatal(err)
			}
			if out.err != nil || len(out.outs) != 1 {
				t.Fatalf("outputs %v, %v", out.outs, out.err)
			}
			if got := out.outs[0].header.Get("traceparent"); got != tc.want {
				t.Errorf("output traceparent %q, want %q", got, tc.want)
			}
			if tc.want != "" && out.outs[0].header.Get("tracestate") != "rojo=1" {
				t.Errorf("output tracestate %q", out.outs[0].header.Get("tracestate"))
			}
		})
	}
}

// Off, an input without trace context costs the middleware no
// allocation.
func TestTraceContextOffAllocatesNothing(t *testing.T) {
	m := &Msg{Subject: "failbus.outcome.openai.bot", Header: nats.Header{"Nats-Msg-Id": {"o-1"}}}
	out := &Outputs{}
	h := traceContext("svc")(func(context.Context, *Msg, *Outputs) error { return nil })
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { _ = h(ctx, m, out) }); n != 0 {
		t.Errorf("%v allocations per message, want 0", n)
	}
}

// BenchmarkTraceContextOff is the middleware's cost per message with
// tracing off, against the bare handler.
func BenchmarkTraceContextOff(b *testing.B) {
	m := &Msg{Subject: "failbus.outcome.openai.bot", Header: nats.Header{"Nats-Msg-Id": {"o-1"}, "Content-Type": {"application/msgpack"}}}
	out := &Outputs{}
	bare := func(context.Context, *Msg, *Outputs) error { return nil }
	ctx := context.Background()
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = bare(ctx, m, out)
		}
	})
	h := traceContext("svc")(bare)
	b.Run("middleware", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = h(ctx, m, out)
		}
	})
}
