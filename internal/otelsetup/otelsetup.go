// Package otelsetup turns tracing on in a failbus process when the
// standard OpenTelemetry environment asks for it: with
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set,
// spans are exported over OTLP/HTTP (protobuf) with a batching processor;
// otherwise nothing is installed and internal/tracing records nothing. The
// exporter reads the rest of the OTEL_EXPORTER_OTLP_* variables itself
// (headers, TLS, timeout, compression); OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES name the process, OTEL_TRACES_SAMPLER samples.
//
// Not supported: the gRPC protocol (OTEL_EXPORTER_OTLP_PROTOCOL=grpc is an
// error naming http/protobuf), and exporters other than OTLP.
package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Environment variables that decide whether tracing is on.
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
)

// Wanted reports whether the environment asks for traces to be exported.
func Wanted() bool {
	if strings.EqualFold(os.Getenv(EnvSDKDisabled), "true") || strings.EqualFold(os.Getenv(EnvTracesExporter), "none") {
		return false
	}
	return os.Getenv(EnvEndpoint) != "" || os.Getenv(EnvTracesEndpoint) != ""
}

// Start installs a global TracerProvider exporting over OTLP/HTTP when
// Wanted, naming the process service (unless OTEL_SERVICE_NAME says
// otherwise). It returns the function that flushes and stops it (a no-op
// when tracing stayed off) and whether tracing is on.
func Start(ctx context.Context, service string) (shutdown func(context.Context) error, on bool, err error) {
	off := func(context.Context) error { return nil }
	if !Wanted() {
		return off, false, nil
	}
	for _, env := range []string{EnvTracesProtocol, EnvProtocol} {
		if p := os.Getenv(env); p != "" {
			if p != "http/protobuf" {
				return off, false, fmt.Errorf("%s=%s: failbus exports traces over http/protobuf only", env, p)
			}
			break
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return off, false, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(), resource.WithProcessPID())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return off, false, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, true, nil
}
