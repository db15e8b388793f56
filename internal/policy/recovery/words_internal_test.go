package recovery

import (
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// TestTheChecklistNotificationCountsInWords: one of a thing is singular
// ("1 task re-dispatched", not "1 tasks"), any other number plural.
func TestTheChecklistNotificationCountsInWords(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 5, 4, 3, 0, 0, 0, time.UTC)
	e := &Episode{RecoveryID: "openai:1", OutageStartedAt: events.At(start), RecoveredAt: events.At(start.Add(time.Hour)),
		Counts: Counts{Subagents: 1, Killed: 1, CronsRerun: 1, Writes: 1, Redispatched: 1, Released: 1}}
	text := (&Core{}).notification("openai", e, start.Add(time.Hour)).Notification.Text
	for _, want := range []string{"1 running subagent found", "1 missed cron run re-run", "1 failed write to check", "1 task re-dispatched", "1 held task released"} {
		if !strings.Contains(text, want) {
			t.Errorf("%q does not say %q", text, want)
		}
	}
	e.Counts = Counts{Subagents: 2, Redispatched: 0, Released: 200}
	text = (&Core{}).notification("openai", e, start.Add(time.Hour)).Notification.Text
	for _, want := range []string{"2 running subagents found", "0 tasks re-dispatched", "200 held tasks released"} {
		if !strings.Contains(text, want) {
			t.Errorf("%q does not say %q", text, want)
		}
	}
}
