package recoverer

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/pkg/events"
)

// The built-in HTTP probe makes the configured request (method, headers,
// a header read from the environment at run time), counts only the
// expected status as a success, and reports the result as an outcome of
// origin probe with a derived id; a failed request's outcome and log line
// carry no key from the URL's query.
func TestHTTPProbeRequestAndOutcome(t *testing.T) {
	var mu sync.Mutex
	type request struct{ method, path, auth, probe string }
	var got []request
	status := http.StatusNoContent
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, request{r.Method, r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("X-Probe")})
		st := status
		mu.Unlock()
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(st)
		_, _ = w.Write([]byte(strings.Repeat("b", 10000)))
	}))
	defer srv.Close()
	// A port nothing listens on: the request fails.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()

	const key = "AIzaSyA1b2C3d4E5f6G7h8I9j0KkLlMmNnOoPpQ"
	probes := recovery.Config{Probes: map[string]recovery.HTTPProbe{
		"up":   {URL: srv.URL + "/v1/models", Method: "POST", Headers: map[string]string{"X-Probe": "1"}, HeadersEnv: map[string]string{"Authorization": "PROBE_AUTH"}, ExpectStatus: http.StatusNoContent, Model: "m"},
		"down": {URL: dead + "/v1/models?key=" + key, Timeout: 2 * time.Second},
	}}.WithDefaults().Probes
	var logs bytes.Buffer
	var published []*events.Outcome
	results := map[string]bool{}
	p := &httpProber{
		probes: probes, client: &http.Client{}, now: time.Now, log: zerolog.New(zerolog.SyncWriter(&logs)),
		getenv: func(k string) string {
			if k == "PROBE_AUTH" {
				return "Bearer from-env"
			}
			return ""
		},
		publish: func(_ context.Context, o *events.Outcome) error {
			mu.Lock()
			defer mu.Unlock()
			published = append(published, o)
			return nil
		},
		result: func(provider string, ok bool) { mu.Lock(); results[provider] = ok; mu.Unlock() },
	}
	ctx := context.Background()
	p.run(ctx, "up", "up:1000", 1, time.Now())
	p.wait()
	mu.Lock()
	status = http.StatusServiceUnavailable
	mu.Unlock()
	p.run(ctx, "up", "up:1000", 2, time.Now())
	p.run(ctx, "down", "down:1000", 1, time.Now())
	p.run(ctx, "unconfigured", "x:1", 1, time.Now())
	p.wait()

	if want := (request{"POST", "/v1/models", "Bearer from-env", "1"}); len(got) != 2 || got[0] != want {
		t.Fatalf("requests %+v, want 2 like %+v", got, want)
	}
	byID := map[string]*events.Outcome{}
	for _, o := range published {
		byID[o.ID] = o
		if o.Origin == nil || o.Origin.Kind != OriginProbe || o.Agent != recovery.DefaultProbeAgent || o.At.IsZero() {
			t.Errorf("outcome %+v: want origin probe, agent %s, a time", o, recovery.DefaultProbeAgent)
		}
	}
	if len(published) != 3 {
		t.Fatalf("%d outcomes, want 3 (nothing for a provider without a probe)", len(published))
	}
	if o := byID["probe:up:1000:1"]; o == nil || !o.OK || o.Status != 204 || o.Model != "m" || o.Headers["retry-after"] != "7" {
		t.Errorf("204 as expected: %+v", o)
	}
	if o := byID["probe:up:1000:2"]; o == nil || o.OK || o.Status != 503 || len(o.Body) != maxProbeBody {
		t.Errorf("503 where 204 is expected: %+v", o)
	}
	o := byID["probe:down:1000:1"]
	if o == nil || o.OK || o.TransportError == "" || !strings.Contains(o.TransportError, "/v1/models?…") {
		t.Fatalf("refused connection: %+v", o)
	}
	if strings.Contains(o.TransportError, key) || strings.Contains(logs.String(), key) {
		t.Errorf("the key in the probe URL leaked: %q\n%s", o.TransportError, logs.String())
	}
	if results["up"] || results["down"] {
		t.Errorf("results %v: the last probe of each failed", results)
	}
}
