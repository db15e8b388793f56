package streamread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LastReader reads the last message of a subject of one stream, as
// jetstream.Stream's GetLastMsgForSubject does, but folds the reads asked
// for while one is in flight into one direct batch request (JetStream's
// multi_last): a service that reads many subjects' last message at once
// (the scheduler reads a retry budget's ledger for most failures it
// decides) then costs the server one request and one end-of-batch answer
// per batch instead of a request and an answer per subject.
//
// The caller that finds the reader idle sends its read at once, alone (a
// direct get with the subject in the request's subject, as
// GetLastMsgForSubject sends it); reads asked for meanwhile wait for it,
// and the first of them then sends them all, up to maxLastBatch subjects,
// in one multi_last. An idle bus therefore reads as before, one request
// per read, and a busy one in batches that waited no longer than the round
// trip before them. Answers are read by the server's own headers (the
// last Nats-Subject, Nats-Sequence and Nats-Time-Stamp), which a
// publisher's cannot override.
//
// Each answer is what the stream held when the server read it, possibly
// on a replica that lags the leader, like any direct get: callers that
// write after reading (compare-and-set on the subject's last sequence)
// stay as safe as with GetLastMsgForSubject; a reader whose answers
// decide without such a check sets LastReaderOptions.Leader on a
// replicated stream, and then every read is the leader's, one request
// each. On a stream without direct gets every read is
// GetLastMsgForSubject's. A batch that cannot be
// answered (ErrBatchUnavailable: a server before 2.11, a message that
// failed to load, an answer cut short) or that this connection may not
// send (the server drops it without an answer; the connection's last
// error names it) makes each of its reads go alone, and the reader sends
// reads alone for lastReaderBackoff before it tries a batch again. A
// batch unanswered within the connection's API timeout for any other
// reason fails its reads, as an unanswered lone read would. Safe for
// concurrent use.
type LastReader struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	api    string // the direct get subject: $JS.API.DIRECT.GET.<stream>
	direct bool   // the stream allows direct gets
	opts   LastReaderOptions

	mu      sync.Mutex
	queue   []*lastRead
	busy    bool // a read is in flight; queue waits for it
	sub     *nats.Subscription
	inbox   string // the batch answers' inbox, "<inbox>.", + batch number
	answers chan *nats.Msg
	batchN  uint64 // the batch in flight's number
	reply   string // the batch in flight's reply subject: inbox + batchN
	offTill time.Time
	closed  bool

	// hookTake and hookTaken, when set (tests), are called by a leader
	// before it takes the queue and once it has, with the reads taken.
	hookTake  func()
	hookTaken func(n int)
}

// LastReaderOptions are what a LastReader reports to, for metrics. Each
// may be nil.
type LastReaderOptions struct {
	// OnReads is called with how n reads went to the server: ReadBatched,
	// ReadAlone or ReadFallback.
	OnReads func(how string, n int)
	// OnBatch is called for each multi_last request sent.
	OnBatch func()
	// Leader sends every read to the stream's leader (LeaderGet), alone,
	// never to a replica's direct get: for a replicated stream whose
	// reads decide something no compare-and-set checks afterwards, which
	// a replica that lags the leader must not answer (Replicated). Reads
	// are then neither batched nor spread over the replicas.
	Leader bool
}

// How a LastReader's reads went to the server (LastReaderOptions.OnReads).
const (
	ReadBatched  = "batched"  // in a multi_last with other subjects' reads
	ReadAlone    = "alone"    // one request for one subject, no other subject's read waiting
	ReadFallback = "fallback" // alone because a batch read was unavailable
	ReadLeader   = "leader"   // alone, by the stream's leader (LastReaderOptions.Leader)
)

// maxLastBatch bounds the subjects of one batch read of a LastReader,
// below the 1024 answers nats-server sends one batch at most.
const maxLastBatch = 256

// lastReaderBackoff is how long a LastReader reads one subject at a time
// after a batch read was unavailable.
const lastReaderBackoff = time.Minute

// lastRead is one Last call.
type lastRead struct {
	subject string
	lead    chan struct{} // closed: this call leads the next batch
	done    chan struct{} // closed: msg and err are set
	taken   bool          // in a batch (under LastReader.mu)
	leading bool          // handed the lead (under LastReader.mu)
	msg     *jetstream.RawStreamMsg
	err     error
	alone   bool // done without a result: read it alone (fallback)
	once    sync.Once
}

