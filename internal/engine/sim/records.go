package sim

// The records of `failbus simulate` (CONTRACT.md "failbus simulate"): input
// lines parsed into Input, outputs written as one flat JSON object each.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/simulate"
	"github.com/failbus/failbus/pkg/events"
)

// Input record types (CONTRACT.md). A line without a type is an outcome, so
// a raw outcome log (e.g. from `failbus tail`) replays as is.
const (
	InputOutcome  = "outcome"
	InputBoundary = "boundary"
	InputRoute    = "route"
	InputTick     = "tick"
	InputSync     = "sync"
)

// Output record types (CONTRACT.md).
const (
	OutputClassification = "classification"
	OutputDecision       = "decision"
	OutputRetryDue       = "retry_due"
	OutputRoute          = "route"
	OutputNotification   = "notification"
	OutputHealth         = "health"
	OutputError          = "error"
	OutputSync           = "sync"
	// Recovery's outputs (CONTRACT.md § "Recovery"): simulate.OutputDispatch,
	// OutputControl, OutputRecovery.
	OutputDispatch = simulate.OutputDispatch
	OutputControl  = simulate.OutputControl
	OutputRecovery = simulate.OutputRecovery
)

// Input is one parsed input record. Exactly the field of its Type is set
// (none for tick; SyncID for sync).
type Input struct {
	Type string
	// Line is the 1-based input line number, echoed in error records.
	Line int
	// At is the record's time (tick, and a copy of the others' `at`).
	At       events.Time
	Outcome  *events.Outcome
	Boundary *events.Boundary
	Route    *events.RouteRequest
	// Recovery is a recovery input (heartbeat, cron_spec, cron_run, write,
	// task; simulate.InputTypes).
	Recovery *recovery.Input
	// SyncID is the sync record's id, echoed verbatim.
	SyncID json.RawMessage
}

// DueRecord is a retry that came due (`retry_due`); At is its due time.
type DueRecord struct {
	RetryID   string      `json:"retry_id"`
	OutcomeID string      `json:"outcome_id"`
	Agent     string      `json:"agent"`
	Retry     int         `json:"retry"`
	At        events.Time `json:"at"`
}

// ErrorRecord reports an input line that could not be used; processing goes
// on.
type ErrorRecord struct {
	Line  int    `json:"line"`
	Error string `json:"error"`
}

// Output is one output record. Exactly the field of its Type is set.
type Output struct {
	Type           string
	Classification *events.Classification
	Decision       *events.Decision
	RetryDue       *DueRecord
	Route          *events.RouteRecord
	Notification   *events.Notification
	Health         *events.Health
	Error          *ErrorRecord
	// Recovery is a dispatch, control or recovery record.
	Recovery *simulate.Output
	// SyncID echoes the sync input's id.
	SyncID json.RawMessage
}

// MarshalJSON writes the record as one flat JSON object whose first key is
// "type".
func (o Output) MarshalJSON() ([]byte, error) {
	var payload any
	switch o.Type {
	case OutputDispatch, OutputControl, OutputRecovery:
		if o.Recovery == nil || o.Recovery.Type != o.Type {
			return nil, fmt.Errorf("output %s: missing", o.Type)
		}
		return o.Recovery.MarshalJSON()
	case OutputClassification:
		payload = o.Classification
	case OutputDecision:
		payload = o.Decision
	case OutputRetryDue:
		payload = o.RetryDue
	case OutputRoute:
		payload = o.Route
	case OutputNotification:
		payload = o.Notification
	case OutputHealth:
		payload = o.Health
	case OutputError:
		payload = o.Error
	case OutputSync:
		id := o.SyncID
		if len(id) == 0 {
			id = json.RawMessage("null")
		}
		payload = struct {
			ID json.RawMessage `json:"id"`
		}{id}
	default:
		return nil, fmt.Errorf("output: unknown type %q", o.Type)
	}
	body, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("output %s: %w", o.Type, err)
	}
	typ, _ := json.Marshal(o.Type)
	out := make([]byte, 0, len(body)+len(typ)+10)
	out = append(out, `{"type":`...)
	out = append(out, typ...)
	if len(body) > 2 && body[0] == '{' {
		out = append(out, ',')
		out = append(out, body[1:]...)
		return out, nil
	}
	if string(body) == "{}" || string(body) == "null" {
		return append(out, '}'), nil
	}
	return nil, fmt.Errorf("output %s: payload is not an object", o.Type)
}

