package events

import (
	"strconv"
	"strings"
)

// Subject prefixes. Subjects are built here and nowhere else, so a name is
// changed (never, they are a contract) in one place.
const (
	Prefix           = "failbus"
	OutcomePrefix    = Prefix + ".outcome"
	SegmentPrefix    = Prefix + ".segment"
	ClassifiedPrefix = Prefix + ".classified"
	HealthPrefix     = Prefix + ".health"
	DecisionPrefix   = Prefix + ".decision"
	RetryPrefix      = Prefix + ".retry"
	NotifyPrefix     = Prefix + ".notify"
	ControlPrefix    = Prefix + ".control"
	TaskPrefix       = Prefix + ".task"
	HeartbeatPrefix  = Prefix + ".heartbeat"
	CronSpecPrefix   = Prefix + ".cron.spec"
	CronRunPrefix    = Prefix + ".cron.run"
	WritePrefix      = Prefix + ".write"
	DispatchPrefix   = Prefix + ".dispatch"
	RecoveryPrefix   = Prefix + ".recovery"
	DLQPrefix        = Prefix + ".dlq"
	AuditPrefix      = Prefix + ".audit"
)

// Token makes s safe as one subject token: every character outside
// A-Za-z0-9_- becomes '_' (CONTRACT.md); an empty name becomes "_". The
// payload keeps the real name.
func Token(s string) string {
	if s == "" {
		return "_"
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r < 0x80 && tokenByte(byte(r)) {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

func join(prefix string, tokens ...string) string {
	var b strings.Builder
	n := len(prefix)
	for _, t := range tokens {
		n += 1 + max(len(t), 1) // Token's result is never longer
	}
	b.Grow(n)
	b.WriteString(prefix)
	for _, t := range tokens {
		b.WriteByte('.')
		b.WriteString(Token(t))
	}
	return b.String()
}

// OutcomeSubject is where an agent publishes the outcome of one LLM call.
func OutcomeSubject(provider, agent string) string { return join(OutcomePrefix, provider, agent) }

// SegmentSubject is where an agent reports a context-segment boundary.
func SegmentSubject(agent string) string { return join(SegmentPrefix, agent) }

// ClassifiedSubject carries one classification, filterable by provider and
// class.
func ClassifiedSubject(provider, class string) string {
	return join(ClassifiedPrefix, provider, class)
}

// HealthSubject carries a provider's health changes.
func HealthSubject(provider string) string { return join(HealthPrefix, provider) }

// DecisionSubject carries what one agent should do now.
func DecisionSubject(agent string) string { return join(DecisionPrefix, agent) }

// RetryDueSubject is where JetStream's scheduler writes an agent's retries as
// they come due.
func RetryDueSubject(agent string) string { return join(RetryPrefix+".due", agent) }

// RetryScheduleSubject holds the one pending schedule of a retry: publishing
// replaces it, purging it cancels the retry.
func RetryScheduleSubject(agent, retryID string) string {
	return join(RetryPrefix+".sched", agent, retryID)
}

// RetryLedgerSubject holds the retry records of one budget (turn, step,
// provider, policy key), read back with "last message per subject" so a
// crash neither refunds nor overspends it.
func RetryLedgerSubject(budgetKey string) string { return join(RetryPrefix+".ledger", budgetKey) }

// RetryStartedSubject is where an agent reports it started a due retry.
func RetryStartedSubject(agent string) string { return join(RetryPrefix+".started", agent) }

// RetryCancelSubject is where an agent cancels a pending retry.
func RetryCancelSubject(agent string) string { return join(RetryPrefix+".cancel", agent) }

// NotifySubject carries notification requests of one severity.
func NotifySubject(severity string) string { return join(NotifyPrefix, severity) }

// ControlSubject carries recovery commands for one agent.
func ControlSubject(agent string) string { return join(ControlPrefix, agent) }

// HeartbeatSubject is where an agent reports its subagents' heartbeats.
func HeartbeatSubject(agent string) string { return join(HeartbeatPrefix, agent) }

// CronSpecSubject is where an agent declares its crons' schedules.
func CronSpecSubject(agent string) string { return join(CronSpecPrefix, agent) }

// CronRunSubject is where an agent reports its crons' runs.
func CronRunSubject(agent string) string { return join(CronRunPrefix, agent) }

// WriteSubject is where an agent reports its memory writes.
func WriteSubject(agent string) string { return join(WritePrefix, agent) }

// TaskSubject is where an agent submits a task for a provider: held in
// FAILBUS_TASKS while the provider is down. An empty provider becomes "_".
func TaskSubject(provider, agent string) string { return join(TaskPrefix, provider, agent) }

// DispatchSubject carries the tasks released to one agent.
func DispatchSubject(agent string) string { return join(DispatchPrefix, agent) }

// RecoverySubject carries the checklist's step records for one provider.
func RecoverySubject(provider string) string { return join(RecoveryPrefix, provider) }

// DLQSubject is the dead-letter subject of one service.
func DLQSubject(service string) string { return join(DLQPrefix, service) }

// AuditSubject carries one service's audit records (e.g. notifier decisions).
func AuditSubject(service, kind string) string { return join(AuditPrefix, service, kind) }

// SegmentKey is the context-segment key `<session>#<segment>`.
func SegmentKey(session string, segment int) string {
	return session + "#" + strconv.Itoa(segment)
}

// SubjectWithin reports whether every subject matching filter (which may
// hold wildcards) also matches pattern: whether a consumer filter lies inside
// a stream's subjects, or one tail filter inside another.
func SubjectWithin(filter, pattern string) bool {
	f, p := strings.Split(filter, "."), strings.Split(pattern, ".")
	for i, pt := range p {
		if pt == ">" {
			return len(f) > i
		}
		if i >= len(f) {
			return false
		}
		switch {
		case f[i] == ">":
			return false
		case pt == "*":
		case f[i] != pt:
			return false
		}
	}
	return len(f) == len(p)
}

// SubjectsCollide reports whether some subject matches both a and b (either
// may hold wildcards): whether a stream holds anything a filter asks for.
func SubjectsCollide(a, b string) bool {
	x, y := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(x) && i < len(y); i++ {
		if x[i] == ">" || y[i] == ">" {
			return true
		}
		if x[i] != y[i] && x[i] != "*" && y[i] != "*" {
			return false
		}
	}
	return len(x) == len(y)
}
