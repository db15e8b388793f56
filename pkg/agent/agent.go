// Package agent is what a Go agent imports to speak failbus: report the
// outcome of every LLM call, report context-segment boundaries, and receive
// the decisions and due retries the bus sends back.
//
// It is a thin layer over the wire contract (CONTRACT.md "On the bus"), and
// an agent in another language does the same with any NATS client and a
// msgpack library: publish an Outcome as msgpack to
// failbus.outcome.<provider>.<agent> with Nats-Msg-Id set to its id, and read
// failbus.decision.<agent> and failbus.retry.due.<agent> with a JetStream
// consumer.
//
// Why a JetStream consumer and not a plain subscription: due retries are
// written into FAILBUS_RETRIES by JetStream's own message scheduler, which
// does not deliver them to core subscribers (seen with nats-server 2.15.2);
// and a consumer lets an agent that was disconnected, or restarted with
// WithDurable, pick up what it missed.
//
// What is not guaranteed: a decision or due retry is acknowledged when the
// receiving code takes it from the channel. If the process dies after that
// but before acting on it, it is not redelivered. To stop reading cleanly,
// cancel the context given to Decisions or DueRetries and wait for the
// channel to close before closing the connection: by then every message
// received is acknowledged on the server.
package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/internal/retrymark"
	"github.com/failbus/failbus/internal/tracing"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// durableInactiveThreshold is how long the server keeps an agent's durable
// consumers (WithDurable) after the agent last read from them: as long as
// the decision and retry streams keep their messages (7 days), so an agent
// that comes back within that time misses nothing, and an agent that never
// comes back leaves nothing behind for ever.
const durableInactiveThreshold = topology.DefaultMaxAgeDecisions

// durableAckWait is how long the server waits for the hand-off of one
// message to the agent's code before redelivering it (durable mode only).
const durableAckWait = 30 * time.Second

// Agent is one agent instance's connection to failbus. It is safe for
// concurrent use: Report, Boundary, Started and Cancel may be called from
// many goroutines. Decisions and DueRetries should each be called once per
// Agent: every call opens its own consumer, and in durable mode two calls
// would share (split) the same messages.
type Agent struct {
	js      jetstream.JetStream
	name    string
	opts    options
	created time.Time

	mu        sync.Mutex
	subagents map[string]*Subagent // started here and still running

	// router hands decisions, due retries and probes to Calls.
	router router
}

// Option configures an Agent.
type Option func(*options)

type options struct {
	durable bool
	onError func(error)
	now     func() time.Time
}

// WithDurable keeps the agent's read position on the server, in two durable
// consumers named after the agent ("agent-<name>-decisions",
// "agent-<name>-retries"), so decisions and due retries published while the
// process was down are delivered when an Agent with the same name reads
// again. The first time, reading starts at the moment New was called.
// Without it (the default) reading starts at the moment New was called and
// survives reconnects, but not a restart of the process.
func WithDurable() Option { return func(o *options) { o.durable = true } }

// WithErrorHandler receives the errors that happen after Decisions or
// DueRetries returned: a message that does not decode (it is terminated, not
// redelivered, and the error names it) or a consumer that failed. The
// default ignores them.
func WithErrorHandler(fn func(error)) Option { return func(o *options) { o.onError = fn } }

// withClock sets the clock used to fill a missing `at` and to choose where
// reading starts. Defaults to time.Now; tests and replays set their own.
func withClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// New returns an Agent called name (the agent instance id that goes into
// every Outcome's `agent` field and into the subjects it reads) using nc.
// The caller keeps owning nc and closes it after the Agent is done.
func New(nc *nats.Conn, name string, opts ...Option) (*Agent, error) {
	if nc == nil {
		return nil, errors.New("agent: nil NATS connection")
	}
	if name == "" {
		return nil, errors.New("agent: empty name")
	}
	o := options{onError: func(error) {}, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("agent %s: jetstream context: %w", name, err)
	}
	a := &Agent{js: js, name: name, opts: o, created: o.now(), subagents: map[string]*Subagent{}}
	a.router.a = a
	return a, nil
}

// Name is the agent instance id this Agent reports as and reads for.
func (a *Agent) Name() string { return a.name }

