package consumer

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/jspub"
	"github.com/failbus/failbus/internal/msgid"
	"github.com/failbus/failbus/pkg/events"
)

// Msg is one input message as a handler sees it: its bytes and headers,
// where it is stored, and how often it has been delivered.
type Msg struct {
	// Subject the message was published to.
	Subject string
	// Header as published. Handlers must not modify it.
	Header nats.Header
	// Data is the payload as published. Handlers must not modify it.
	Data []byte
	// Stream and Seq say where the message is stored.
	Stream string
	Seq    uint64
	// Delivered counts deliveries of this message to the consumer,
	// starting at 1; above 1 it is a redelivery.
	Delivered int
	// Last is true on the last delivery on which the handler runs (Delivered
	// equals the runner's MaxDeliver): an error or Retry now dead-letters the
	// message instead of redelivering it. A handler with side effects of its
	// own (a notifier's send) can use it to record its final answer.
	Last bool
	// Timestamp is when the stream stored the message.
	Timestamp time.Time
	// Value is the decoded message: set by Config.Decode, or by ValueAs
	// (in a Key or the handler), else nil.
	Value events.Message

	raw jetstream.Msg
	// id is the payload's own identity (events.PayloadID), when it has one.
	id string
}

func newMsg(raw jetstream.Msg) (*Msg, error) {
	md, err := raw.Metadata()
	if err != nil {
		return nil, fmt.Errorf("read JetStream metadata: %w", err)
	}
	return &Msg{
		Subject:   raw.Subject(),
		Header:    raw.Headers(),
		Data:      raw.Data(),
		Stream:    md.Stream,
		Seq:       md.Sequence.Stream,
		Delivered: int(md.NumDelivered),
		Timestamp: md.Timestamp,
		raw:       raw,
		id:        events.PayloadID(raw.Subject(), raw.Headers(), raw.Data()),
	}, nil
}

// ID is the input's identity, from which the ids of its outputs derive: the
// payload's own id for a type identified by one (an Outcome's `id`,
// whatever Nats-Msg-Id header the publisher set or left out, so the same
// outcome published twice yields outputs with the same ids), else its
// Nats-Msg-Id header, else "<stream>:<seq>".
func (m *Msg) ID() string {
	if m.id != "" {
		return m.id
	}
	if id := m.Header.Get(events.HeaderMsgID); id != "" {
		return id
	}
	return msgid.StreamSeq(m.Stream, m.Seq)
}

// ValueAs is m's payload as a T: Msg.Value when it already holds one
// (Config.Decode, or a Key that decoded the message to find its key),
// else decoded now with events.DecodeAs and kept in Value, so a message is
// decoded once however many of the runner's callbacks need it.
func ValueAs[T events.Message](m *Msg) (T, error) {
	if v, ok := m.Value.(T); ok {
		return v, nil
	}
	v, err := events.DecodeAs[T](m.Subject, m.Header, m.Data)
	if err != nil {
		return v, err
	}
	m.Value = v
	return v, nil
}

// InProgress tells the server the message is still being worked on, which
// restarts its AckWait. Heartbeat calls it periodically; a handler may call
// it itself between long steps.
func (m *Msg) InProgress() error {
	if m.raw == nil {
		return fmt.Errorf("message %s has no JetStream delivery", m.ID())
	}
	if err := m.raw.InProgress(); err != nil {
		return fmt.Errorf("mark %s in progress: %w", m.ID(), err)
	}
	return nil
}

// Outputs collects what a handler wants published. The runner publishes
// them only when the handler returns nil, and acknowledges the input only
// after JetStream has stored every one. It is not safe for concurrent use
// by several goroutines of one handler.
type Outputs struct {
	service string
	inputID string
	outs    []output
	err     error
	stored  []func(fresh bool)
	after   []func(ctx context.Context) error
	// trace is the input's trace context, added to every output
	// (middleware_trace.go); nil when it has none.
	trace nats.Header
}

type output struct {
	key     string
	subject string
	msgID   string
	data    []byte
	header  nats.Header
}

// Publish adds v, encoded with events.Encode, to be published to subject
// with Nats-Msg-Id "<service>:<input id>:<key>". key names the output
// among the input's outputs and must be unique among them; empty selects the
// output's index ("0", "1", ...), which is stable as long as the handler
// publishes in a deterministic order. A v that does not validate, or a
// repeated key, makes the runner dead-letter the input instead of
// publishing anything: it is a bug no retry fixes.
func (o *Outputs) Publish(subject string, v events.Message, key string) {
	if o.err != nil {
		return
	}
	if key == "" {
		key = strconv.Itoa(len(o.outs))
	}
	if o.hasKey(key) {
		o.err = fmt.Errorf("output key %q used twice", key)
		return
	}
	id := msgid.Output(o.service, o.inputID, key)
	msg, err := jspub.NewMsg(subject, v, id, o.trace)
	if err != nil {
		o.err = fmt.Errorf("output %s to %s: %w", key, subject, err)
		return
	}
	o.outs = append(o.outs, output{key: key, subject: subject, msgID: id, data: msg.Data, header: msg.Header})
}

// hasKey reports whether an output already has key: a scan, since an
// input has a few outputs (one or two in failbus's services), and a map
// per input would cost more than it saves.
func (o *Outputs) hasKey(key string) bool {
	for _, out := range o.outs {
		if out.key == key {
			return true
		}
	}
	return false
}

// OnStored has fn called once every output is stored, before the input
// is acknowledged: what is counted there (a metric of decisions made) is
// counted for outputs that exist, not for outputs that may yet fail and be
// published again on a redelivery. fresh is false when every output was a
// duplicate, i.e. an earlier delivery of the input had stored them
// already (summed over replicas, fresh stores count each output once; a
// store whose acknowledgement was lost is counted by no delivery). fn is
// not called when storing fails, when the input is dead-lettered, or when
// the handler published nothing. It runs on the runner's settling
// goroutine, outside the handler's middleware: it must be quick; a panic
// in it is recovered and logged, and the input is acknowledged anyway.
func (o *Outputs) OnStored(fn func(fresh bool)) {
	o.stored = append(o.stored, fn)
}

// After has the input acknowledged only once wait returns nil, after
// every output is stored: for a handler that hands part of its work to a
// write shared with other inputs (the scheduler folds a provider's
// successes into one fault-scope write) and need not hold its worker
// until that write lands. The input stays unacknowledged meanwhile, so a
// process that dies first has it redelivered, and the work must be
// idempotent. wait runs on the runner's settling goroutine, in the
// inputs' order, with a context that ends SettleTimeout after the
// handler returned: it must return once the shared write is done or ctx
// ends. An error from it is handled as a failed output: the input is
// redelivered after the backoff, or dead-lettered on its last delivery.
// Nothing waits when the handler returns an error.
func (o *Outputs) After(wait func(ctx context.Context) error) {
	o.after = append(o.after, wait)
}

// Len is the number of outputs collected so far.
func (o *Outputs) Len() int { return len(o.outs) }