// ErrorOutput builds the error record for input line `line`.
func ErrorOutput(line int, err error) Output {
	return Output{Type: OutputError, Error: &ErrorRecord{Line: line, Error: err.Error()}}
}

// ParseInput reads one JSON Lines record. lineNo is kept in Input.Line.
//
// An outcome, the record a replay is made of, is decoded in one pass
// (outcomeLine); anything else — another type, or an outcome line that
// does not decode — is read as before: the type first, then the record,
// so every error names what it did. A shadow replay of 100k outcomes
// spent ~9% of its CPU parsing each line twice.
func ParseInput(data []byte, lineNo int) (Input, error) {
	if mayBeOutcome(data) {
		line := &outcomeLine{}
		if json.Unmarshal(data, line) == nil && (line.Type == nil || *line.Type == InputOutcome) {
			return Input{Line: lineNo, Type: InputOutcome, Outcome: &line.Outcome, At: line.Outcome.At}, nil
		}
	}
	return parseInput(data, lineNo)
}

// outcomeLine is an outcome record with its optional type beside the
// outcome's fields. events.Outcome has no field named "type"
// (TestParseInputReadsOutcomesInOnePass), so it decodes exactly as
// ParseInput's two passes do.
type outcomeLine struct {
	Type *string `json:"type"`
	events.Outcome
}

// mayBeOutcome is false for a line that names another type in the usual
// spelling, which would only be decoded twice.
func mayBeOutcome(data []byte) bool {
	return !bytes.Contains(data, []byte(`"type":"`)) || bytes.Contains(data, []byte(`"type":"outcome"`))
}

// parseInput reads the type, then the record of that type.
func parseInput(data []byte, lineNo int) (Input, error) {
	in := Input{Line: lineNo}
	var head struct {
		Type *string `json:"type"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return in, fmt.Errorf("not a JSON object: %w", err)
	}
	if head.Type != nil {
		in.Type = *head.Type
	} else {
		in.Type = InputOutcome
	}
	switch in.Type {
	case InputOutcome:
		o := &events.Outcome{}
		if err := events.UnmarshalJSON(data, o); err != nil {
			return in, fmt.Errorf("outcome: %w", err)
		}
		in.Outcome, in.At = o, o.At
	case InputBoundary:
		b := &events.Boundary{}
		if err := events.UnmarshalJSON(data, b); err != nil {
			return in, fmt.Errorf("boundary: %w", err)
		}
		in.Boundary, in.At = b, b.At
	case InputRoute:
		r := &events.RouteRequest{}
		if err := json.Unmarshal(data, r); err != nil {
			return in, fmt.Errorf("route: %w", err)
		}
		in.Route, in.At = r, r.At
	case InputTick:
		var t struct {
			At events.Time `json:"at"`
		}
		if err := json.Unmarshal(data, &t); err != nil {
			return in, fmt.Errorf("tick: %w", err)
		}
		if t.At.IsZero() {
			return in, errors.New(`tick: "at" is required`)
		}
		in.At = t.At
	case InputSync:
		var s struct {
			ID json.RawMessage `json:"id"`
		}
		if err := json.Unmarshal(data, &s); err != nil {
			return in, fmt.Errorf("sync: %w", err)
		}
		in.SyncID = s.ID
	default:
		if !simulate.IsInputType(in.Type) {
			return in, fmt.Errorf("unknown type %q (want %s)", in.Type, inputTypeWords)
		}
		r, at, err := simulate.ParseRecord(in.Type, data)
		if err != nil {
			return in, err
		}
		in.Recovery, in.At = &r, at
	}
	return in, nil
}

// inputTypeWords names every input type, for the error of an unknown one.
var inputTypeWords = "outcome, boundary, route, tick, sync, " + strings.Join(simulate.InputTypes, ", ")