// answer sets q's result and closes done; only the first answer counts.
func (q *lastRead) answer(m *jetstream.RawStreamMsg, err error) {
	q.once.Do(func() {
		q.msg, q.err = m, err
		close(q.done)
	})
}

// fallBack answers q with "read it alone" (a batch was unavailable).
func (q *lastRead) fallBack() {
	q.once.Do(func() {
		q.alone = true
		close(q.done)
	})
}

// NewLastReader returns a LastReader of stream, whose name and direct-get
// setting it takes from the stream's cached info. It does no I/O; Close
// releases its subscription.
func NewLastReader(js jetstream.JetStream, stream jetstream.Stream, opts LastReaderOptions) *LastReader {
	cfg := stream.CachedInfo().Config
	return &LastReader{js: js, stream: stream, name: cfg.Name, direct: cfg.AllowDirect, opts: opts, api: apiPrefix(js.Options()) + "DIRECT.GET." + cfg.Name}
}

// count reports n reads that went how (LastReaderOptions.OnReads).
func (r *LastReader) count(how string, n int) {
	if r.opts.OnReads != nil {
		r.opts.OnReads(how, n)
	}
}

// Close unsubscribes the batch answers' inbox. Reads after Close are
// sent alone.
func (r *LastReader) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
		r.sub = nil
	}
}

// Last returns the last message on subject (a literal subject of the
// stream), or jetstream.ErrMsgNotFound itself when there is none: an
// answer, not a failure (the first failure of every retry budget reads
// nothing), so it is not wrapped with the subject, which formatted the
// sentinel's message on every such read for nobody to print. It returns
// ctx's error as soon as ctx ends, whether its read waits to be sent or
// is in flight (a batch's round trip goes on for the other reads in it,
// bounded by the connection's default API timeout).
func (r *LastReader) Last(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	if subject == "" || strings.ContainsAny(subject, "*> \t\r\n") {
		return nil, fmt.Errorf("read the last of %q in %s: not a literal subject", subject, r.name)
	}
	if r.opts.Leader {
		m, err := LeaderGet(ctx, r.js, r.name, MsgQuery{LastFor: subject})
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
			r.count(ReadLeader, 1)
		}
		return m, err
	}
	q := &lastRead{subject: subject, lead: make(chan struct{}), done: make(chan struct{})}
	r.mu.Lock()
	r.queue = append(r.queue, q)
	if !r.busy {
		r.busy, q.leading = true, true
		close(q.lead)
	}
	r.mu.Unlock()
	select {
	case <-q.lead:
		r.lead(ctx, q)
	case <-q.done:
	case <-ctx.Done():
		r.mu.Lock()
		switch {
		case q.leading:
			r.mu.Unlock()
			r.lead(ctx, q) // handed the lead meanwhile: the others wait on it
		case q.taken:
			r.mu.Unlock()
		default:
			r.queue = slices.DeleteFunc(r.queue, func(o *lastRead) bool { return o == q })
			r.mu.Unlock()
			return nil, ctx.Err()
		}
	}
	select {
	case <-q.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if q.alone {
		r.count(ReadFallback, 1)
		return r.single(ctx, subject)
	}
	return q.msg, q.err
}

// lead is the leader's work: it takes the queue (its own read first). Its
// own read alone it sends in this goroutine, under its own ctx, as
// GetLastMsgForSubject would; a batch goes in the background, so the
// leader waits for it like any read in it.
func (r *LastReader) lead(ctx context.Context, me *lastRead) {
	if r.hookTake != nil {
		r.hookTake()
	}
	r.mu.Lock()
	n := min(len(r.queue), maxLastBatch)
	batch := make([]*lastRead, n)
	copy(batch, r.queue)
	r.queue = append(r.queue[:0], r.queue[n:]...)
	for _, q := range batch {
		q.taken = true
	}
	off := r.closed || !r.direct || time.Now().Before(r.offTill)
	r.mu.Unlock()
	if r.hookTaken != nil {
		r.hookTaken(n)
	}
	if n == 1 && batch[0] == me {
		defer r.handOff(batch)
		m, err := r.single(ctx, me.subject)
		if ctx.Err() == nil {
			r.count(ReadAlone, 1)
		}
		me.answer(m, err)
		return
	}
	// The batch's round trip must not end with this call's context: it
	// has the default API timeout.
	bctx, cancel := withDefaultTimeout(context.WithoutCancel(ctx), r.js)
	go func() {
		defer cancel()
		defer r.handOff(batch)
		defer func() {
			// Off the caller's goroutine, a panic would end the process:
			// the batch's reads fail instead (handOff answers them).
			if p := recover(); p != nil {
				for _, q := range batch {
					q.answer(nil, fmt.Errorf("read the last of %s in %s: the batch read panicked: %v", q.subject, r.name, p))
				}
			}
		}()
		r.run(bctx, batch, off)
	}()
}

