// Package dlq is `failbus dlq`: the dead letters in FAILBUS_DLQ listed
// (ls), shown decoded with their original payload (show), and put back on
// their original subject (requeue), once.
//
// # What "once" means for requeue
//
// A requeue is three steps, each durable: a claim (a create-only key per
// dead letter in KV bucket FAILBUS_DLQ_REQUEUES), the copy published to the
// original subject with a Nats-Msg-Id derived from the dead letter
// (requeue.MsgID), and the mark that it is done, with where the copy
// was stored (compare-and-set on the claim's revision).
//
//   - Two operators requeueing the same dead letter: one creates the claim;
//     the other finds it and either reports "already requeued" or, while it
//     is only claimed, takes it over — both then publish the same message
//     id within the stream's duplicate window, which stores it once.
//   - A crash between the steps leaves a claim without the done mark (ls
//     shows it as interrupted). Running requeue again takes the claim over
//     and first looks for a copy the interrupted run stored (a headers-only
//     read of the original subject from the claim's time, matching
//     Failbus-Requeued-From), so even after the duplicate window it does
//     not publish a second copy.
//   - The copy carries Failbus-Requeue-For: <service>, and pkg/consumer's
//     runner hands it to that service only: the other consumers of the
//     subject processed the original and acknowledge the copy unhandled.
//
// ls and show only read (the `operator` role runs them); requeue publishes
// to the original subject and writes the bucket, so it needs a user
// allowed both (`admin`).
package dlq

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/requeue"
	"github.com/failbus/failbus/internal/streamread"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Letter is one message of the dead-letter stream, decoded where it
// decodes.
type Letter struct {
	// Stream and Seq say where the dead letter is stored.
	Stream string
	Seq    uint64
	// Subject is its own subject, failbus.dlq.<service>.
	Subject string
	// Time is when the stream stored it.
	Time time.Time
	// MsgID is its Nats-Msg-Id ("dlq:<service>:<input id>").
	MsgID string
	// DL is the dead letter; nil when the message is not one (Err says
	// why).
	DL  *events.DeadLetter
	Err error
	// Whole is what identifies the whole original input when DL holds only
	// a prefix of it.
	Whole Whole
	// Mark is its requeue record; nil when it was never requeued.
	Mark *Mark
}

// ID is the dead letter's identity for people and headers, "<stream>:<seq>".
func (l *Letter) ID() string { return requeue.From(l.Stream, l.Seq) }

// Whole identifies a dead letter's whole original input. A dead letter of
// input that did not fit whole keeps a bounded prefix, the input's length
// and SHA-256, and where the input is stored (DeadLetter.Stream and Seq);
// dead letters written before pkg/consumer bounded them carry the whole
// input and none of these, and read the same.
type Whole struct {
	Truncated bool   `json:"truncated,omitempty"`
	Len       int    `json:"data_len,omitempty"`
	SHA256    string `json:"data_sha256,omitempty"`
}

// decodeLetter decodes one stored message of the dead-letter stream.
func decodeLetter(stream string, seq uint64, subject string, stored time.Time, h nats.Header, data []byte) Letter {
	l := Letter{Stream: stream, Seq: seq, Subject: subject, Time: stored, MsgID: h.Get(events.HeaderMsgID)}
	dl, err := decodeDeadLetter(subject, h, data)
	if err != nil {
		l.Err = err
		return l
	}
	l.DL = dl
	l.Whole = Whole{Truncated: dl.Truncated, Len: dl.DataLen, SHA256: dl.DataSHA256}
	return l
}

// decodeDeadLetter reads a dead letter: the subject says it is one, and a
// schema header, when there is one, must agree.
func decodeDeadLetter(subject string, h nats.Header, data []byte) (*events.DeadLetter, error) {
	if events.SubjectSchema(subject) != events.SchemaDeadLetter {
		return nil, fmt.Errorf("subject %s is not a dead-letter subject", subject)
	}
	return events.DecodeAs[*events.DeadLetter](subject, h, data)
}

// Select says which dead letters to read.
type Select struct {
	// Stream is the dead-letter stream. Defaults to topology.StreamDLQ.
	Stream string
	// Services limits the read to these services' subjects (none: all).
	Services []string
	// Since reads only dead letters stored at or after it (zero: all).
	Since time.Time
	// StartSeq reads from this sequence on (0: the first).
	StartSeq uint64
	// Reason keeps only dead letters whose reason contains it.
	Reason string
	// Subject keeps only dead letters whose original subject matches this
	// filter (wildcards allowed).
	Subject string
}

func (s Select) stream() string {
	if s.Stream == "" {
		return topology.StreamDLQ
	}
	return s.Stream
}

