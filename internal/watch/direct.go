package watch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/streamread"
	"github.com/failbus/failbus/pkg/events"
)

// Reading without a consumer (Config.Direct).
//
// A user who may only read (the operator role) may create no consumer:
// the server cannot tell a consumer of its own from an agent's durable
// by the request's subject, and creating one under an existing durable's
// name retargets it. A direct read pages through the stream with direct
// batch gets instead, one cursor per filter, and merges the cursors in
// stream order: a message is handed on only once every other cursor is
// known to hold nothing before it (it has a later message buffered, or
// was read through a sequence past it).

// DefaultPollInterval is how often a direct read that follows asks for
// messages stored since its last answer.
const DefaultPollInterval = 250 * time.Millisecond

// directPage bounds one page of a direct read: messages and bytes.
const (
	directPage      = 512
	directPageBytes = 1 << 20
)

// serverHeaders are the headers the server adds to a direct get's answer
// after any its publisher set; a message read directly is handed on
// without them, as a consumer would deliver it.
var serverHeaders = []string{
	jetstream.StreamHeader, jetstream.SubjectHeader, jetstream.SequenceHeader, jetstream.TimeStampHeaer,
	"Nats-Num-Pending", "Nats-Last-Sequence", "Nats-UpTo-Sequence",
}

// ErrNoDirect: a direct read of a stream that does not allow direct gets.
var ErrNoDirect = errors.New("watch: the stream does not allow direct gets")

// directRead is a Reader's read with direct gets.
type directRead struct {
	js      jetstream.JetStream
	cfg     Config
	cursors []*cursor
	// last holds the latest message of each subject (Config's
	// DeliverLastPerSubjectPolicy), handed on before the cursors.
	last []*directMsg
	// upto: without Follow, the stream's last sequence at the start; no
	// later message is read.
	upto uint64
	// start is the start time of the cursors' first page, if any.
	start *time.Time
	n     uint64 // messages handed on
}

// cursor is one filter's position in the stream.
type cursor struct {
	filter string
	next   uint64       // the first sequence not asked for yet
	buf    []*directMsg // read, not handed on yet, in stream order
	// through: every matching message up to it is in buf or handed on.
	through uint64
	// idle: the last page left nothing matching at the time the server
	// answered.
	idle    bool
	pending uint64 // matching messages after buf, at the last answer
}

// openDirect prepares a direct read of cfg and reads the first page of
// each filter, so Pending is known.
func openDirect(ctx context.Context, js jetstream.JetStream, cfg Config) (*directRead, uint64, error) {
	st, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s: %w", cfg.Stream, err)
	}
	info := st.CachedInfo()
	if !info.Config.AllowDirect {
		return nil, 0, fmt.Errorf("read %s: %w", cfg.Stream, ErrNoDirect)
	}
	last := info.State.LastSeq
	d := &directRead{js: js, cfg: cfg, upto: last}
	if cfg.Follow {
		d.upto = 0
	}
	filters := cfg.Filters
	if len(filters) == 0 {
		filters = []string{">"}
	}
	for i, f := range filters {
		for _, g := range filters[i+1:] {
			if events.SubjectsCollide(f, g) {
				// Each cursor would hand on the messages both match.
				return nil, 0, fmt.Errorf("read %s: filters %s and %s overlap", cfg.Stream, f, g)
			}
		}
	}
	from := uint64(1)
	switch cfg.DeliverPolicy {
	case jetstream.DeliverAllPolicy:
	case jetstream.DeliverNewPolicy:
		from = last + 1
	case jetstream.DeliverByStartSequencePolicy:
		from = max(cfg.StartSeq, 1)
	case jetstream.DeliverByStartTimePolicy:
		if cfg.StartTime == nil {
			return nil, 0, fmt.Errorf("read %s: a start time is needed", cfg.Stream)
		}
		d.start = cfg.StartTime
	case jetstream.DeliverLastPerSubjectPolicy:
		if err := d.readLast(ctx, filters, last); err != nil {
			return nil, 0, err
		}
		from = last + 1
	default:
		return nil, 0, fmt.Errorf("read %s: deliver policy %s is not read directly", cfg.Stream, cfg.DeliverPolicy)
	}
	for _, f := range filters {
		d.cursors = append(d.cursors, &cursor{filter: f, next: from, through: from - 1})
	}
	pending := uint64(len(d.last))
	if cfg.DeliverPolicy != jetstream.DeliverLastPerSubjectPolicy {
		for _, c := range d.cursors {
			if err := d.fetch(ctx, c, 0); err != nil {
				return nil, 0, err
			}
			pending += uint64(len(c.buf)) + c.pending
		}
	}
	return d, pending, nil
}

