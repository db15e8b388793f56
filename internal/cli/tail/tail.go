package tail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/streamread"
	"github.com/failbus/failbus/internal/watch"
	"github.com/failbus/failbus/internal/wiretypes"
	"github.com/failbus/failbus/pkg/events"
)

// Command is `failbus tail`.
var Command = cli.Command{Name: "tail", Summary: "print messages of any subject as JSON Lines; follow, or replay from a sequence or time", Run: run}

// tailUsage documents `failbus tail` and its output.
const tailUsage = `[--server URL] [--stream NAME] [start] [--count N] [--no-follow] [SUBJECT...]

Prints the messages of the given subjects (default failbus.>) as JSON Lines,
one object per message:

  {"stream":"FAILBUS_CLASSIFIED","seq":12,"subject":"failbus.classified.openai.rate_limit",
   "time":"2025-03-01T12:00:00.123Z","schema":"classification/1","msg_id":"classifier:o-1:c",
   "data":{...the message with its snake_case keys...}}

time is when the stream stored the message; schema and msg_id are left out
when the message has none. A payload that is not msgpack gets an "error"
saying so, with the payload as "data" when it is JSON, else as "raw"
(base64). A dead letter's "data" is the payload it carries, decoded where it
decodes ("data_as": "msgpack" for msgpack shown as JSON, "text" for UTF-8
text, "base64" for anything else).

The streams are found from the subjects (a filter such as failbus.> spans
several); each is read with direct gets, which leave no state on the
server and need no more than the operator's permission to read (new
messages are asked for every quarter of a second). Lines of different streams interleave in arrival order; sort by
time to merge them. Within one stream they are in stream order.

Start (at most one; default: new messages when following, all with
--no-follow): --last N (the last N matching messages of each stream),
--last-per-subject (the latest message of each subject, e.g. each
provider's on failbus.health.>), --since DURATION, --start-time RFC3339,
--start-seq N (one stream only).

--translate CMD runs CMD for each message with its payload on stdin, in the
nats CLI's manner, and prints what CMD wrote as "data" (as JSON when it is
JSON, else as a string); {{Subject}} and {{Stream}} in CMD are the message's.
The other way round, failbus decode reads one payload on stdin:
nats sub 'failbus.>' --translate 'failbus decode --subject {{Subject}}'.`

// tailOptions are the parsed flags of `failbus tail`.
type tailOptions struct {
	stream    string
	since     time.Duration
	startSeq  uint64
	startTime time.Time
	last      int
	lastPer   bool
	count     int
	noFollow  bool
	subjects  []string
	translate *translator
}

