package notification_test

import (
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/pkg/events"
)

func TestCheckSubject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		subject, severity string
		want              string // "" = accepted; else a substring of the error
	}{
		{"failbus.notify.critical", events.SeverityCritical, ""},
		{"failbus.notify.info", events.SeverityInfo, ""},
		{"failbus.notify.normal", events.SeverityNormal, ""},
		{"failbus.notify.critical", events.SeverityInfo, `subject failbus.notify.critical says critical, the payload says "info"`},
		{"failbus.notify.info", events.SeverityCritical, "publish a critical request on failbus.notify.critical"},
		{"failbus.notify.urgent", events.SeverityCritical, `names severity "urgent"`},
		{"failbus.notify.critical.extra", events.SeverityCritical, "is not failbus.notify.<severity>"},
		{"failbus.decision.a", events.SeverityCritical, "is not failbus.notify.<severity>"},
	}
	for _, tt := range tests {
		err := notification.CheckSubject(tt.subject, events.Notification{DedupeKey: "k", Severity: tt.severity})
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s with %s: %v, want accepted", tt.subject, tt.severity, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s with %s: %v, want an error with %q", tt.subject, tt.severity, err, tt.want)
		}
	}
}