// keep reports whether l passes the filters that are not subject filters.
func (s Select) keep(l *Letter) bool {
	if s.Reason == "" && s.Subject == "" {
		return true
	}
	if l.DL == nil {
		return false
	}
	if s.Reason != "" && !strings.Contains(l.DL.Reason, s.Reason) {
		return false
	}
	return s.Subject == "" || events.SubjectWithin(l.DL.Subject, s.Subject)
}

// List reads the dead letters s selects, in stream order, with their
// requeue marks. It leaves nothing behind on the server.
func List(ctx context.Context, js jetstream.JetStream, s Select) ([]Letter, error) {
	cfg := watch.Config{Stream: s.stream(), DeliverPolicy: jetstream.DeliverAllPolicy, Direct: true}
	for _, svc := range s.Services {
		cfg.Filters = append(cfg.Filters, events.DLQSubject(svc))
	}
	switch {
	case s.StartSeq > 0:
		cfg.DeliverPolicy, cfg.StartSeq = jetstream.DeliverByStartSequencePolicy, s.StartSeq
	case !s.Since.IsZero():
		since := s.Since
		cfg.DeliverPolicy, cfg.StartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	var out []Letter
	err := watch.Read(ctx, js, cfg, func(m jetstream.Msg) error {
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("read %s: %w", cfg.Stream, err)
		}
		l := decodeLetter(md.Stream, md.Sequence.Stream, m.Subject(), md.Timestamp, m.Headers(), m.Data())
		if s.keep(&l) {
			out = append(out, l)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	marks, err := readMarks(ctx, js)
	if err != nil {
		return out, err
	}
	for i := range out {
		if mk, ok := marks[markKey(out[i].Stream, out[i].Seq)]; ok {
			out[i].Mark = &mk
		}
	}
	return out, nil
}

// Get reads the dead letter at seq of stream ("" for FAILBUS_DLQ) with its
// requeue mark.
func Get(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (Letter, error) {
	if stream == "" {
		stream = topology.StreamDLQ
	}
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return Letter{}, fmt.Errorf("stream %s: %w", stream, err)
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Letter{}, fmt.Errorf("%s has no message %d (removed, or never stored)", stream, seq)
	}
	if err != nil {
		return Letter{}, fmt.Errorf("read %s seq %d: %w", stream, seq, err)
	}
	l := decodeLetter(stream, seq, m.Subject, m.Time, m.Header, m.Data)
	mk, _, err := getMark(ctx, js, markKey(stream, seq))
	if err != nil {
		return l, err
	}
	l.Mark = mk
	return l, nil
}

// Original is a dead letter's original input, whole, as it was published.
type Original struct {
	Subject string
	Header  nats.Header
	Data    []byte
	// From says where the bytes came from: "dead letter" (it kept them
	// whole) or "<stream>:<seq>" (the input still stored in its stream).
	From string
}

// ErrOriginalGone reports a dead letter that kept only a prefix of its
// input whose whole input its stream no longer holds.
var ErrOriginalGone = errors.New("the whole original input is gone")

// OriginalOf returns the whole original input of l: the bytes the dead
// letter kept, or, when it kept only a prefix, the input read back from
// the stream it still lies in, checked against the length and SHA-256 the
// dead letter recorded.
func OriginalOf(ctx context.Context, js jetstream.JetStream, l *Letter) (*Original, error) {
	dl := l.DL
	if dl == nil {
		return nil, fmt.Errorf("dead letter %s does not decode: %w", l.ID(), l.Err)
	}
	if !l.Whole.Truncated {
		if err := l.Whole.check(dl.Data); err != nil {
			return nil, fmt.Errorf("dead letter %s: %w", l.ID(), err)
		}
		return &Original{Subject: dl.Subject, Header: nats.Header(dl.Headers), Data: dl.Data, From: "dead letter"}, nil
	}
	where := requeue.From(dl.Stream, dl.Seq)
	if dl.Stream == "" || dl.Seq == 0 {
		return nil, fmt.Errorf("dead letter %s keeps %d of %d bytes and does not say where the input is stored: %w",
			l.ID(), len(dl.Data), l.Whole.Len, ErrOriginalGone)
	}
	s, err := js.Stream(ctx, dl.Stream)
	if err != nil {
		return nil, fmt.Errorf("dead letter %s: stream %s of its input: %w", l.ID(), dl.Stream, err)
	}
	m, err := s.GetMsg(ctx, dl.Seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("dead letter %s keeps %d of %d bytes, and %s no longer holds the input (its limits removed it): %w",
			l.ID(), len(dl.Data), l.Whole.Len, where, ErrOriginalGone)
	}
	if err != nil {
		return nil, fmt.Errorf("dead letter %s: read its input at %s: %w", l.ID(), where, err)
	}
	if m.Subject != dl.Subject {
		return nil, fmt.Errorf("dead letter %s: %s holds a message on %s, not the input on %s: %w", l.ID(), where, m.Subject, dl.Subject, ErrOriginalGone)
	}
	if err := l.Whole.check(m.Data); err != nil {
		return nil, fmt.Errorf("dead letter %s: the message at %s is not its input: %w", l.ID(), where, err)
	}
	return &Original{Subject: m.Subject, Header: m.Header, Data: m.Data, From: where}, nil
}

// check compares data with the recorded length and hash, when recorded.
func (w Whole) check(data []byte) error {
	if (w.Len != 0 || w.Truncated) && len(data) != w.Len {
		return fmt.Errorf("%d bytes, the dead letter recorded %d", len(data), w.Len)
	}
	if w.SHA256 != "" {
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != w.SHA256 {
			return fmt.Errorf("sha256 %s, the dead letter recorded %s", got, w.SHA256)
		}
	}
	return nil
}

// Mark is the requeue record of one dead letter, JSON in KV bucket
// FAILBUS_DLQ_REQUEUES under "<dlq stream>.<seq>", so an operator can read
// it with `nats kv get`.
type Mark struct {
	// DeadLetter is "<stream>:<seq>" of the dead letter.
	DeadLetter string `json:"dead_letter"`
	// DeadLetterMsgID is the dead letter's Nats-Msg-Id: a mark found for a
	// sequence whose dead letter has another id belongs to a stream that
	// was deleted and created again.
	DeadLetterMsgID string `json:"dead_letter_msg_id,omitempty"`
	// State is MarkClaimed or MarkRequeued.
	State string `json:"state"`
	// By is who claimed it last (user@host:pid).
	By string `json:"by"`
	// ClaimedAt is when the first claim was made.
	ClaimedAt time.Time `json:"claimed_at"`
	// Runs counts the requeue runs that worked on it (above 1: an
	// interrupted run was finished by a later one).
	Runs int `json:"runs"`
	// Subject is the original subject the copy goes to.
	Subject string `json:"subject"`
	// Service is the service the copy is for (Failbus-Requeue-For).
	Service string `json:"service"`
	// Stream and Seq say where the copy was stored (MarkRequeued).
	Stream string `json:"stream,omitempty"`
	Seq    uint64 `json:"seq,omitempty"`
	// RequeuedAt is when it was marked done.
	RequeuedAt time.Time `json:"requeued_at,omitzero"`
}

// Mark states.
const (
	// MarkClaimed: a requeue run started and has not finished (it is
	// running, or it was interrupted).
	MarkClaimed = "claimed"
	// MarkRequeued: the copy is stored at Stream/Seq.
	MarkRequeued = "requeued"
)

// markKey is the KV key of the dead letter at seq of stream.
func markKey(stream string, seq uint64) string { return stream + "." + strconv.FormatUint(seq, 10) }

func marksBucket(ctx context.Context, js jetstream.JetStream) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, topology.BucketDLQRequeues)
	if err != nil {
		return nil, fmt.Errorf("open KV bucket %s (apply the topology: any service binary or `failbus dev` does it): %w", topology.BucketDLQRequeues, err)
	}
	return kv, nil
}

// getMark reads one mark and its revision; nil when there is none.
func getMark(ctx context.Context, js jetstream.JetStream, key string) (*Mark, uint64, error) {
	kv, err := marksBucket(ctx, js)
	if err != nil {
		return nil, 0, err
	}
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read requeue mark %s: %w", key, err)
	}
	var mk Mark
	if err := json.Unmarshal(e.Value(), &mk); err != nil {
		return nil, 0, fmt.Errorf("requeue mark %s is not readable: %w", key, err)
	}
	return &mk, e.Revision(), nil
}

// readMarks reads every mark, keyed by KV key (one batch read,
// streamread.LatestEntries).
func readMarks(ctx context.Context, js jetstream.JetStream) (map[string]Mark, error) {
	kv, err := marksBucket(ctx, js)
	if err != nil {
		return nil, err
	}
	es, err := streamread.LatestEntries(ctx, js, kv, ">")
	if err != nil {
		return nil, fmt.Errorf("read the requeue marks: %w", err)
	}
	out := make(map[string]Mark, len(es))
	for _, e := range es {
		var mk Mark
		if json.Unmarshal(e.Value(), &mk) == nil {
			out[e.Key()] = mk
		}
	}
	return out, nil
}