// readLast reads the latest message of each subject up to last, in stream
// order; more subjects than one answer carries are found by reading the
// whole stream.
func (d *directRead) readLast(ctx context.Context, filters []string, last uint64) error {
	if last == 0 {
		return nil
	}
	latest := map[string]*directMsg{}
	keep := func(m *nats.Msg) error {
		dm, err := d.wrap(m)
		if err != nil {
			return err
		}
		if o := latest[dm.subject]; o == nil || o.seq < dm.seq {
			latest[dm.subject] = dm
		}
		return nil
	}
	err := streamread.LastPerSubjectUpTo(ctx, d.js, d.cfg.Stream, filters, last, keep)
	if errors.Is(err, streamread.ErrTooManySubjects) {
		clear(latest)
		for _, f := range filters {
			err = streamread.ReadFrom(ctx, d.js, d.cfg.Stream, f, 1, last, int(last), keep)
			if err != nil {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", d.cfg.Stream, err)
	}
	for _, m := range latest {
		d.last = append(d.last, m)
	}
	slices.SortFunc(d.last, func(a, b *directMsg) int { return cmpSeq(a.seq, b.seq) })
	return nil
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// fetch reads c's next page. known is a sequence every message up to
// which was stored before the request went out (the stream's last, read
// just before): an idle answer means c holds everything matching up to
// it.
func (d *directRead) fetch(ctx context.Context, c *cursor, known uint64) error {
	at := d.start
	if c.next > 1 || c.through > 0 {
		at = nil // only the first page starts at a time
	}
	page, err := streamread.ReadPage(ctx, d.js, d.cfg.Stream, c.filter, c.next, at, directPage, directPageBytes, func(m *nats.Msg) error {
		dm, err := d.wrap(m)
		if err != nil {
			return err
		}
		c.buf = append(c.buf, dm)
		return nil
	})
	if err != nil {
		return err
	}
	if page.Answers > 0 {
		c.next = page.LastSeq + 1
		c.through = page.LastSeq
	}
	c.pending, c.idle = page.Pending, page.Pending == 0
	if c.idle {
		// Everything stored before the request matching c was answered:
		// known was read before it, and so was the last sequence at the
		// start of a read that does not follow.
		known = max(known, d.upto)
		c.through = max(c.through, known)
		if at != nil && page.Answers == 0 {
			// Nothing matching since the start time: later pages go on
			// from what was known then.
			c.next = max(c.next, known+1)
		}
	}
	return nil
}

// wrap is a direct get's answer as a jetstream.Msg.
func (d *directRead) wrap(m *nats.Msg) (*directMsg, error) {
	seq, err := strconv.ParseUint(streamread.ServerHeader(m, jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("read %s: an answer without its sequence", d.cfg.Stream)
	}
	at, err := time.Parse(time.RFC3339Nano, streamread.ServerHeader(m, jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("read %s: seq %d without its time: %w", d.cfg.Stream, seq, err)
	}
	pending, _ := strconv.ParseUint(streamread.ServerHeader(m, "Nats-Num-Pending"), 10, 64)
	dm := &directMsg{stream: d.cfg.Stream, subject: streamread.ServerHeader(m, jetstream.SubjectHeader), seq: seq, at: at, pending: pending, data: m.Data}
	dm.header = stripServerHeaders(m.Header)
	return dm, nil
}

// stripServerHeaders is h without the values the server appended.
func stripServerHeaders(h nats.Header) nats.Header {
	out := nats.Header{}
	for k, vs := range h {
		if slices.Contains(serverHeaders, k) {
			vs = vs[:len(vs)-1]
		}
		if len(vs) > 0 {
			out[k] = vs
		}
	}
	return out
}

// run hands every message on to fn in stream order until fn fails (ErrStop
// ends it without an error), ctx ends, or, without Follow, the messages
// up to the stream's last at the start are read.
func (d *directRead) run(ctx context.Context, fn func(jetstream.Msg) error) error {
	for _, m := range d.last {
		if err := d.emit(m, fn); err != nil {
			return err
		}
	}
	d.last = nil
	for ctx.Err() == nil {
		progressed, err := d.drain(fn)
		if err != nil {
			return err
		}
		if d.finished() {
			return nil
		}
		// Refill every cursor that bounds the merge: an empty buffer
		// behind the others' heads.
		head := d.minHead()
		known := uint64(0)
		var refill []*cursor
		for _, c := range d.cursors {
			if len(c.buf) == 0 && (head == 0 || c.through < head) && !d.done(c) {
				refill = append(refill, c)
			}
		}
		idle := len(refill) > 0
		for _, c := range refill {
			idle = idle && c.idle
		}
		if idle && !progressed && d.cfg.Follow {
			if err := sleep(ctx, d.cfg.PollInterval); err != nil {
				return nil
			}
		}
		if len(d.cursors) > 1 {
			if known, err = d.lastSeq(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		for _, c := range refill {
			if err := d.fetch(ctx, c, known); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
	}
	return nil
}

// drain hands on every buffered message no cursor can still precede: the
// lowest buffered one, once every other cursor with nothing buffered has
// been read through its sequence. It reports whether it handed any on.
func (d *directRead) drain(fn func(jetstream.Msg) error) (bool, error) {
	progressed := false
	for {
		var best *cursor
		for _, c := range d.cursors {
			if len(c.buf) > 0 && (best == nil || c.buf[0].seq < best.buf[0].seq) {
				best = c
			}
		}
		if best == nil {
			return progressed, nil
		}
		m := best.buf[0]
		if d.upto > 0 && m.seq > d.upto {
			// Stored after the start of a read that does not follow.
			best.buf = nil
			best.through = max(best.through, d.upto)
			continue
		}
		for _, c := range d.cursors {
			if c != best && len(c.buf) == 0 && !d.done(c) && c.through < m.seq {
				return progressed, nil // c may still hold an earlier one
			}
		}
		best.buf = best.buf[1:]
		m.pending = 0
		for _, c := range d.cursors {
			m.pending += uint64(len(c.buf)) + c.pending
		}
		if err := d.emit(m, fn); err != nil {
			return progressed, err
		}
		progressed = true
	}
}

// done reports whether c, in a read that does not follow, has been read
// up to the stream's last sequence at the start.
func (d *directRead) done(c *cursor) bool { return d.upto > 0 && c.through >= d.upto }

func (d *directRead) emit(m *directMsg, fn func(jetstream.Msg) error) error {
	d.n++
	m.consumerSeq = d.n
	return fn(m)
}

// finished reports whether a read that does not follow has read up to its
// end.
func (d *directRead) finished() bool {
	if d.cfg.Follow {
		return false
	}
	for _, c := range d.cursors {
		if len(c.buf) > 0 || !d.done(c) && d.upto > 0 {
			return false
		}
	}
	return true
}

// minHead is the lowest sequence buffered, 0 when none is.
func (d *directRead) minHead() uint64 {
	head := uint64(0)
	for _, c := range d.cursors {
		if len(c.buf) > 0 && (head == 0 || c.buf[0].seq < head) {
			head = c.buf[0].seq
		}
	}
	return head
}

// lastSeq is the stream's last sequence now.
func (d *directRead) lastSeq(ctx context.Context) (uint64, error) {
	st, err := d.js.Stream(ctx, d.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", d.cfg.Stream, err)
	}
	return st.CachedInfo().State.LastSeq, nil
}

// sleep waits for d or ctx's end (then its error).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// directMsg is a message read with a direct get, as a jetstream.Msg: its
// subject, headers (without those the server added to the answer) and
// data, and metadata with the stream sequence and store time. Nothing is
// acknowledged: no consumer delivered it.
type directMsg struct {
	stream, subject string
	seq, pending    uint64
	consumerSeq     uint64
	at              time.Time
	header          nats.Header
	data            []byte
}

// errNoAck is every acknowledgement of a directly read message.
var errNoAck = errors.New("watch: a message read with a direct get has no consumer to acknowledge")

func (m *directMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{
		Sequence:     jetstream.SequencePair{Stream: m.seq, Consumer: m.consumerSeq},
		NumDelivered: 1,
		NumPending:   m.pending,
		Timestamp:    m.at,
		Stream:       m.stream,
	}, nil
}
func (m *directMsg) Data() []byte                     { return m.data }
func (m *directMsg) Headers() nats.Header             { return m.header }
func (m *directMsg) Subject() string                  { return m.subject }
func (m *directMsg) Reply() string                    { return "" }
func (m *directMsg) Ack() error                       { return errNoAck }
func (m *directMsg) DoubleAck(context.Context) error  { return errNoAck }
func (m *directMsg) Nak() error                       { return errNoAck }
func (m *directMsg) NakWithDelay(time.Duration) error { return errNoAck }
func (m *directMsg) InProgress() error                { return errNoAck }
func (m *directMsg) Term() error                      { return errNoAck }
func (m *directMsg) TermWithReason(string) error      { return errNoAck }
