package recoverer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/pkg/events"
)

// OriginProbe is the origin kind of the outcomes built-in probes publish.
const OriginProbe = "probe"

// maxProbeBody bounds how much of a probe's response body is kept in its
// outcome (the classifier reads the body).
const maxProbeBody = 4096

// httpProber runs the policy's built-in HTTP probes and publishes each
// result as an outcome, so it feeds the provider's health like any call.
type httpProber struct {
	probes  map[string]recovery.HTTPProbe
	client  *http.Client
	getenv  func(string) string
	now     func() time.Time
	publish func(ctx context.Context, o *events.Outcome) error
	log     zerolog.Logger
	result  func(provider string, ok bool)
	wg      sync.WaitGroup
}

// run starts one probe in the background; the outcome id is
// "probe:<recovery id>:<seq>", so a probe claimed twice is stored once.
func (p *httpProber) run(ctx context.Context, provider, recoveryID string, seq int, _ time.Time) {
	cfg, ok := p.probes[provider]
	if !ok {
		return
	}
	p.wg.Go(func() {
		o := p.call(ctx, provider, cfg)
		o.ID = fmt.Sprintf("probe:%s:%d", recoveryID, seq)
		if err := p.publish(context.WithoutCancel(ctx), o); err != nil {
			p.log.Warn().Err(err).Str("provider", provider).Str("outcome_id", o.ID).Msg("probe outcome not published")
			return
		}
		if p.result != nil {
			p.result(provider, o.OK)
		}
		p.log.Info().Str("provider", provider).Str("outcome_id", o.ID).Bool("ok", o.OK).Int("status", o.Status).
			Str("transport_error", o.TransportError).Msg("http probe")
	})
}

// wait waits for probes under way.
func (p *httpProber) wait() { p.wg.Wait() }

// call makes the request and describes what happened as an outcome.
func (p *httpProber) call(ctx context.Context, provider string, cfg recovery.HTTPProbe) *events.Outcome {
	o := &events.Outcome{
		Agent: cfg.Agent, Provider: provider, Profile: cfg.Profile, Model: cfg.Model,
		Origin: &events.Origin{Kind: OriginProbe, Name: "http"},
	}
	rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, cfg.Method, cfg.URL, nil)
	if err != nil {
		o.At, o.TransportError = events.At(p.now()), "probe request: "+err.Error()
		return o
	}
	for k, v := range cfg.Headers {
		req.Header.Set(k, v)
	}
	for k, env := range cfg.HeadersEnv {
		if v := p.getenv(env); v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := p.client.Do(req)
	o.At = events.At(p.now())
	if err != nil {
		o.TransportError = probeError(err)
		if rctx.Err() != nil {
			o.TransportError = "timeout: " + o.TransportError
		}
		return o
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProbeBody))
	o.At = events.At(p.now())
	o.Status, o.Body = resp.StatusCode, string(body)
	o.OK = resp.StatusCode == cfg.ExpectStatus
	o.Headers = map[string]string{}
	for _, h := range []string{"retry-after", "retry-after-ms", "x-should-retry"} {
		if v := resp.Header.Get(h); v != "" {
			o.Headers[strings.ToLower(h)] = v
		}
	}
	return o
}

// probeError is a failed request's error without the URL's query and user
// info: a probe URL may carry a key (`?key=…`), and the error goes into the
// outcome and the log line.
func probeError(err error) string {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err.Error()
	}
	return ue.Op + " " + safeURL(ue.URL) + ": " + ue.Err.Error()
}

// safeURL is raw without user info and with its query replaced by "?…".
func safeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable URL)"
	}
	u.User = nil
	if u.RawQuery != "" || u.ForceQuery {
		u.RawQuery, u.ForceQuery = "", false
		return u.String() + "?…"
	}
	return u.String()
}