// run is `failbus tail`.
func run(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet("tail", tailUsage, stderr)
	var conn cli.Conn
	conn.Register(fs)
	var o tailOptions
	var startTime string
	fs.StringVar(&o.stream, "stream", "", "read only this stream (default: every stream holding the subjects)")
	fs.DurationVar(&o.since, "since", 0, "start with the messages of the last DURATION (e.g. 15m)")
	fs.Uint64Var(&o.startSeq, "start-seq", 0, "start at this stream sequence (needs one stream)")
	fs.StringVar(&startTime, "start-time", "", "start at this time (RFC 3339)")
	fs.IntVar(&o.last, "last", 0, "start N matching messages back, per stream")
	fs.BoolVar(&o.lastPer, "last-per-subject", false, "start with the latest message of each subject (each provider's latest health, say)")
	fs.IntVar(&o.count, "count", 0, "exit after N messages (0: no limit)")
	fs.BoolVar(&o.noFollow, "no-follow", false, "exit when the messages stored at start are printed")
	translate := fs.String("translate", "", "run CMD per message with the payload on stdin and print its output as data ({{Subject}}, {{Stream}})")
	subjects, code, done := cli.Parse(fs, args)
	if done {
		return code
	}
	o.subjects = subjects
	if startTime != "" {
		t, err := time.Parse(time.RFC3339Nano, startTime)
		if err != nil {
			return cli.UsageError(fs, stderr, "--start-time %q: not RFC 3339", startTime)
		}
		o.startTime = t
	}
	if err := o.check(); err != nil {
		return cli.UsageError(fs, stderr, "%v", err)
	}
	if *translate != "" {
		t, err := newTranslator(*translate)
		if err != nil {
			return cli.UsageError(fs, stderr, "%v", err)
		}
		o.translate = t
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, js, err := conn.JetStream(ctx, "tail")
	if err != nil {
		fmt.Fprintf(stderr, "failbus tail: %v\n", err)
		return 1
	}
	defer nc.Close()
	// The server answers a denied request by reporting the denial, not by
	// replying: fail at once, naming it, instead of waiting for a timeout.
	ctx, failFast := nc.FailFast(ctx)
	defer failFast()
	err = tail(ctx, js, o, stdout)
	if errors.Is(err, errNoStream) || cli.NoAnswer(err) {
		if d := cli.Diagnose(ctx, js, nc.ConnectedUrlRedacted(), cli.StreamsOf(o.subjects...)...); d != nil {
			err = d
		}
	}
	if err := nc.Explain(err); err != nil {
		fmt.Fprintf(stderr, "failbus tail: %v\n", err)
		return 1
	}
	return 0
}

// check validates flag combinations that need no server.
func (o *tailOptions) check() error {
	if len(o.subjects) == 0 {
		o.subjects = []string{events.Prefix + ".>"}
	}
	for _, s := range o.subjects {
		if err := checkFilter(s); err != nil {
			return err
		}
	}
	starts := 0
	for _, set := range []bool{o.since != 0, o.startSeq != 0, !o.startTime.IsZero(), o.last != 0, o.lastPer} {
		if set {
			starts++
		}
	}
	switch {
	case starts > 1:
		return errors.New("--since, --start-seq, --start-time, --last and --last-per-subject exclude each other")
	case o.since < 0:
		return errors.New("--since must be positive")
	case o.last < 0:
		return errors.New("--last must be positive")
	case o.count < 0:
		return errors.New("--count must be positive")
	}
	return nil
}

// checkFilter rejects what the server would reject with a less clear
// message: empty tokens, spaces, '>' before the last token.
func checkFilter(s string) error {
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return fmt.Errorf("subject %q: empty or contains white space", s)
	}
	toks := strings.Split(s, ".")
	for i, t := range toks {
		if t == "" {
			return fmt.Errorf("subject %q: empty token", s)
		}
		if t == ">" && i != len(toks)-1 {
			return fmt.Errorf("subject %q: '>' must be the last token", s)
		}
	}
	return nil
}

