package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Dispatches returns the tasks recovery hands this agent
// (failbus.dispatch.<agent> on FAILBUS_DISPATCH): attempt 1 of a submitted
// task (at once, or after an outage), attempt n+1 when recovery killed the
// subagent that ran attempt n. Delivery is as for Decisions; each
// (task id, attempt) is stored once.
func (a *Agent) Dispatches(ctx context.Context) (<-chan events.Dispatch, error) {
	it, err := a.open(ctx, topology.StreamDispatch, events.DispatchSubject(a.name), "dispatch")
	if err != nil {
		return nil, err
	}
	out := make(chan events.Dispatch)
	go pump(ctx, a, it, out, func(m jetstream.Msg) (events.Dispatch, error) {
		d, err := events.DecodeAs[*events.Dispatch](m.Subject(), m.Headers(), m.Data())
		if err != nil {
			return events.Dispatch{}, err
		}
		return *d, nil
	})
	return out, nil
}

// ControlHandlers are what an agent does with each recovery command. A nil
// handler leaves the default: Kill stops the heartbeats of a subagent
// started with StartSubagent and cancels its Context (cause ErrKilled), or
// does nothing for one this process does not run; the others report
// ErrNoHandler to the error handler.
type ControlHandlers struct {
	// Kill stops subagent c.Subagent (its task c.TaskID is re-dispatched
	// as the next attempt).
	Kill func(ctx context.Context, c events.Control) error
	// RunCron runs cron c.Cron for its scheduled time c.ScheduledAt (then
	// report the run with CronRun).
	RunCron func(ctx context.Context, c events.Control) error
	// CheckWrite checks that write c.Key is in its store, and redoes it if
	// not (then report it with Write).
	CheckWrite func(ctx context.Context, c events.Control) error
	// Probe makes one real call to provider c.Provider and reports its
	// outcome with Report: an outage ends only when calls succeed, and
	// agents holding on wait_provider make none.
	Probe func(ctx context.Context, c events.Control) error
}

// ErrNoHandler reports a control command for which no handler was given.
var ErrNoHandler = errors.New("agent: no handler for control command")

// HandleControls reads this agent's control commands and runs the matching
// handler for each, one at a time, until ctx ends (then it returns nil) or
// the consumer cannot be opened. A handler's error goes to the error
// handler (WithErrorHandler); the command is not redelivered. As with
// HandleDecisions, a command is acknowledged once its handler returned, so
// in durable mode a process that dies inside a handler gets it again.
func (a *Agent) HandleControls(ctx context.Context, h ControlHandlers) error {
	return handle(ctx, a, topology.StreamControl, events.ControlSubject(a.name), "control", decodeValue[events.Control],
		func(ctx context.Context, c events.Control) error {
			var fn func(context.Context, events.Control) error
			switch c.Action {
			case events.ControlKill:
				fn = h.Kill
				if fn == nil {
					fn = a.killLocal
				}
			case events.ControlRunCron:
				fn = h.RunCron
			case events.ControlCheckWrite:
				fn = h.CheckWrite
			case events.ControlProbe:
				fn = h.Probe
			}
			if fn == nil {
				return fmt.Errorf("%w %s (%s)", ErrNoHandler, c.Action, c.Reason)
			}
			return fn(ctx, c)
		})
}

// killLocal is the default Kill: stop a subagent this process runs.
func (a *Agent) killLocal(_ context.Context, c events.Control) error {
	if s := a.Subagent(c.Subagent); s != nil {
		s.halt(ErrKilled)
	}
	return nil
}

// Subagent returns the running subagent called name started by this Agent,
// or nil.
func (a *Agent) Subagent(name string) *Subagent {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.subagents[name]
}
