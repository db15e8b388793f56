package notify_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/notify"
	"github.com/failbus/failbus/pkg/notify/sinktest"
)

// labelText renders labels the way a human reads them in every format.
func labelText(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%s", k, labels[k])
	}
	return b.String()
}

const webhookSecret = "s3cret-for-tests"

var webhookHarness = sinktest.Harness{
	Name: "webhook",
	Start: func(t testing.TB) *sinktest.Endpoint {
		return sinktest.NewHTTPEndpoint(t, sinktest.HTTPReceiver{
			Decode: func(r *http.Request, body []byte) (sinktest.Received, error) {
				// CONTRACT.md: X-Failbus-Signature is the hex HMAC-SHA256 of
				// the body, computed here independently of notify.Sign.
				mac := hmac.New(sha256.New, []byte(webhookSecret))
				mac.Write(body)
				if got, want := r.Header.Get("X-Failbus-Signature"), hex.EncodeToString(mac.Sum(nil)); got != want {
					return sinktest.Received{}, fmt.Errorf("signature %q, want %q", got, want)
				}
				if ct := r.Header.Get("Content-Type"); ct != "application/json" {
					return sinktest.Received{}, fmt.Errorf("content type %q", ct)
				}
				// CONTRACT.md: JSON {dedupe_key, severity, title, text,
				// labels, at}, nothing more, labels an object, at RFC 3339.
				var raw map[string]json.RawMessage
				if err := json.Unmarshal(body, &raw); err != nil {
					return sinktest.Received{}, err
				}
				want := []string{"at", "dedupe_key", "labels", "severity", "text", "title"}
				keys := make([]string, 0, len(raw))
				for k := range raw {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				if !slices.Equal(keys, want) {
					return sinktest.Received{}, fmt.Errorf("payload keys %v, want exactly %v", keys, want)
				}
				if l := raw["labels"]; len(l) == 0 || l[0] != '{' {
					return sinktest.Received{}, fmt.Errorf("labels %s: want an object", l)
				}
				var at string
				if err := json.Unmarshal(raw["at"], &at); err != nil {
					return sinktest.Received{}, fmt.Errorf("at %s: %v", raw["at"], err)
				}
				if _, err := time.Parse(time.RFC3339, at); err != nil {
					return sinktest.Received{}, fmt.Errorf("at %q is not RFC 3339: %v", at, err)
				}
				var p notify.WebhookPayload
				if err := json.Unmarshal(body, &p); err != nil {
					return sinktest.Received{}, err
				}
				return sinktest.Received{
					Text:           p.Title + "\n" + p.Text + "\n" + labelText(p.Labels),
					Severity:       p.Severity,
					DedupeKey:      p.DedupeKey,
					IdempotencyKey: r.Header.Get(notify.HeaderIdempotencyKey),
				}, nil
			},
			Temporary: sinktest.Answer{Status: http.StatusServiceUnavailable, Body: "receiver restarting"},
			Permanent: sinktest.Answer{Status: http.StatusNotFound, Body: "no such hook"},
		}, func(url string) (notify.Sink, error) {
			return notify.NewWebhook(notify.WebhookConfig{Name: "ops-hook", URL: url, Secret: []byte(webhookSecret), Idempotent: true})
		})
	},
}

var slackHarness = sinktest.Harness{
	Name: "slack",
	Start: func(t testing.TB) *sinktest.Endpoint {
		return sinktest.NewHTTPEndpoint(t, sinktest.HTTPReceiver{
			Decode: func(r *http.Request, body []byte) (sinktest.Received, error) {
				var m struct {
					Text string `json:"text"`
				}
				if err := json.Unmarshal(body, &m); err != nil {
					return sinktest.Received{}, err
				}
				if m.Text == "" {
					return sinktest.Received{}, fmt.Errorf("empty text")
				}
				// Slack's mrkdwn escapes exactly &, < and >.
				text := html.UnescapeString(m.Text)
				sev := ""
				if rest, ok := strings.CutPrefix(text, "*["); ok {
					sev, _, _ = strings.Cut(rest, "]")
					sev = strings.ToLower(sev)
				}
				return sinktest.Received{Text: text, Severity: sev}, nil
			},
			Temporary: sinktest.Answer{Status: http.StatusInternalServerError, Body: "rollup_error"},
			Permanent: sinktest.Answer{Status: http.StatusNotFound, Body: "no_service"},
		}, func(url string) (notify.Sink, error) {
			return notify.NewSlack(notify.SlackConfig{Name: "team-slack", URL: url})
		})
	},
}

var ntfyHarness = sinktest.Harness{
	Name: "ntfy",
	Start: func(t testing.TB) *sinktest.Endpoint {
		return sinktest.NewHTTPEndpoint(t, sinktest.HTTPReceiver{
			Decode: func(r *http.Request, body []byte) (sinktest.Received, error) {
				if got := r.Header.Get("Authorization"); got != "Bearer tk_test" {
					return sinktest.Received{}, fmt.Errorf("authorization %q", got)
				}
				if r.URL.Path != "/" {
					return sinktest.Received{}, fmt.Errorf("JSON publishes go to the server root, got %s", r.URL.Path)
				}
				var m notify.NtfyMessage
				if err := json.Unmarshal(body, &m); err != nil {
					return sinktest.Received{}, err
				}
				if m.Topic != "failbus-alerts" {
					return sinktest.Received{}, fmt.Errorf("topic %q", m.Topic)
				}
				sev, ok := map[int]string{2: events.SeverityInfo, 3: events.SeverityNormal, 5: events.SeverityCritical}[m.Priority]
				if !ok {
					return sinktest.Received{}, fmt.Errorf("priority %d is not a mapped ntfy priority", m.Priority)
				}
				return sinktest.Received{Text: m.Title + "\n" + m.Message, Severity: sev}, nil
			},
			Temporary: sinktest.Answer{Status: http.StatusTooManyRequests, Body: `{"code":42901,"http":429,"error":"limit reached: too many requests"}`},
			Permanent: sinktest.Answer{Status: http.StatusForbidden, Body: `{"code":40301,"http":403,"error":"forbidden"}`},
		}, func(url string) (notify.Sink, error) {
			return notify.NewNtfy(notify.NtfyConfig{Name: "phone", URL: url + "/failbus-alerts", Token: "tk_test"})
		})
	},
}

var pagerDutyHarness = sinktest.Harness{
	Name: "pagerduty",
	Start: func(t testing.TB) *sinktest.Endpoint {
		return sinktest.NewHTTPEndpoint(t, sinktest.HTTPReceiver{
			Decode: func(r *http.Request, body []byte) (sinktest.Received, error) {
				var ev notify.PagerDutyEvent
				if err := json.Unmarshal(body, &ev); err != nil {
					return sinktest.Received{}, err
				}
				if ev.RoutingKey != "R0UTINGKEY" || ev.EventAction != "trigger" || ev.Payload.Summary == "" || ev.Payload.Source == "" {
					return sinktest.Received{}, fmt.Errorf("invalid event: %s", body)
				}
				// Events v2 allows critical, error, warning, info; failbus
				// maps its three severities onto three of them.
				sev, ok := map[string]string{"info": events.SeverityInfo, "warning": events.SeverityNormal, "critical": events.SeverityCritical}[ev.Payload.Severity]
				if !ok {
					return sinktest.Received{}, fmt.Errorf("payload.severity %q is not a mapped PagerDuty severity", ev.Payload.Severity)
				}
				text, _ := ev.Payload.CustomDetails["text"].(string)
				labels := map[string]string{}
				if l, ok := ev.Payload.CustomDetails["labels"].(map[string]any); ok {
					for k, v := range l {
						labels[k], _ = v.(string)
					}
				}
				return sinktest.Received{
					Text:           ev.Payload.Summary + "\n" + text + "\n" + labelText(labels),
					Severity:       sev,
					DedupeKey:      ev.DedupKey,
					IdempotencyKey: ev.DedupKey,
				}, nil
			},
			OK:        sinktest.Answer{Status: http.StatusAccepted, Body: `{"status":"success","message":"Event processed"}`},
			Temporary: sinktest.Answer{Status: http.StatusTooManyRequests, Body: `{"status":"throttle event","message":"Requests for this service are arriving too quickly"}`},
			Permanent: sinktest.Answer{Status: http.StatusBadRequest, Body: `{"status":"invalid event","message":"Event object is invalid","errors":["'routing_key' is invalid"]}`},
		}, func(url string) (notify.Sink, error) {
			return notify.NewPagerDuty(notify.PagerDutyConfig{Name: "oncall", URL: url, RoutingKey: "R0UTINGKEY"})
		})
	},
}

var smtpHarness = sinktest.Harness{
	Name: "smtp",
	Start: func(t testing.TB) *sinktest.Endpoint {
		srv := sinktest.NewSMTPServer(t)
		sink, err := notify.NewSMTP(notify.SMTPConfig{Name: "mail", Addr: srv.Addr, From: "failbus <failbus@example.test>",
			To: []string{"oncall@example.test", "Ops <ops@example.test>"}})
		if err != nil {
			t.Fatal(err)
		}
		return &sinktest.Endpoint{
			Sink:       sink,
			SetFailure: srv.SetFailure,
			Received: func() []sinktest.Received {
				var out []sinktest.Received
				for _, m := range srv.Messages() {
					if m.From != "failbus@example.test" || len(m.To) != 2 || m.To[1] != "ops@example.test" {
						t.Errorf("envelope from %q to %v", m.From, m.To)
					}
					r, err := sinktest.DecodeMail(m.Data)
					if err != nil {
						t.Errorf("decode mail: %v\n%s", err, m.Data)
						continue
					}
					out = append(out, r)
				}
				return out
			},
			Hung:            srv.Hung(),
			TemporaryAnswer: sinktest.SMTPTemporaryAnswer,
			PermanentAnswer: sinktest.SMTPPermanentAnswer,
		}
	},
}

// logHarness reads the log sink's JSON lines back.
var logHarness = sinktest.Harness{
	Name: "log",
	Start: func(t testing.TB) *sinktest.Endpoint {
		var (
			mu  sync.Mutex
			buf bytes.Buffer
		)
		w := zerolog.SyncWriter(writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return buf.Write(p)
		}))
		sink, err := notify.NewLog("console", zerolog.New(w))
		if err != nil {
			t.Fatal(err)
		}
		return &sinktest.Endpoint{
			Sink: sink,
			Received: func() []sinktest.Received {
				mu.Lock()
				defer mu.Unlock()
				var out []sinktest.Received
				for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
					if len(line) == 0 {
						continue
					}
					var rec struct {
						Level     string            `json:"level"`
						DedupeKey string            `json:"dedupe_key"`
						Severity  string            `json:"severity"`
						Title     string            `json:"title"`
						Text      string            `json:"text"`
						Labels    map[string]string `json:"labels"`
					}
					if err := json.Unmarshal(line, &rec); err != nil {
						t.Errorf("log line %s: %v", line, err)
						continue
					}
					out = append(out, sinktest.Received{Text: rec.Title + "\n" + rec.Text + "\n" + labelText(rec.Labels), Severity: rec.Severity, DedupeKey: rec.DedupeKey})
				}
				return out
			},
		}
	},
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestSinkConformance runs the shared suite against every sink type.
func TestSinkConformance(t *testing.T) {
	t.Parallel()
	for _, h := range []sinktest.Harness{webhookHarness, slackHarness, ntfyHarness, pagerDutyHarness, smtpHarness, logHarness} {
		t.Run(h.Name, func(t *testing.T) {
			t.Parallel()
			sinktest.Run(t, h)
		})
	}
}

