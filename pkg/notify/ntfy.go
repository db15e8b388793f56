package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/failbus/failbus/pkg/events"
)

// NtfyConfig configures an ntfy sink (https://ntfy.sh or a self-hosted
// server).
type NtfyConfig struct {
	// Name is the sink's name. Required.
	Name string
	// URL is the server's base URL (https://ntfy.sh) or the topic URL
	// (https://ntfy.sh/mytopic). Required.
	URL string
	// Topic is the topic to publish to. Defaults to the last path segment
	// of URL; when it equals that segment, the segment is the topic, not
	// part of the server's address.
	Topic string
	// Token, when set, is sent as "Authorization: Bearer <token>" (an ntfy
	// access token), from the environment variable the policy names.
	Token string
	// Client sends the requests. Defaults to a shared client.
	Client *http.Client
}

// ntfySink is the sink NewNtfy returns.
type ntfySink struct {
	cfg  NtfyConfig
	base string // server root the JSON is POSTed to
}

// NewNtfy checks cfg and returns the sink.
//
// The ntfy sink publishes each notification to an ntfy topic, as JSON so titles and
// texts in any script arrive intact. ntfy does not deduplicate, so the sink is
// not Idempotent.
func NewNtfy(cfg NtfyConfig) (Sink, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("ntfy sink: name is required")
	}
	if err := requireURL("ntfy", cfg.Name, cfg.URL); err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("ntfy sink %q: url: %w", cfg.Name, err)
	}
	// JSON is published to the server root: take the topic off the URL.
	path := strings.TrimRight(u.Path, "/")
	i := strings.LastIndexByte(path, '/')
	last := path[i+1:]
	switch {
	case cfg.Topic == "" && last == "":
		return nil, fmt.Errorf("ntfy sink %q: no topic: set topic or end the url with it", cfg.Name)
	case cfg.Topic == "":
		cfg.Topic, path = last, path[:max(i, 0)]
	case last == cfg.Topic:
		path = path[:max(i, 0)]
	}
	u.Path = path + "/"
	u.RawQuery = ""
	return &ntfySink{cfg: cfg, base: u.String()}, nil
}

// Name implements Sink.
func (s *ntfySink) Name() string { return s.cfg.Name }

// ntfyMessage is the JSON publish body (https://docs.ntfy.sh/publish/#publish-as-json).
type ntfyMessage struct {
	Topic    string   `json:"topic"`
	Title    string   `json:"title,omitempty"`
	Message  string   `json:"message"`
	Priority int      `json:"priority"`
	Tags     []string `json:"tags,omitempty"`
}

// ntfyPriority maps a failbus severity to ntfy's 1–5 scale: critical is 5
// (urgent), normal 3 (default), info 2 (low).
func ntfyPriority(severity string) int {
	switch severity {
	case events.SeverityCritical:
		return 5
	case events.SeverityInfo:
		return 2
	}
	return 3
}

// Send implements Sink.
func (s *ntfySink) Send(ctx context.Context, d Delivery) error {
	n := d.Notification
	msg := n.Text
	if len(n.Labels) > 0 {
		msg += "\n" + labelString(n.Labels)
	}
	if strings.TrimSpace(msg) == "" {
		msg = n.DedupeKey
	}
	tags := []string{n.Severity}
	if n.Severity == events.SeverityCritical {
		tags = append(tags, "rotating_light")
	}
	body, err := json.Marshal(ntfyMessage{Topic: s.cfg.Topic, Title: n.Title, Message: msg, Priority: ntfyPriority(n.Severity), Tags: tags})
	if err != nil {
		return &SinkError{Sink: s.cfg.Name, Answer: "encode payload: " + err.Error(), Permanent: true}
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	if s.cfg.Token != "" {
		h.Set("Authorization", "Bearer "+s.cfg.Token)
	}
	return httpRequest{sink: s.cfg.Name, client: s.cfg.Client, url: s.base, header: h, body: body}.do(ctx)
}