// handOff answers any read of batch left unanswered (a panic) and hands
// the lead to the first read queued meanwhile, or leaves the reader idle.
func (r *LastReader) handOff(batch []*lastRead) {
	for _, q := range batch {
		q.answer(nil, fmt.Errorf("read the last of %s in %s: the read was interrupted", q.subject, r.name))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.queue) == 0 {
		r.busy = false
		return
	}
	next := r.queue[0]
	next.leading = true
	close(next.lead)
}

// run reads a batch taken from the queue and answers its reads.
func (r *LastReader) run(ctx context.Context, batch []*lastRead, off bool) {
	bySubject := map[string][]*lastRead{}
	for _, q := range batch {
		bySubject[q.subject] = append(bySubject[q.subject], q)
	}
	switch {
	case off:
		for _, q := range batch {
			q.fallBack()
		}
	case len(bySubject) == 1: // one subject read by several: one request
		r.count(ReadAlone, len(batch))
		m, err := r.single(ctx, batch[0].subject)
		for _, q := range batch {
			q.answer(m, err)
		}
	default:
		r.batch(ctx, bySubject, len(batch))
	}
}

// single reads subject's last message alone: a direct get with the
// subject in the request's own subject (as GetLastMsgForSubject sends it,
// so a role allowed $JS.API.DIRECT.GET.<stream>.> may send it), read by
// the server's headers as batch answers are (directLast, as LastSeq
// reads); on a stream without direct gets, GetLastMsgForSubject (the
// stream's JSON API).
func (r *LastReader) single(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	if !r.direct {
		return r.stream.GetLastMsgForSubject(ctx, subject)
	}
	m, err := directLast(ctx, r.js, r.api+"."+subject, nil)
	if err == nil && m == nil {
		return nil, jetstream.ErrMsgNotFound // itself (Last)
	}
	var raw *jetstream.RawStreamMsg
	if err == nil {
		raw, err = rawFromDirect(m)
	}
	if err != nil {
		return nil, fmt.Errorf("read the last of %s in %s: %w", subject, r.name, err)
	}
	return raw, nil
}

// batch reads the last message of every subject of bySubject (n reads)
// with one multi_last and answers their reads.
func (r *LastReader) batch(ctx context.Context, bySubject map[string][]*lastRead, n int) {
	subjects := make([]string, 0, len(bySubject))
	for s := range bySubject {
		subjects = append(subjects, s)
	}
	if r.denied() {
		// Denied before (the connection's last error says so): no need to
		// wait for another unanswered batch to find out.
		r.fallBackAll(bySubject)
		return
	}
	found := map[string]*jetstream.RawStreamMsg{}
	sent, err := r.multiLast(ctx, subjects, func(m *nats.Msg) error {
		raw, err := rawFromDirect(m)
		if err != nil {
			return err
		}
		if _, asked := bySubject[raw.Subject]; !asked {
			return fmt.Errorf("%w: an answer for %s, which was not asked for", ErrBatchUnavailable, raw.Subject)
		}
		found[raw.Subject] = raw
		return nil
	})
	if sent && r.opts.OnBatch != nil {
		r.opts.OnBatch()
	}
	if errors.Is(err, ErrBatchUnavailable) || (errors.Is(err, context.DeadlineExceeded) && r.denied()) {
		// Unavailable, or unanswered because the connection may not send
		// the batch request (the server drops it): each read goes alone.
		r.fallBackAll(bySubject)
		return
	}
	if sent {
		r.count(ReadBatched, n)
	}
	for s, qs := range bySubject {
		for _, q := range qs {
			switch m := found[s]; {
			case err != nil:
				q.answer(nil, fmt.Errorf("read the last of %s in %s: %w", s, r.name, err))
			case m == nil:
				q.answer(nil, jetstream.ErrMsgNotFound) // itself (Last)
			default:
				q.answer(m, nil)
			}
		}
	}
}

