package tracing_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/failbus/failbus/internal/tracing"
)

// The W3C recommendation's example, as the TypeScript client's helper
// writes it too (clients/typescript/src/trace.ts).
const example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestExtractInjectRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    nats.Header
		want string // traceparent injected again; "" for none
	}{
		{"a record with a traceparent", nats.Header{"traceparent": {example}, "tracestate": {"rojo=1"}}, example},
		{"capitalised as an HTTP client writes it", nats.Header{"Traceparent": {example}}, example},
		{"a record without one", nats.Header{"Nats-Msg-Id": {"x"}}, ""},
		{"a malformed one", nats.Header{"traceparent": {"00-nothex-00f067aa0ba902b7-01"}}, ""},
		{"all-zero trace id", nats.Header{"traceparent": {"00-00000000000000000000000000000000-00f067aa0ba902b7-01"}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tracing.Extract(context.Background(), tc.h)
			if got := trace.SpanContextFromContext(ctx).IsValid(); got != (tc.want != "") {
				t.Fatalf("span context valid = %v", got)
			}
			out := nats.Header{}
			tracing.Inject(ctx, out)
			if got := out.Get(tracing.HeaderTraceparent); got != tc.want {
				t.Errorf("injected %q, want %q", got, tc.want)
			}
			if tc.want != "" && tc.h.Get("tracestate") != "" && out.Get(tracing.HeaderTracestate) != tc.h.Get("tracestate") {
				t.Errorf("tracestate %q not passed on", out.Get(tracing.HeaderTracestate))
			}
			if h := tracing.Header(ctx); (h != nil) != (tc.want != "") {
				t.Errorf("Header = %v", h)
			}
		})
	}
}

func TestTemplateNamesTheVariableTokens(t *testing.T) {
	for subject, want := range map[string]string{
		"failbus.outcome.openai.bot":           "failbus.outcome.{provider}.{agent}",
		"failbus.classified.openai.rate_limit": "failbus.classified.{provider}.{class}",
		"failbus.retry.due.bot":                "failbus.retry.due.{agent}",
		"failbus.decision.bot":                 "failbus.decision.{agent}",
		"failbus.dispatch.bot":                 "failbus.dispatch.{agent}",
		"other.thing.a.b":                      "other.thing.*",
		"single":                               "single",
	} {
		if got := tracing.Template(subject); got != want {
			t.Errorf("Template(%s) = %s, want %s", subject, got, want)
		}
	}
}

// Off by default: nothing installed a TracerProvider in this test binary.
func TestOffWithoutAProvider(t *testing.T) {
	if tracing.Enabled() {
		t.Fatal("tracing is on with OpenTelemetry's default provider")
	}
}
