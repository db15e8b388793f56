package otelsetup_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"go.opentelemetry.io/otel"

	"github.com/failbus/failbus/internal/otelsetup"
	"github.com/failbus/failbus/internal/tracing"
)

// Without OTEL_EXPORTER_OTLP_ENDPOINT nothing is installed; with it, spans
// are exported over OTLP/HTTP to it, and tracing is on until shutdown.
// Not parallel: it sets the environment and the global provider.
func TestOTLPExportOnlyWhenAnEndpointIsSet(t *testing.T) {
	for _, env := range []string{otelsetup.EnvEndpoint, otelsetup.EnvTracesEndpoint, otelsetup.EnvProtocol, otelsetup.EnvTracesProtocol, otelsetup.EnvSDKDisabled, otelsetup.EnvTracesExporter} {
		t.Setenv(env, "")
	}
	ctx := context.Background()
	shutdown, on, err := otelsetup.Start(ctx, "test")
	if err != nil || on || tracing.Enabled() {
		t.Fatalf("without an endpoint: on %v, enabled %v, %v", on, tracing.Enabled(), err)
	}
	_ = shutdown(ctx)

	var (
		mu    sync.Mutex
		paths []string
		sizes []int
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		paths, sizes = append(paths, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type")), append(sizes, len(body))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	t.Setenv(otelsetup.EnvEndpoint, collector.URL)
	t.Setenv(otelsetup.EnvProtocol, "grpc")
	if _, _, err := otelsetup.Start(ctx, "test"); err == nil {
		t.Error("the gRPC protocol was accepted")
	}
	t.Setenv(otelsetup.EnvProtocol, "")

	before := otel.GetTracerProvider()
	shutdown, on, err = otelsetup.Start(ctx, "test")
	if err != nil || !on || !tracing.Enabled() {
		t.Fatalf("with an endpoint: on %v, enabled %v, %v", on, tracing.Enabled(), err)
	}
	defer otel.SetTracerProvider(before)
	_, span := tracing.Tracer().Start(ctx, "process failbus.outcome.{provider}.{agent}")
	span.End()
	if err := shutdown(ctx); err != nil { // flushes
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "POST /v1/traces application/x-protobuf" || sizes[0] == 0 {
		t.Errorf("the collector got %v (%v bytes), want one OTLP/HTTP export", paths, sizes)
	}
}