// Report publishes the outcome of one LLM call and waits for JetStream to
// store it. It fills what the caller left empty, in o itself: Agent (the
// Agent's name), ID (a new unique id) and At (now). Because the id is
// written back, calling Report again with the same o after an error (a lost
// acknowledgement, say) is safe: the stream recognises the repeated
// Nats-Msg-Id and keeps one copy. A duplicate is therefore not an error.
func (a *Agent) Report(ctx context.Context, o *events.Outcome) error {
	if o == nil {
		return errors.New("agent: report a nil outcome")
	}
	if o.Agent == "" {
		o.Agent = a.name
	}
	if o.ID == "" {
		o.ID = nuid.Next()
	}
	if o.At.IsZero() {
		o.At = events.At(a.opts.now())
	}
	if err := a.publish(ctx, events.OutcomeSubject(o.Provider, o.Agent), o, o.ID); err != nil {
		return fmt.Errorf("agent %s: report outcome %s: %w", a.name, o.ID, err)
	}
	return nil
}

// Boundary reports that a new context segment starts (compaction, fresh
// start, model, tool-surface or prompt change): the only events that take
// refused bytes out of a request, so the refusal tiers start afresh for the
// new segment. Agent and At are filled when empty. One boundary per
// (agent, session, segment) is kept however often it is reported.
func (a *Agent) Boundary(ctx context.Context, b events.Boundary) error {
	if b.Agent == "" {
		b.Agent = a.name
	}
	if b.At.IsZero() {
		b.At = events.At(a.opts.now())
	}
	if err := a.publish(ctx, events.SegmentSubject(b.Agent), &b, msgid.Boundary(b)); err != nil {
		return fmt.Errorf("agent %s: report boundary %s: %w", a.name, events.SegmentKey(b.Session, b.Segment), err)
	}
	return nil
}

// Started tells the scheduler that the agent started the retry retryID
// (after it came due), so the ledger shows the wait really ended. The
// budget was already spent when the retry was recorded, before the wait
// (persist, then wait), so a crash never refunds it.
func (a *Agent) Started(ctx context.Context, retryID string) error {
	return a.retryMark(ctx, events.RetryStartedSubject(a.name), retrymark.SchemaStarted, retryID)
}

// Cancel tells the scheduler that the agent no longer wants the pending
// retry retryID (the user moved on, the turn was aborted): the scheduler
// purges its schedule, so no due message arrives, and no "started" record is
// written. The retry stays counted in its budget: it was recorded before the
// wait, and a refund would let a crash overspend it.
func (a *Agent) Cancel(ctx context.Context, retryID string) error {
	return a.retryMark(ctx, events.RetryCancelSubject(a.name), retrymark.SchemaCancel, retryID)
}

func (a *Agent) retryMark(ctx context.Context, subject, schema, retryID string) error {
	if retryID == "" {
		return fmt.Errorf("agent %s: %s: empty retry id", a.name, schema)
	}
	m := retrymark.Mark{RetryID: retryID, Agent: a.name, At: events.At(a.opts.now())}
	data, err := marshalMark(m)
	if err != nil {
		return fmt.Errorf("agent %s: %s %s: %w", a.name, schema, retryID, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(events.HeaderSchema, schema+"/"+strconv.Itoa(events.CurrentVersion))
	msg.Header.Set(events.HeaderContentType, events.ContentTypeMsgpack)
	msg.Header.Set(events.HeaderMsgID, schema+":"+retryID)
	tracing.Inject(ctx, msg.Header)
	if _, err := a.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("agent %s: %s %s: %w", a.name, schema, retryID, err)
	}
	return nil
}

// publish encodes m with the failbus codec and publishes it with a
// Nats-Msg-Id, waiting for the stream's acknowledgement.
func (a *Agent) publish(ctx context.Context, subject string, m events.Message, msgID string) error {
	data, hdr, err := events.Encode(m)
	if err != nil {
		return err
	}
	hdr.Set(events.HeaderMsgID, msgID)
	ctx, span := sendSpan(ctx, subject, msgID)
	tracing.Inject(ctx, hdr) // the record goes on in ctx's trace (trace.go)
	_, err = a.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: hdr, Data: data})
	tracing.End(span, err, "")
	if err != nil {
		return fmt.Errorf("publish to %s: %w", subject, err)
	}
	return nil
}
