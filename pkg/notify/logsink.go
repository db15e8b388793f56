package notify

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/failbus/failbus/pkg/events"
)

// logSink is the sink NewLog returns.
type logSink struct {
	name string
	log  zerolog.Logger
}

// NewLog returns a log sink called name writing to log.
//
// The log sink writes each notification as one structured zerolog line: critical at
// error level, normal at warn, info at info. It is the default sink for
// development and demos, where the human reads the terminal. A log line
// cannot be recalled, so the sink is not Idempotent; it never fails.
func NewLog(name string, log zerolog.Logger) (Sink, error) {
	if name == "" {
		return nil, fmt.Errorf("log sink: name is required")
	}
	return &logSink{name: name, log: log}, nil
}

// Name implements Sink.
func (l *logSink) Name() string { return l.name }

// Send implements Sink.
func (l *logSink) Send(ctx context.Context, d Delivery) error {
	if err := ctx.Err(); err != nil {
		return &SinkError{Sink: l.name, Answer: err.Error()}
	}
	n := d.Notification
	var ev *zerolog.Event
	switch n.Severity {
	case events.SeverityCritical:
		ev = l.log.Error()
	case events.SeverityNormal:
		ev = l.log.Warn()
	default:
		ev = l.log.Info()
	}
	ev = ev.Str("sink", l.name).Str("dedupe_key", n.DedupeKey).Str("severity", n.Severity).
		Str("title", n.Title).Str("text", n.Text).Int("attempt", d.Attempt)
	if len(n.Labels) > 0 {
		ev = ev.Fields(map[string]any{"labels": n.Labels})
	}
	ev.Msg("notification")
	return nil
}
