package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
)

// SlackConfig configures a Slack incoming-webhook sink.
type SlackConfig struct {
	// Name is the sink's name. Required.
	Name string
	// URL is the incoming webhook URL (https://hooks.slack.com/services/…).
	// It is itself a credential; keep the policy file private or put the
	// URL in the environment and reference it with secret_env. Required.
	URL string
	// Client sends the requests. Defaults to a shared client.
	Client *http.Client
}

// slackSink is the sink NewSlack returns.
type slackSink struct{ cfg SlackConfig }

// NewSlack checks cfg and returns the sink.
//
// The Slack sink posts each notification to a Slack incoming webhook. Slack does not
// deduplicate, so the sink is not Idempotent.
func NewSlack(cfg SlackConfig) (Sink, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("slack sink: name is required")
	}
	if err := requireURL("slack", cfg.Name, cfg.URL); err != nil {
		return nil, err
	}
	return &slackSink{cfg: cfg}, nil
}

// Name implements Sink.
func (s *slackSink) Name() string { return s.cfg.Name }

// slackMessage is the body posted to the incoming webhook.
type slackMessage struct {
	Text string `json:"text"`
}

// slackText renders a notification in Slack's mrkdwn: the severity and the
// title in bold on the first line, the text below, the labels and the
// dedupe key in a last line.
func slackText(d Delivery) string {
	n := d.Notification
	var b strings.Builder
	b.WriteString("*[" + strings.ToUpper(n.Severity) + "]")
	if n.Title != "" {
		b.WriteString(" " + slackEscape(n.Title))
	}
	b.WriteString("*")
	if n.Text != "" {
		b.WriteString("\n" + slackEscape(n.Text))
	}
	b.WriteString("\n_")
	if len(n.Labels) > 0 {
		b.WriteString(slackEscape(labelString(n.Labels)) + " · ")
	}
	b.WriteString("key " + slackEscape(n.DedupeKey) + "_")
	return b.String()
}

// slackEscape escapes the three characters Slack's mrkdwn reserves.
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// labelString renders labels as "k=v, k=v" in key order.
func labelString(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + labels[k]
	}
	return strings.Join(parts, ", ")
}

// Send implements Sink. Slack answers 200 "ok"; anything else carries an
// error word (invalid_payload, no_service, channel_is_archived) that becomes
// the SinkError's answer.
func (s *slackSink) Send(ctx context.Context, d Delivery) error {
	body, err := json.Marshal(slackMessage{Text: slackText(d)})
	if err != nil {
		return &SinkError{Sink: s.cfg.Name, Answer: "encode payload: " + err.Error(), Permanent: true}
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	return httpRequest{sink: s.cfg.Name, client: s.cfg.Client, url: s.cfg.URL, header: h, body: body}.do(ctx)
}
