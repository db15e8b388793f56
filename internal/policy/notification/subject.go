package notification

import (
	"fmt"
	"strings"

	"github.com/failbus/failbus/pkg/events"
)

// CheckSubject checks a notification request against the subject it came
// on, failbus.notify.<severity>: the subject's severity and the payload's
// must be the same. Neither may silently win: severity decides
// whether the daily budget applies (critical bypasses it) and which sinks
// take the request, and NATS grants publish permissions per subject, so a
// payload saying critical on failbus.notify.info would bypass the budget
// past the permission, and one saying info on failbus.notify.critical
// would be held back when its sender meant to page. A mismatch is a dead
// letter, with this error as its reason.
func CheckSubject(subject string, n events.Notification) error {
	sev, ok := strings.CutPrefix(subject, events.NotifyPrefix+".")
	if !ok || sev == "" || strings.Contains(sev, ".") {
		return fmt.Errorf("subject %s is not %s.<severity>", subject, events.NotifyPrefix)
	}
	switch sev {
	case events.SeverityInfo, events.SeverityNormal, events.SeverityCritical:
	default:
		return fmt.Errorf("subject %s names severity %q, not info, normal or critical", subject, sev)
	}
	if n.Severity != sev {
		return fmt.Errorf("severity mismatch: subject %s says %s, the payload says %q; they must agree (publish a %s request on %s)",
			subject, sev, n.Severity, n.Severity, events.NotifySubject(n.Severity))
	}
	return nil
}
