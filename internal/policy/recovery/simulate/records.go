package simulate

import (
	"fmt"

	"github.com/failbus/failbus/internal/policy/recovery"
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
// returns it as a recovery.Input with its `at` (zero when absent). The record is
// not validated here: recovery.Core.Step does, naming the field.
func ParseRecord(typ string, data []byte) (recovery.Input, events.Time, error) {
	var in recovery.Input
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