// tailLine is one output record.
type tailLine struct {
	Stream  string          `json:"stream"`
	Seq     uint64          `json:"seq"`
	Subject string          `json:"subject"`
	Time    events.Time     `json:"time"`
	Schema  string          `json:"schema,omitempty"`
	MsgID   string          `json:"msg_id,omitempty"`
	Data    json.RawMessage `json:"data,omitempty"`
	Raw     []byte          `json:"raw,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// tail prints the messages o selects to w until ctx ends, --count is
// reached, or (--no-follow) every stream is caught up.
func tail(ctx context.Context, js jetstream.JetStream, o tailOptions, w io.Writer) error {
	plan, err := tailPlan(ctx, js, o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := &tailWriter{w: w, limit: o.count, done: cancel}
	var wg sync.WaitGroup
	errs := make([]error, len(plan))
	for i, p := range plan {
		wg.Go(func() {
			errs[i] = tailStream(ctx, js, p.stream, p.filters, o, out)
		})
	}
	wg.Wait()
	return errors.Join(append(errs, out.err)...)
}

// errNoStream: a subject no stream holds.
var errNoStream = errors.New("no stream")

// streamFilters is one stream to read and the filters to read it with.
type streamFilters struct {
	stream  string
	filters []string
}

// tailPlan finds which streams hold the subjects.
func tailPlan(ctx context.Context, js jetstream.JetStream, o tailOptions) ([]streamFilters, error) {
	byStream := map[string][]string{}
	if o.stream != "" {
		s, err := js.Stream(ctx, o.stream)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", o.stream, err)
		}
		for _, f := range o.subjects {
			if slices.ContainsFunc(s.CachedInfo().Config.Subjects, func(p string) bool { return events.SubjectsCollide(f, p) }) {
				byStream[o.stream] = append(byStream[o.stream], f)
			}
		}
		if len(byStream) == 0 {
			return nil, fmt.Errorf("stream %s holds none of %s", o.stream, strings.Join(o.subjects, ", "))
		}
	} else {
		for _, f := range o.subjects {
			names := js.StreamNames(ctx, jetstream.WithStreamListSubject(f))
			found := false
			for n := range names.Name() {
				byStream[n] = append(byStream[n], f)
				found = true
			}
			if err := names.Err(); err != nil {
				return nil, fmt.Errorf("find the streams of %s: %w", f, err)
			}
			if !found {
				return nil, fmt.Errorf("%w holds %s (is the topology applied? `failbus dev` does it)", errNoStream, f)
			}
		}
	}
	if o.startSeq != 0 && len(byStream) > 1 {
		names := slices.Sorted(maps.Keys(byStream))
		return nil, fmt.Errorf("--start-seq needs one stream, but the subjects span %s: add --stream", strings.Join(names, ", "))
	}
	plan := make([]streamFilters, 0, len(byStream))
	for name, filters := range byStream {
		plan = append(plan, streamFilters{stream: name, filters: minimalFilters(filters)})
	}
	sort.Slice(plan, func(i, j int) bool { return plan[i].stream < plan[j].stream })
	return plan, nil
}

// minimalFilters drops duplicates and filters that another filter covers:
// a read rejects overlapping filters (each message is read once).
func minimalFilters(fs []string) []string {
	var out []string
	for i, f := range fs {
		covered := false
		for j, g := range fs {
			if i != j && events.SubjectWithin(f, g) && (f != g || j < i) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, f)
		}
	}
	return out
}

// tailWriter serialises output lines of all streams and enforces --count.
type tailWriter struct {
	mu    sync.Mutex
	w     io.Writer
	n     int
	limit int
	done  func()
	err   error
}

// write prints one line; it returns false when no more lines are wanted.
func (t *tailWriter) write(line []byte) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err != nil || t.limit > 0 && t.n >= t.limit {
		return false
	}
	if _, err := t.w.Write(append(line, '\n')); err != nil {
		t.err = fmt.Errorf("write output: %w", err)
		t.done()
		return false
	}
	t.n++
	if t.limit > 0 && t.n >= t.limit {
		t.done()
		return false
	}
	return true
}

// tailStream reads one stream.
func tailStream(ctx context.Context, js jetstream.JetStream, stream string, filters []string, o tailOptions, out *tailWriter) error {
	cfg := watch.Config{Stream: stream, Filters: filters, DeliverPolicy: jetstream.DeliverNewPolicy, Follow: !o.noFollow, Direct: true}
	switch {
	case o.since != 0:
		t := time.Now().Add(-o.since)
		cfg.DeliverPolicy, cfg.StartTime = jetstream.DeliverByStartTimePolicy, &t
	case !o.startTime.IsZero():
		cfg.DeliverPolicy, cfg.StartTime = jetstream.DeliverByStartTimePolicy, &o.startTime
	case o.startSeq != 0:
		cfg.DeliverPolicy, cfg.StartSeq = jetstream.DeliverByStartSequencePolicy, o.startSeq
	case o.last != 0:
		seq, err := lastNStart(ctx, js, stream, filters, uint64(o.last))
		if err != nil {
			return quiet(ctx, err)
		}
		cfg.DeliverPolicy, cfg.StartSeq = jetstream.DeliverByStartSequencePolicy, seq
	case o.lastPer:
		cfg.DeliverPolicy = jetstream.DeliverLastPerSubjectPolicy
	case o.noFollow:
		cfg.DeliverPolicy = jetstream.DeliverAllPolicy
	}
	err := watch.Read(ctx, js, cfg, func(m jetstream.Msg) error {
		meta, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", stream, err)
		}
		if !out.write(renderTail(ctx, m, meta, o.translate)) {
			return watch.ErrStop
		}
		return nil
	})
	return quiet(ctx, err)
}

// quiet drops err when ctx ended: stopping (a signal, --count reached) is
// not a failure.
func quiet(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// renderTail builds the JSON line of one message, its payload rendered by
// tr when given (--translate).
func renderTail(ctx context.Context, m jetstream.Msg, meta *jetstream.MsgMetadata, tr *translator) []byte {
	h := m.Headers()
	l := tailLine{
		Stream:  meta.Stream,
		Seq:     meta.Sequence.Stream,
		Subject: m.Subject(),
		Time:    events.At(meta.Timestamp),
		Schema:  h.Get(events.HeaderSchema),
		MsgID:   h.Get(events.HeaderMsgID),
	}
	if tr != nil {
		var err error
		if l.Data, err = tr.run(ctx, m.Subject(), meta.Stream, m.Data()); err != nil {
			l.Raw, l.Error = m.Data(), err.Error()
		}
	} else {
		l.Data, l.Raw, l.Error = renderPayload(m.Subject(), h, m.Data())
	}
	b, err := json.Marshal(l)
	if err != nil {
		// Data is valid JSON by construction; this is a bug, say so.
		b, _ = json.Marshal(tailLine{Stream: l.Stream, Seq: l.Seq, Subject: l.Subject, Time: l.Time, Raw: m.Data(), Error: err.Error()})
	}
	return b
}

// errJSONPayload is the error of a payload that is JSON: readable, but not
// what the bus speaks.
const errJSONPayload = "payload is JSON, not msgpack: failbus services dead-letter it"

// errBinaryPayload is the error of a payload that is neither msgpack nor
// JSON.
const errBinaryPayload = "payload is not msgpack (nor JSON): shown as raw, base64"

// renderPayload renders a payload: msgpack as JSON (a dead letter with the
// payload it carries decoded, see cli.DeadLetterJSON), JSON as itself with an
// error, anything else as raw bytes with an error.
func renderPayload(subject string, h nats.Header, data []byte) (out json.RawMessage, raw []byte, errText string) {
	if dl, err := events.DecodeAs[*events.DeadLetter](subject, h, data); err == nil {
		if b, err := cli.DeadLetterJSON(dl); err == nil {
			return b, nil, ""
		}
	}
	b, err := wiretypes.Bus.ToJSON(subject, h, data)
	switch {
	case err != nil:
		return nil, data, errBinaryPayload
	case !isMsgpack(data):
		return b, nil, errJSONPayload
	}
	return b, nil, ""
}

func isMsgpack(data []byte) bool {
	_, err := events.MsgpackToJSON(data)
	return err == nil
}

// matching counts the messages of stream from sequence seq on whose
// subject matches one of filters (none: every message), with one direct
// get per filter: the first match and the count after it.
func matching(ctx context.Context, js jetstream.JetStream, stream string, filters []string, seq uint64) (uint64, error) {
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var n uint64
	for _, f := range filters {
		page, err := streamread.ReadPage(ctx, js, stream, f, seq, nil, 1, 0, func(*nats.Msg) error { return nil })
		if err != nil {
			return 0, fmt.Errorf("count pending on %s: %w", stream, err)
		}
		n += uint64(page.Answers) + page.Pending
	}
	return n, nil
}

// lastNStart finds the stream sequence from which exactly n messages match
// filters (or the first sequence when fewer do), by binary search on the
// pending count: O(log stream length) probes, whatever the stream's size.
func lastNStart(ctx context.Context, js jetstream.JetStream, stream string, filters []string, n uint64) (uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", stream, err)
	}
	st := s.CachedInfo().State
	if st.Msgs == 0 {
		return max(st.LastSeq+1, 1), nil
	}
	at := func(seq uint64) (uint64, error) { return matching(ctx, js, stream, filters, seq) }
	lo, hi := st.FirstSeq, st.LastSeq+1 // invariant: at(lo) >= n (or lo is first), at(hi) < n
	total, err := at(lo)
	if err != nil || total <= n {
		return lo, err
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		p, err := at(mid)
		if err != nil {
			return 0, err
		}
		if p >= n {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, nil
}
