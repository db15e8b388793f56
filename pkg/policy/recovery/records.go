package recovery

import (
	"fmt"

	"github.com/failbus/failbus/pkg/events"
)

// Input record types of `failbus simulate` (CONTRACT.md § "Recovery"): the
// records' own fields plus "type".
const (
	InputHeartbeat = "heartbeat"
	InputCronSpec  = "cron_spec"
	InputCronRun   = "cron_run"
	InputWrite     = "write"
	InputTask      = "task"
)

// InputTypes lists them, for error messages that name what is accepted.
var InputTypes = []string{InputHeartbeat, InputCronSpec, InputCronRun, InputWrite, InputTask}

// IsInputType reports whether typ is one of recovery's input types.
func IsInputType(typ string) bool {
	switch typ {
	case InputHeartbeat, InputCronSpec, InputCronRun, InputWrite, InputTask:
		return true
	}
	return false
}

// ParseRecord reads one JSON Lines record of a recovery input type and
// returns it as an Input with its `at` (zero when absent). The record is
// not validated here: Core.Step does, naming the field.
func ParseRecord(typ string, data []byte) (Input, events.Time, error) {
	var in Input
	var m events.Message
	switch typ {
	case InputHeartbeat:
		in.Heartbeat = &events.Heartbeat{}
		m = in.Heartbeat
	case InputCronSpec:
		in.CronSpec = &events.CronSpec{}
		m = in.CronSpec
	case InputCronRun:
		in.CronRun = &events.CronRun{}
		m = in.CronRun
	case InputWrite:
		in.Write = &events.Write{}
		m = in.Write
	case InputTask:
		in.Task = &events.Task{}
		m = in.Task
	default:
		return in, events.Time{}, fmt.Errorf("unknown recovery record type %q", typ)
	}
	if err := events.UnmarshalJSON(data, m); err != nil {
		return in, events.Time{}, fmt.Errorf("%s: %w", typ, err)
	}
	return in, in.At(), nil
}

// At is the input's own time (zero when it has none).
func (in Input) At() events.Time {
	switch {
	case in.Health != nil:
		return in.Health.At
	case in.Heartbeat != nil:
		return in.Heartbeat.At
	case in.CronSpec != nil:
		return in.CronSpec.At
	case in.CronRun != nil:
		return in.CronRun.At
	case in.Write != nil:
		return in.Write.At
	case in.Task != nil:
		return in.Task.At
	case in.Decision != nil:
		return in.Decision.At
	}
	return events.Time{}
}
