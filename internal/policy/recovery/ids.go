package recovery

import (
	"strconv"
	"strings"
	"time"
)

// Every command recovery sends has an id derived from what it is about,
// never from when it is sent: it is the command's Nats-Msg-Id and its
// ledger key (rule 6 of the package doc).

// RunID is the recovery_id of the run after an outage of provider that
// started at outageStart: "<provider>:<outage start, epoch ms>"
// (CONTRACT.md).
func RunID(provider string, outageStart time.Time) string {
	return provider + ":" + strconv.FormatInt(outageStart.UnixMilli(), 10)
}

// msgID builds a command id from its parts: printable, ':'-separated.
func msgID(parts ...string) string {
	s := strings.Join(parts, ":")
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '_'
		}
		return r
	}, s)
}

// DispatchID is the Nats-Msg-Id (and ledger id) of dispatch attempt n of a
// task: one per (task id, attempt), whoever sends it.
func DispatchID(taskID string, attempt int) string {
	return msgID("recovery", "dispatch", taskID, strconv.Itoa(attempt))
}

// CronRerunID is the id of the one re-run of (agent, cron, scheduled_at).
func CronRerunID(agent, cron string, scheduled time.Time) string {
	return msgID("recovery", "cron", agent, cron, strconv.FormatInt(scheduled.UnixMilli(), 10))
}

// KillID is the id of the one kill of a subagent that stopped beating at
// lastHeartbeat: whichever recovery finds it stale first sends it.
func KillID(agent, subagent string, lastHeartbeat time.Time) string {
	return msgID("recovery", "kill", agent, subagent, strconv.FormatInt(lastHeartbeat.UnixMilli(), 10))
}

// WriteCheckID is the id of the one check of a write that failed at
// failedAt.
func WriteCheckID(agent, key string, failedAt time.Time) string {
	return msgID("recovery", "write", agent, key, strconv.FormatInt(failedAt.UnixMilli(), 10))
}

// NotificationKey is the dedupe key of a run's notification.
func NotificationKey(provider string, outageStart time.Time) string {
	return "recovery:" + provider + ":" + strconv.FormatInt(outageStart.UnixMilli(), 10)
}