func TestNtfyPublishesJSONToTheServerRoot(t *testing.T) {
	t.Parallel()
	type got struct{ path, topic string }
	seen := make(chan got, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m notify.NtfyMessage
		_ = json.NewDecoder(r.Body).Decode(&m)
		seen <- got{r.URL.Path, m.Topic}
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct{ path, topic string }{
		{"/failbus-ops", ""},
		{"/failbus-ops", "failbus-ops"},
		{"/", "failbus-ops"},
	} {
		s, err := notify.NewNtfy(notify.NtfyConfig{Name: "n", URL: srv.URL + tc.path, Topic: tc.topic})
		if err != nil {
			t.Fatalf("NewNtfy(%s, %q): %v", tc.path, tc.topic, err)
		}
		if err := s.Send(context.Background(), notify.Delivery{Notification: sinktest.Sample("x")}); err != nil {
			t.Fatal(err)
		}
		if g := <-seen; g.path != "/" || g.topic != "failbus-ops" {
			t.Errorf("url path %s, topic %q: posted to %s with topic %q; want / and failbus-ops", tc.path, tc.topic, g.path, g.topic)
		}
	}
	if _, err := notify.NewNtfy(notify.NtfyConfig{Name: "n", URL: srv.URL + "/"}); err == nil {
		t.Error("a URL without a topic and no topic: want an error")
	}
}