// fallBackAll sends every read of bySubject alone and stops batching
// for lastReaderBackoff.
func (r *LastReader) fallBackAll(bySubject map[string][]*lastRead) {
	r.mu.Lock()
	r.offTill = time.Now().Add(lastReaderBackoff)
	r.mu.Unlock()
	for _, qs := range bySubject {
		for _, q := range qs {
			q.fallBack()
		}
	}
}

// denied reports whether the connection's last error is the server
// refusing the batch request's subject. (nats.go keeps one last error
// until a reconnect: a denial can be hidden by a later error, and then a
// batch times out and fails its reads, as an unanswered read would; or
// outlive a permissions reload, and then reads go alone, as correct.)
func (r *LastReader) denied() bool {
	err := r.js.Conn().LastError()
	return errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+r.api+`"`)
}

// multiLast sends one multi_last for subjects on the reader's inbox and
// calls fn with each answer; sent says the request went out.
func (r *LastReader) multiLast(ctx context.Context, subjects []string, fn func(*nats.Msg) error) (sent bool, err error) {
	body, err := json.Marshal(batchRequest{MultiLastFor: subjects})
	if err != nil {
		return false, err
	}
	ch, reply, err := r.listen()
	if err != nil {
		return false, err
	}
	if err := r.js.Conn().PublishMsg(&nats.Msg{Subject: r.api, Reply: reply, Data: body}); err != nil {
		return false, err
	}
	_, err = batchAnswers(ctx, ch, true, fn)
	return true, err
}

// listen returns the channel the batch in flight's answers arrive on and
// its reply subject, subscribing the reader's inbox on first use. One
// batch is in flight at a time: each has its own reply subject, so an
// answer late for a batch that timed out is dropped, never taken for the
// next one's.
func (r *LastReader) listen() (<-chan *nats.Msg, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, "", fmt.Errorf("%w: the reader is closed", ErrBatchUnavailable)
	}
	if r.sub == nil {
		nc := r.js.Conn()
		r.inbox = nc.NewInbox() + "."
		sub, err := nc.Subscribe(r.inbox+"*", r.deliver)
		if err != nil {
			return nil, "", fmt.Errorf("%w: subscribe its inbox: %v", ErrBatchUnavailable, err)
		}
		r.sub = sub
	}
	r.batchN++
	// Room for every answer one batch may carry and its end, so deliver
	// never blocks the connection's dispatch.
	r.answers = make(chan *nats.Msg, maxLastBatch+1)
	r.reply = r.inbox + strconv.FormatUint(r.batchN, 10)
	return r.answers, r.reply, nil
}

// deliver hands an answer to the batch in flight when it is that batch's.
func (r *LastReader) deliver(m *nats.Msg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m.Subject != r.reply {
		return // late, for a batch that is over
	}
	select {
	case r.answers <- m:
	default: // cannot happen: room for a batch's every answer and its end
	}
}

// rawFromDirect is a direct get's answer as GetLastMsgForSubject returns
// it: the subject, sequence and time the server stored it with (its own
// headers, after any the publisher set).
func rawFromDirect(m *nats.Msg) (*jetstream.RawStreamMsg, error) {
	subject := ServerHeader(m, jetstream.SubjectHeader)
	seqText := ServerHeader(m, jetstream.SequenceHeader)
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if err != nil || subject == "" {
		return nil, fmt.Errorf("%w: an answer without its subject or sequence", ErrBatchUnavailable)
	}
	at, err := time.Parse(time.RFC3339Nano, ServerHeader(m, jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("%w: an answer without its time: %v", ErrBatchUnavailable, err)
	}
	return &jetstream.RawStreamMsg{Subject: subject, Sequence: seq, Header: m.Header, Data: m.Data, Time: at}, nil
}
