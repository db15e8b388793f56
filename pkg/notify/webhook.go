package notify

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/failbus/failbus/pkg/events"
)

// Header names the webhook sink sets.
const (
	// HeaderSignature carries hex(HMAC-SHA256(secret, body)) when the sink
	// has a secret (CONTRACT.md), so the receiver can check the body came
	// from failbus and was not altered.
	HeaderSignature = "X-Failbus-Signature"
	// HeaderIdempotencyKey carries Delivery.IdempotencyKey. A receiver
	// that drops a request whose key it has seen gets each notification
	// once, even when the notifier has to re-send after a crash.
	HeaderIdempotencyKey = "Idempotency-Key"
	// headerAttempt carries Delivery.Attempt, for the receiver's logs.
	headerAttempt = "X-Failbus-Attempt"
)

// WebhookPayload is the JSON body the webhook sink POSTs (CONTRACT.md):
// every key is always present, labels as an object even when empty.
type WebhookPayload struct {
	DedupeKey string            `json:"dedupe_key"`
	Severity  string            `json:"severity"`
	Title     string            `json:"title"`
	Text      string            `json:"text"`
	Labels    map[string]string `json:"labels"`
	At        events.Time       `json:"at"`
}

// newWebhookPayload is the body for n.
func newWebhookPayload(n events.Notification) WebhookPayload {
	labels := n.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	return WebhookPayload{DedupeKey: n.DedupeKey, Severity: n.Severity, Title: n.Title, Text: n.Text, Labels: labels, At: n.At}
}

// Sign is the X-Failbus-Signature of body under secret: lower-case hex of
// HMAC-SHA256. Receivers compare it with hmac.Equal.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// WebhookConfig configures a generic webhook sink.
type WebhookConfig struct {
	// Name is the sink's name. Required.
	Name string
	// URL receives a POST per notification. Required, http or https.
	URL string
	// Secret, when set, signs every body (HeaderSignature). It comes from
	// the environment variable the policy names, never from the file.
	Secret []byte
	// Idempotent declares that the receiver drops a request whose
	// Idempotency-Key it has already seen; the notifier then re-sends
	// unconfirmed deliveries without risking duplicates. Defaults to false.
	Idempotent bool
	// Client sends the requests. Defaults to a shared client without an
	// overall timeout (each Send has a context deadline).
	Client *http.Client
}

// webhookSink is the sink NewWebhook returns.
type webhookSink struct{ cfg WebhookConfig }

// NewWebhook checks cfg and returns the sink.
//
// The webhook sink POSTs each notification as JSON (WebhookPayload) to a
// URL, with HeaderSignature, HeaderIdempotencyKey and X-Failbus-Attempt
// (the attempt number, for the receiver's logs).
func NewWebhook(cfg WebhookConfig) (Sink, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("webhook sink: name is required")
	}
	if err := requireURL("webhook", cfg.Name, cfg.URL); err != nil {
		return nil, err
	}
	return &webhookSink{cfg: cfg}, nil
}

// Name implements Sink.
func (w *webhookSink) Name() string { return w.cfg.Name }

// Idempotent implements Idempotent: true when the receiver is configured
// to deduplicate on Idempotency-Key.
func (w *webhookSink) Idempotent() bool { return w.cfg.Idempotent }

// Send implements Sink.
func (w *webhookSink) Send(ctx context.Context, d Delivery) error {
	body, err := json.Marshal(newWebhookPayload(d.Notification))
	if err != nil {
		return &SinkError{Sink: w.cfg.Name, Answer: "encode payload: " + err.Error(), Permanent: true}
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	if d.IdempotencyKey != "" {
		h.Set(HeaderIdempotencyKey, d.IdempotencyKey)
	}
	h.Set(headerAttempt, strconv.Itoa(d.Attempt))
	if len(w.cfg.Secret) > 0 {
		h.Set(HeaderSignature, Sign(w.cfg.Secret, body))
	}
	return httpRequest{sink: w.cfg.Name, client: w.cfg.Client, url: w.cfg.URL, header: h, body: body}.do(ctx)
}
