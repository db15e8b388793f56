package e2e

// Acceptance of the secret rule on the whole bus (every service of
// `failbus dev`, a webhook and a log sink): a credential placed anywhere in
// an outcome appears in clear nowhere but in FAILBUS_OUTCOMES and in the
// original bytes a dead letter keeps — not in any other stream or bucket,
// not in a message header, a log line, a dead letter's reason, a metric
// label or a notification.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// syncBuffer is a log writer several services share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// secretPlacement is one outcome with a credential somewhere in it. secret
// is the part that must never appear in clear (a key's body, a password).
type secretPlacement struct {
	name   string
	secret string
	id     string // the outcome's id
	data   []byte
	// dead: the outcome is unusable and must be dead-lettered (the reason
	// must not repeat the secret either).
	dead bool
}

func secretPlacements(t *testing.T) []secretPlacement {
	var h hostileBuilder
	n := 0
	key := func(prefix string) string { // a distinct credential per placement
		n++
		return fmt.Sprintf("%s%02dAbCdEfGhIjKlMnOpQrStUvWxYz%02d", prefix, n, n)
	}
	now := time.Now().UTC()
	enc := func(o *events.Outcome) []byte {
		data, err := events.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	base := func(id string) *events.Outcome {
		return &events.Outcome{ID: id, At: events.At(now), Agent: "bot", Provider: "openai", Model: "gpt-x", Profile: "p1", Session: "s", Segment: 1}
	}
	var ps []secretPlacement
	add := func(name, secret string, dead bool, edit func(o *events.Outcome)) {
		o := base(fmt.Sprintf("sec-%02d", len(ps)))
		edit(o)
		ps = append(ps, secretPlacement{name: name, secret: secret, id: o.ID, data: enc(o), dead: dead})
	}
	raw := func(name, secret string, dead bool, build func(id string) []byte) {
		id := fmt.Sprintf("sec-%02d", len(ps))
		ps = append(ps, secretPlacement{name: name, secret: secret, id: id, data: build(id), dead: dead})
	}
	k := key("sk-proj-")
	add("openai key echoed in the body", k[8:], false, func(o *events.Outcome) {
		o.Status, o.Body = 401, `{"error":{"message":"Incorrect API key provided: `+k+`. You can find your API key at https://platform.openai.com/account/api-keys.","code":"invalid_api_key"}}`
	})
	k = key("sk-ant-api03-")
	add("anthropic key in the body", k[13:], false, func(o *events.Outcome) {
		o.Provider, o.Status, o.Body = "anthropic", 403, "permission denied for key "+k
	})
	add("URL credentials in the body", "Hunter2Body", false, func(o *events.Outcome) {
		o.Status, o.Body = 502, "upstream https://gateway:Hunter2Body@gw.internal/v1/chat refused the connection"
	})
	add("database URL in the body", "PgPass-Body-77", false, func(o *events.Outcome) {
		o.Status, o.Body = 500, "pq: connect postgres://svc:PgPass-Body-77@db.internal:5432/app?sslmode=require failed"
	})
	k = key("")
	add("bearer token in the authorization header", k, false, func(o *events.Outcome) {
		o.Status, o.Body = 429, `{"error":{"message":"Rate limit reached"}}`
		o.Headers = map[string]string{"authorization": "Bearer " + k, "retry-after": "1"}
	})
	k = key("sk-proj-")
	add("key in x-api-key", k[8:], false, func(o *events.Outcome) {
		o.Status, o.Headers = 403, map[string]string{"x-api-key": k}
	})
	add("URL credentials in a location header", "LocPass-9911", false, func(o *events.Outcome) {
		o.Status, o.Headers = 503, map[string]string{"location": "https://u:LocPass-9911@mirror.internal/", "retry-after": "2"}
	})
	k = key("gsk_")
	add("api_key= in the upstream code", k[4:], false, func(o *events.Outcome) {
		o.Status, o.UpstreamCode = 400, "bad request with api_key="+k
	})
	k = key("sk-proj-")
	add("a key as the stop reason", k[8:], false, func(o *events.Outcome) {
		o.OK, o.Status, o.StopReason = true, 200, k
	})
	add("a refused increment quoting a key", "Refused-Key-Body-31", false, func(o *events.Outcome) {
		o.OK, o.Status, o.StopReason, o.RefusalScope = true, 200, "refusal", "increment"
		o.Body = "I cannot help with token=Refused-Key-Body-31"
	})
	// Unusable outcomes: the dead letter's reason names the field without
	// repeating the value.
	k = key("sk-proj-")
	add("a key as the refusal scope", k[8:], true, func(o *events.Outcome) { o.Status, o.RefusalScope = 400, k })
	k = key("sk-proj-")
	add("a key as the model", k[8:], true, func(o *events.Outcome) { o.Status, o.Model = 400, k })
	k = key("sk-proj-")
	add("a key as the profile", k[8:], true, func(o *events.Outcome) { o.Status, o.Profile = 400, k })
	add("a JWT as the session", "eyJzdWIiOiJhZ2VudC1ib3QtMDEifQ", true, func(o *events.Outcome) {
		o.Status, o.Session = 400, "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZ2VudC1ib3QtMDEifQ.c2lnbmF0dXJl"
	})
	k = key("sk-proj-")
	add("a key as the id", k[8:], true, func(o *events.Outcome) { o.ID, o.Status = k, 400 })
	// A time that is a credential: built by hand (events.Time cannot hold it).
	k = key("")
	raw("a bearer token as the time", k, true, func(id string) []byte { return h.outcome(id, "at", h.str("Bearer "+k)) })
	add("URL credentials as the provider", "ProvPass-5150", true, func(o *events.Outcome) {
		o.Provider = "https://svc:ProvPass-5150@gw.internal"
	})
	k = key("sk-proj-")
	raw("a key as an unknown field's value", k[8:], false, func(id string) []byte { return h.outcome(id, "x_debug_key", h.str(k)) })
	k = key("sk-proj-")
	raw("a key as an unknown field's name, nested too deep", k[8:], true, func(id string) []byte { return h.outcome(id, k, h.nested(100, false)) })
	// Three network failures of one provider: an outage, with health
	// records, a notification and its delivery to the sinks.
	for i := range 3 {
		add(fmt.Sprintf("URL credentials in the transport error (outage %d of 3)", i+1), "TransPass-4242", false, func(o *events.Outcome) {
			o.Provider, o.Profile = "leaky", fmt.Sprintf("p%d", i)
			o.TransportError = "fetch https://svc:TransPass-4242@api.leaky.example/v1/chat failed: read tcp: ECONNRESET"
		})
	}
	return ps
}

func TestSecretsStayInTheOutcomeStream(t *testing.T) {
	t.Parallel()
	var hooked syncBuffer
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		hooked.Write(append(body, '\n'))
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()
	pol, err := policy.Parse([]byte(fmt.Sprintf(`
notify:
  daily_budget: 1000
  sinks:
    - {name: hook, type: webhook, url: %s}
    - {name: log, type: log}
`, hook.URL)))
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	b, err := devbus.Start(devbus.Options{
		Server: embedded.Options{Dir: t.TempDir()},
		Policy: pol,
		Log:    zerolog.New(&logs).Level(zerolog.DebugLevel),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = b.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	ps := secretPlacements(t)
	for _, p := range ps {
		// The simplest agent: a bare msgpack map on the outcome subject of
		// a clean provider name and its agent (the subject is the
		// identity; a payload that does not decode is a hostile one's).
		agent := "hostile"
		var head struct {
			Agent string `msgpack:"agent"`
		}
		if msgpack.Unmarshal(p.data, &head) == nil && head.Agent != "" {
			agent = head.Agent
		}
		if _, err := b.JS.PublishMsg(ctx, &nats.Msg{Subject: events.OutcomeSubject("openai", agent), Data: p.data}); err != nil {
			t.Fatal(err)
		}
	}
	waitAllCaughtUp(ctx, t, b.JS)

	// Where each secret may be: the outcome stream, and the original
	// bytes of a dead letter. Everything else is collected as text.
	places := map[string]string{
		"webhook deliveries":  hooked.String(),
		"metrics (/metrics)":  gatherText(t, b),
		"dead letter reasons": "",
	}
	deadLettered := map[string]bool{}
	names, err := streamNames(ctx, b.JS)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if name == topology.StreamOutcomes {
			continue
		}
		var text strings.Builder
		for _, m := range readStream(ctx, t, b.JS, name) {
			text.WriteString(m.Subject())
			for k, vs := range m.Headers() {
				text.WriteString(" " + k + ": " + strings.Join(vs, ","))
			}
			data := m.Data()
			if name == topology.StreamDLQ {
				dl, err := events.DecodeAs[*events.DeadLetter](m.Subject(), m.Headers(), data)
				if err != nil {
					t.Fatalf("dead letter: %v", err)
				}
				deadLettered[outcomeID(dl.Data)] = true
				places["dead letter reasons"] += dl.Reason + "\n"
				dl.Data, dl.Headers = nil, nil // the original: allowed to hold it
				dl.DataSHA256 = ""
				data, _ = json.Marshal(dl)
			}
			text.Write(data)
			text.WriteByte('\n')
		}
		places["stream "+name] = text.String()
	}
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	places["service logs"] = logs.String()
	for _, p := range ps {
		t.Run(p.name, func(t *testing.T) {
			if deadLettered[p.id] != p.dead {
				t.Errorf("dead-lettered %v, want %v", deadLettered[p.id], p.dead)
			}
			for where, text := range places {
				if strings.Contains(text, p.secret) {
					t.Errorf("%q in clear in %s", p.secret, where)
				}
			}
		})
	}
	// The test saw what it claims to: the outage was notified and
	// delivered, dead letters and classifications exist.
	if !strings.Contains(hooked.String(), "leaky") {
		t.Errorf("no notification about the outage reached the webhook:\n%s", hooked.String())
	}
	if !strings.Contains(places["stream "+topology.StreamClassified], "invalid_api_key") && !strings.Contains(places["stream "+topology.StreamClassified], "auth") {
		t.Error("the classifications the test scans are missing")
	}
	if strings.Count(places["dead letter reasons"], "\n") < 8 {
		t.Errorf("only these dead letters:\n%s", places["dead letter reasons"])
	}
}

// outcomeID is the id of a msgpack outcome, or "" when it has none that
// can be read. The payloads here are small and at most 100 levels deep.
func outcomeID(data []byte) string {
	var o struct {
		ID string `msgpack:"id"`
	}
	_ = msgpack.Unmarshal(data, &o)
	return o.ID
}

// waitAllCaughtUp waits until every durable consumer of the topology has
// acknowledged everything on its stream.
func waitAllCaughtUp(ctx context.Context, t *testing.T, js jetstream.JetStream) {
	t.Helper()
	for _, name := range topology.Consumers() {
		stream, _, _ := topology.Consumer(name)
		for {
			done, err := embedded.CaughtUp(ctx, js, stream, name)
			if err == nil && done {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s did not catch up: %v", name, err)
			case <-time.After(20 * time.Millisecond): // poll interval, bounded by ctx
			}
		}
	}
}

func streamNames(ctx context.Context, js jetstream.JetStream) ([]string, error) {
	var names []string
	l := js.StreamNames(ctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	return names, l.Err()
}

// readStream returns every message of a stream.
func readStream(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string) []jetstream.Msg {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := int(info.State.Msgs)
	if n == 0 {
		return nil
	}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []jetstream.Msg
	for len(out) < n {
		batch, err := oc.Fetch(n-len(out), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			out = append(out, m)
			got++
		}
		if got == 0 {
			break // deleted or expired meanwhile (KV TTLs)
		}
	}
	return out
}

// gatherText renders every metric series of the bus, names and labels,
// as /metrics shows them.
func gatherText(t *testing.T, b *devbus.Bus) string {
	t.Helper()
	mfs, err := b.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			buf.WriteString(mf.GetName())
			for _, lp := range m.GetLabel() {
				fmt.Fprintf(&buf, " %s=%q", lp.GetName(), lp.GetValue())
			}
			buf.WriteByte('\n')
		}
	}
	return buf.String()
}
