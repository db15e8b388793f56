package ops

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Serve serves the operations endpoints every failbus service exposes on
// addr until ctx ends:
//
//   - GET /metrics: the Prometheus text format of gatherer (an empty registry
//     when nil);
//   - GET /healthz: 200 "ok" when health returns nil (or is nil), else 503
//     with the error text;
//
// and any extra endpoints a process adds (`failbus dev --nodes 3`: stop
// and start a node). It returns the bound address (useful with port 0)
// once the listener is open; serving happens in the background. Bind to
// loopback unless a scraper elsewhere needs it: the endpoints have no
// authentication.
func Serve(ctx context.Context, addr string, gatherer prometheus.Gatherer, health func() error, log zerolog.Logger, extra ...Endpoint) (string, error) {
	if gatherer == nil {
		gatherer = prometheus.NewRegistry()
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("ops endpoints: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if health != nil {
			if err := health(); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintln(w, err.Error())
				return
			}
		}
		fmt.Fprintln(w, "ok")
	})
	for _, e := range extra {
		mux.Handle(e.Pattern, e.Handler)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	bound := ln.Addr().String()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Str("addr", bound).Msg("ops endpoints stopped")
		}
	}()
	context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	log.Info().Str("addr", bound).Msg("serving /metrics and /healthz")
	return bound, nil
}

// Endpoint is one more endpoint of Serve: an http.ServeMux pattern
// ("POST /nodes/{name}/stop") and its handler.
type Endpoint struct {
	Pattern string
	Handler http.Handler
}

// AllHealthy combines health checks into one for Serve, so a process
// that runs several services (failbus dev) reports every problem at once.
func AllHealthy(checks ...func() error) func() error {
	return func() error {
		var errs []error
		for _, c := range checks {
			if c == nil {
				continue
			}
			if err := c(); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
}
