package notify

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/failbus/failbus/pkg/events"
)

// defaultPagerDutyURL is PagerDuty's Events API v2 endpoint.
const defaultPagerDutyURL = "https://events.pagerduty.com/v2/enqueue"

// PagerDuty limits (Events API v2).
const (
	pdMaxDedupKey = 255
	pdMaxSummary  = 1024
)

// PagerDutyConfig configures a PagerDuty Events API v2 sink.
type PagerDutyConfig struct {
	// Name is the sink's name. Required.
	Name string
	// URL is the Events API endpoint. Defaults to defaultPagerDutyURL;
	// tests point it at a local server.
	URL string
	// RoutingKey is the integration's routing key, from the environment
	// variable the policy names. Required.
	RoutingKey string
	// Source is the payload's source field. Defaults to "failbus".
	Source string
	// Client sends the requests. Defaults to a shared client.
	Client *http.Client
}

// pagerDutySink is the sink NewPagerDuty returns.
type pagerDutySink struct{ cfg PagerDutyConfig }

// NewPagerDuty checks cfg and returns the sink.
//
// The PagerDuty sink triggers a PagerDuty event per notification. The dedupe key
// becomes PagerDuty's dedup_key, so PagerDuty itself absorbs a repeated
// trigger: the sink is Idempotent.
func NewPagerDuty(cfg PagerDutyConfig) (Sink, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("pagerduty sink: name is required")
	}
	if cfg.URL == "" {
		cfg.URL = defaultPagerDutyURL
	}
	if err := requireURL("pagerduty", cfg.Name, cfg.URL); err != nil {
		return nil, err
	}
	if cfg.RoutingKey == "" {
		return nil, fmt.Errorf("pagerduty sink %q: routing key is required (set routing_key_env and that variable)", cfg.Name)
	}
	if cfg.Source == "" {
		cfg.Source = "failbus"
	}
	return &pagerDutySink{cfg: cfg}, nil
}

// Name implements Sink.
func (p *pagerDutySink) Name() string { return p.cfg.Name }

// Idempotent implements Idempotent: PagerDuty deduplicates triggers on
// dedup_key.
func (p *pagerDutySink) Idempotent() bool { return true }

// pagerDutyEvent is the Events API v2 body.
type pagerDutyEvent struct {
	RoutingKey  string           `json:"routing_key"`
	EventAction string           `json:"event_action"`
	DedupKey    string           `json:"dedup_key"`
	Client      string           `json:"client,omitempty"`
	Payload     pagerDutyPayload `json:"payload"`
}

// pagerDutyPayload is the event's payload.
type pagerDutyPayload struct {
	Summary       string         `json:"summary"`
	Source        string         `json:"source"`
	Severity      string         `json:"severity"`
	Timestamp     string         `json:"timestamp,omitempty"`
	CustomDetails map[string]any `json:"custom_details,omitempty"`
}

// pagerDutySeverity maps a failbus severity to PagerDuty's: critical stays
// critical, normal is warning, info is info.
func pagerDutySeverity(severity string) string {
	switch severity {
	case events.SeverityCritical:
		return "critical"
	case events.SeverityInfo:
		return "info"
	}
	return "warning"
}

// pagerDutyDedupKey is the dedup_key for a dedupe key: the key itself, or,
// when longer than PagerDuty's 255 bytes, "failbus-sha256:" and its hash.
func pagerDutyDedupKey(dedupeKey string) string {
	if len(dedupeKey) <= pdMaxDedupKey {
		return dedupeKey
	}
	sum := sha256.Sum256([]byte(dedupeKey))
	return "failbus-sha256:" + hex.EncodeToString(sum[:])
}

// Send implements Sink. PagerDuty answers 202; 400 (invalid event) is
// permanent, 429 and 5xx temporary.
func (p *pagerDutySink) Send(ctx context.Context, d Delivery) error {
	n := d.Notification
	summary := n.Title
	if summary == "" {
		summary, _, _ = strings.Cut(n.Text, "\n")
	}
	if summary == "" {
		summary = n.DedupeKey
	}
	summary = truncateUTF8(summary, pdMaxSummary)
	details := map[string]any{"dedupe_key": n.DedupeKey, "failbus_severity": n.Severity}
	if n.Text != "" {
		details["text"] = n.Text
	}
	if len(n.Labels) > 0 {
		details["labels"] = n.Labels
	}
	ev := pagerDutyEvent{
		RoutingKey:  p.cfg.RoutingKey,
		EventAction: "trigger",
		DedupKey:    pagerDutyDedupKey(n.DedupeKey),
		Client:      "failbus",
		Payload: pagerDutyPayload{
			Summary:       summary,
			Source:        p.cfg.Source,
			Severity:      pagerDutySeverity(n.Severity),
			CustomDetails: details,
		},
	}
	if !n.At.IsZero() {
		ev.Payload.Timestamp = n.At.UTC().Format(events.JSONTimeLayout)
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return &SinkError{Sink: p.cfg.Name, Answer: "encode payload: " + err.Error(), Permanent: true}
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	return httpRequest{sink: p.cfg.Name, client: p.cfg.Client, url: p.cfg.URL, header: h, body: body}.do(ctx)
}

// truncateUTF8 cuts s to at most n bytes on a rune boundary.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
