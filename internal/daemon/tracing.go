package daemon

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/otelsetup"
)

// tracingFlushTimeout bounds exporting the last spans at exit.
const tracingFlushTimeout = 5 * time.Second

// StartTracing turns span export on when OTEL_EXPORTER_OTLP_ENDPOINT asks
// for it (internal/otelsetup), as service failbus-<name>; the returned
// function flushes the last spans.
func StartTracing(ctx context.Context, name string, log zerolog.Logger) (func(), error) {
	shutdown, on, err := otelsetup.Start(ctx, "failbus-"+name)
	if err != nil {
		return nil, err
	}
	if !on {
		return func() {}, nil
	}
	log.Info().Msg("tracing on: exporting spans over OTLP")
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushTimeout)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn().Err(err).Msg("tracing: flushing the last spans")
		}
	}, nil
}
