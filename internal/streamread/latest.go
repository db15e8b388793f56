package streamread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrBatchUnavailable says a batch read could not answer in one request:
// more keys than one answer may carry (the server's 1024), more bytes than
// its pending limit, a stream without direct gets, or a server without
// batch reads (before 2.11). The caller reads another way; LatestEntries
// does, with a watch.
var ErrBatchUnavailable = errors.New("batch read unavailable")

// ErrTooManySubjects is the ErrBatchUnavailable of a batch read whose
// filters match more subjects than one answer may carry (the server's
// 1024, counted over the whole stream whatever the first sequence asked
// for): narrow the filters, or read the stream's tail (ReadFrom).
var ErrTooManySubjects = fmt.Errorf("%w: more subjects than one answer carries", ErrBatchUnavailable)

// LatestEntries returns every live entry of kv (bucket) whose key matches
// keyFilter (KV wildcards `*` and `>`): the keys, values and revisions
// kv.WatchFiltered with IgnoreDeletes delivers before its end-of-snapshot
// nil, without the watch. (Of the entries' other fields, Delta is 0 and
// Created is in UTC; no caller reads them.)
//
// A watch creates an ephemeral consumer and deletes it again — server-side
// work, two advisories and, on a cluster, a proposal to the meta leader
// each time — for what is usually a handful of keys. LatestEntries asks
// for the last message of every matching subject in one direct batch
// request (JetStream's `multi_last`, which the server answers from one
// consistent view of the stream; like any direct get, possibly a
// follower's, which may lag the leader as kv.Get's may), and falls back to
// the watch only when the batch read is unavailable (ErrBatchUnavailable).
// Deleted, purged and expired keys are left out.
func LatestEntries(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, keyFilter string) ([]jetstream.KeyValueEntry, error) {
	out, err := latestBatch(ctx, js, kv.Bucket(), keyFilter)
	if !errors.Is(err, ErrBatchUnavailable) {
		return out, err
	}
	return latestWatch(ctx, kv, keyFilter)
}

// latestWatch is LatestEntries with a watch.
func latestWatch(ctx context.Context, kv jetstream.KeyValue, keyFilter string) ([]jetstream.KeyValueEntry, error) {
	w, err := kv.WatchFiltered(ctx, []string{keyFilter}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read %s %s: %w", kv.Bucket(), keyFilter, err)
	}
	defer func() { _ = w.Stop() }()
	var out []jetstream.KeyValueEntry
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("read %s %s: the watch closed before its snapshot ended", kv.Bucket(), keyFilter)
			}
			if e == nil {
				return out, nil
			}
			out = append(out, e)
		case <-ctx.Done():
			return nil, fmt.Errorf("read %s %s: %w", kv.Bucket(), keyFilter, ctx.Err())
		}
	}
}

// batchRequest is a direct-get batch request: the last message of every
// subject matching MultiLastFor, or up to Batch messages matching NextFor
// from Seq on.
type batchRequest struct {
	MultiLastFor []string `json:"multi_last,omitempty"`
	NextFor      string   `json:"next_by_subj,omitempty"`
	Batch        int      `json:"batch,omitempty"`
	// Seq is the first sequence looked at (0: the stream's first).
	Seq uint64 `json:"seq,omitempty"`
	// StartTime, instead of Seq, starts at the first message stored at or
	// after it.
	StartTime *time.Time `json:"start_time,omitempty"`
	// UpToSeq bounds a multi_last: the last of each subject among the
	// messages up to it (0: the stream's last).
	UpToSeq uint64 `json:"up_to_seq,omitempty"`
	// MaxBytes bounds one answer (0: the server's max pending, 64 MiB by
	// default).
	MaxBytes int `json:"max_bytes,omitempty"`
}

// batchEnd is how a batch answer ended: how many messages it carried, the
// sequence of the last, and how many matching ones it left out (cut by its
// byte limit or its batch size).
type batchEnd struct {
	answers int
	lastSeq uint64
	pending uint64
}

// withDefaultTimeout bounds ctx by js's default API timeout when it has no
// deadline, as nats.go's own requests do.
func withDefaultTimeout(ctx context.Context, js jetstream.JetStream) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	timeout := js.Options().DefaultTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	return context.WithTimeout(ctx, timeout)
}

// ServerHeader returns the value of a header the server sets on a message
// it answers with (Nats-Subject, Nats-Sequence, Nats-Time-Stamp): the last
// one, since the server appends its own after any the publisher set.
func ServerHeader(m *nats.Msg, name string) string {
	vs := m.Header.Values(name)
	if len(vs) == 0 {
		return ""
	}
	return vs[len(vs)-1]
}

// directBatch sends req, a batch direct get of at most answers messages, to
// stream and calls fn with each answer.
func directBatch(ctx context.Context, js jetstream.JetStream, stream string, req batchRequest, answers int, fn func(*nats.Msg) error) (batchEnd, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return batchEnd{}, err
	}
	nc := js.Conn()
	ctx, cancel := withDefaultTimeout(ctx, js)
	defer cancel()
	// An inbox of its own: under the connection's request mux
	// (NewRespInbox) every answer would be delivered twice.
	inbox := nc.NewInbox()
	// Room for every answer the server may send, the end-of-batch
	// included, so none is dropped (a SubscribeSync allocates a channel of
	// 64k per request: most of this read's cost, measured).
	ch := make(chan *nats.Msg, answers+1)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return batchEnd{}, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: apiPrefix(js.Options()) + "DIRECT.GET." + stream, Reply: inbox, Data: body}); err != nil {
		return batchEnd{}, err
	}
	return batchAnswers(ctx, ch, req.MultiLastFor != nil, fn)
}

// batchAnswers reads the answers of one batch direct get from ch, calling
// fn with each stored message, until the end of the batch; multiLast says
// the request was a multi_last, whose answer must be whole: one that
// leaves matching subjects out (pending at its end) is
// ErrBatchUnavailable, where a batch from a sequence pages on.
func batchAnswers(ctx context.Context, ch <-chan *nats.Msg, multiLast bool, fn func(*nats.Msg) error) (batchEnd, error) {
	var end batchEnd
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return end, ctx.Err()
		}
		// A stored message always carries its sequence, a status answer
		// (end of batch, 404, 413) never: a message stored with an empty
		// body and a Status header of its own is not taken for one.
		if seq := ServerHeader(m, jetstream.SequenceHeader); seq == "" {
			switch m.Header.Get("Status") {
			case "204": // end of batch
				np, err := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
				if err != nil {
					return end, fmt.Errorf("%w: end of batch without its pending count", ErrBatchUnavailable)
				}
				end.pending = np
				if multiLast && np > 0 {
					return end, fmt.Errorf("%w: cut short with %d pending", ErrBatchUnavailable, np)
				}
				return end, nil
			case "404":
				// Nothing matches: "No Results" for a multi_last, "Message
				// Not Found" for a batch from a sequence. A multi_last's
				// "Message Not Found" is a message that failed to load.
				desc := m.Header.Get("Description")
				if end.answers == 0 && (!multiLast || desc == "No Results") {
					return end, nil
				}
				// A message that failed to load after others were sent.
				return end, fmt.Errorf("%w: 404 %s after %d answers", ErrBatchUnavailable, desc, end.answers)
			case "413":
				return end, fmt.Errorf("%w: %s", ErrTooManySubjects, m.Header.Get("Description"))
			case "":
				return end, fmt.Errorf("%w: an answer without its sequence", ErrBatchUnavailable)
			default: // 503 no responders (no direct gets), …
				return end, fmt.Errorf("%w: %s %s", ErrBatchUnavailable, m.Header.Get("Status"), m.Header.Get("Description"))
			}
		} else {
			var err error
			if end.lastSeq, err = strconv.ParseUint(seq, 10, 64); err != nil {
				return end, fmt.Errorf("%w: sequence %q", ErrBatchUnavailable, seq)
			}
		}
		if m.Header.Get("Nats-Num-Pending") == "" {
			return end, fmt.Errorf("%w: the server answered without batch headers", ErrBatchUnavailable)
		}
		end.answers++
		if err := fn(m); err != nil {
			return end, err
		}
	}
}

// ReadFrom calls fn with the messages of stream matching filter (wildcards
// allowed) with a sequence in [from, upto] (upto 0: no bound), in order, at
// most n of them: the last-of-each read for more subjects than
// LastPerSubject answers, over a stream's tail (from LastSeq back). It
// reads in direct batch gets of at most 4096 messages and 4 MiB, as many
// as it takes. Each may be answered by another replica: one that lags
// ends the read early (no message is skipped or read twice).
func ReadFrom(ctx context.Context, js jetstream.JetStream, stream, filter string, from, upto uint64, n int, fn func(*nats.Msg) error) error {
	return readFrom(ctx, js, stream, filter, from, upto, n, readPageBytes, fn)
}

// readPageBytes bounds one answer of ReadFrom.
const readPageBytes = 4 << 20

// maxReadFrom bounds one batch of ReadFrom (and its channel).
const maxReadFrom = 4096

// errPastUpto stops a read at its upper bound.
var errPastUpto = errors.New("past the upper bound")

func readFrom(ctx context.Context, js jetstream.JetStream, stream, filter string, from, upto uint64, n, pageBytes int, fn func(*nats.Msg) error) error {
	from = max(from, 1)
	for n > 0 && (upto == 0 || from <= upto) {
		batch := min(n, maxReadFrom)
		if upto > 0 {
			// The server ignores an upper bound for these reads: ask for
			// no more than the range holds.
			batch = int(min(uint64(batch), upto-from+1))
		}
		end, err := directBatch(ctx, js, stream, batchRequest{NextFor: filter, Seq: from, Batch: batch, MaxBytes: pageBytes}, batch, func(m *nats.Msg) error {
			if upto > 0 {
				if seq, _ := strconv.ParseUint(ServerHeader(m, jetstream.SequenceHeader), 10, 64); seq > upto {
					return errPastUpto
				}
			}
			return fn(m)
		})
		if errors.Is(err, errPastUpto) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s in %s from %d: %w", filter, stream, from, err)
		}
		n -= end.answers
		if end.pending == 0 || end.answers == 0 {
			return nil
		}
		from = end.lastSeq + 1
	}
	return nil
}

// Page is how one page of a stream ended (ReadPage): how many messages it
// carried, the sequence of the last, and how many matching messages came
// after it when the server answered (0: the reader has caught up).
type Page struct {
	Answers int
	LastSeq uint64
	Pending uint64
}

// ReadPage reads one page of stream: at most n messages matching filter
// (wildcards allowed) from sequence from on (or, with a non-nil at, from
// the first message stored at or after at), at most maxBytes of them (0:
// 4 MiB), in one direct batch get, and calls fn with each in order. Each
// carries the headers Nats-Subject, Nats-Sequence, Nats-Time-Stamp and
// Nats-Num-Pending after any its publisher set (ServerHeader). It is the
// step a reader without a consumer pages through a stream with, one that
// may not create consumers (the operator role) included; like any direct
// get it may be answered by a replica that lags the leader.
func ReadPage(ctx context.Context, js jetstream.JetStream, stream, filter string, from uint64, at *time.Time, n, maxBytes int, fn func(*nats.Msg) error) (Page, error) {
	if maxBytes <= 0 {
		maxBytes = readPageBytes
	}
	n = min(max(n, 1), maxReadFrom)
	req := batchRequest{NextFor: filter, Seq: max(from, 1), Batch: n, MaxBytes: maxBytes}
	if at != nil {
		req.Seq, req.StartTime = 0, at
	}
	end, err := directBatch(ctx, js, stream, req, n, fn)
	if err != nil {
		return Page{}, fmt.Errorf("read %s in %s from %d: %w", filter, stream, from, err)
	}
	return Page{Answers: end.answers, LastSeq: end.lastSeq, Pending: end.pending}, nil
}

// LastPerSubjectUpTo is LastPerSubject among the messages with a sequence
// up to upto (0: the stream's last): the latest of each subject as the
// stream stood at a known point, from which a reader then follows on.
func LastPerSubjectUpTo(ctx context.Context, js jetstream.JetStream, stream string, filters []string, upto uint64, fn func(*nats.Msg) error) error {
	if _, err := directBatch(ctx, js, stream, batchRequest{MultiLastFor: filters, UpToSeq: upto}, maxBatchAnswers, fn); err != nil {
		return fmt.Errorf("read the last of %s in %s: %w", strings.Join(filters, " "), stream, err)
	}
	return nil
}

// LastPerSubject calls fn with the last message of every subject of stream
// matching filters (wildcards allowed), among the messages from sequence
// from on (0: the whole stream), in one direct batch read: a stream's
// "latest per key" without a consumer, for what is read now and then (the
// recovery service's probe targets, read from the outcomes and decisions
// stored anyway). Each message carries the headers Nats-Subject,
// Nats-Sequence and Nats-Time-Stamp. More than 1024 matching subjects is
// ErrTooManySubjects; a stream without direct gets, or a server before
// 2.11, ErrBatchUnavailable.
func LastPerSubject(ctx context.Context, js jetstream.JetStream, stream string, filters []string, from uint64, fn func(*nats.Msg) error) error {
	if _, err := directBatch(ctx, js, stream, batchRequest{MultiLastFor: filters, Seq: from}, maxBatchAnswers, fn); err != nil {
		return fmt.Errorf("read the last of %s in %s: %w", strings.Join(filters, " "), stream, err)
	}
	return nil
}

// directLastRequest is the direct-get request for the last message of a
// subject.
type directLastRequest struct {
	LastFor string `json:"last_by_subj"`
}

// LastSeq returns the stream sequence of the last message of stream whose
// subject matches subject (wildcards allowed); 0 when none does. One direct
// get, which needs the stream's allow_direct.
func LastSeq(ctx context.Context, js jetstream.JetStream, stream, subject string) (uint64, error) {
	req, err := json.Marshal(directLastRequest{LastFor: subject})
	if err != nil {
		return 0, err
	}
	m, err := directLast(ctx, js, apiPrefix(js.Options())+"DIRECT.GET."+stream, req)
	if err == nil && m == nil {
		return 0, nil // nothing on subject
	}
	var seq uint64
	if err == nil {
		seq, err = strconv.ParseUint(ServerHeader(m, jetstream.SequenceHeader), 10, 64)
	}
	if err != nil {
		return 0, fmt.Errorf("last sequence of %s in %s: %w", subject, stream, err)
	}
	return seq, nil
}

// directLast sends one direct get of a last message (the request subject
// api and its body, as the caller words it: a wildcard needs the body,
// a literal subject may go in the request's subject) and returns the
// message, nil when nothing matches. As in directBatch, a stored message
// carries the server's sequence (after any header its publisher set), a
// status answer none.
func directLast(ctx context.Context, js jetstream.JetStream, api string, body []byte) (*nats.Msg, error) {
	ctx, cancel := withDefaultTimeout(ctx, js)
	defer cancel()
	m, err := js.Conn().RequestWithContext(ctx, api, body)
	if err != nil {
		return nil, err
	}
	if ServerHeader(m, jetstream.SequenceHeader) == "" {
		if m.Header.Get("Status") == "404" {
			return nil, nil
		}
		return nil, fmt.Errorf("answer %q %s without a sequence", m.Header.Get("Status"), m.Header.Get("Description"))
	}
	return m, nil
}

// latestBatch is LatestEntries with one multi_last direct get
// (LastPerSubject).
func latestBatch(ctx context.Context, js jetstream.JetStream, bucket, keyFilter string) ([]jetstream.KeyValueEntry, error) {
	pre := "$KV." + bucket + "."
	var out []jetstream.KeyValueEntry
	err := LastPerSubject(ctx, js, "KV_"+bucket, []string{pre + keyFilter}, 0, func(m *nats.Msg) error {
		e, err := batchEntry(bucket, pre, m)
		if e != nil {
			out = append(out, e)
		}
		return err
	})
	if err != nil {
		return nil, err // names the bucket's stream and the filter
	}
	return out, nil
}

// maxBatchAnswers is the most messages nats-server answers one batch
// request with (its maxAllowedResponses), before the end-of-batch; more
// matching subjects are answered 413 Too Many Results.
const maxBatchAnswers = 1024

// batchEntry reads one answer of a batch read of bucket: nil for a
// deleted, purged or expired key.
func batchEntry(bucket, pre string, m *nats.Msg) (jetstream.KeyValueEntry, error) {
	if m.Header.Get("KV-Operation") != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return nil, nil
	}
	subj := ServerHeader(m, jetstream.SubjectHeader)
	key, ok := strings.CutPrefix(subj, pre)
	if !ok {
		return nil, fmt.Errorf("answer for subject %q outside the bucket", subj)
	}
	seq, err := strconv.ParseUint(ServerHeader(m, jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("answer for %s: sequence: %w", subj, err)
	}
	at, err := time.Parse(time.RFC3339Nano, ServerHeader(m, jetstream.TimeStampHeaer))
	if err != nil {
		return nil, fmt.Errorf("answer for %s: time stamp: %w", subj, err)
	}
	return &latestEntry{bucket: bucket, key: key, value: m.Data, rev: seq, at: at}, nil
}

// apiPrefix is the JetStream API prefix js sends requests under.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	}
	return "$JS.API."
}

// latestEntry is one live entry read by a batch read.
type latestEntry struct {
	bucket, key string
	value       []byte
	rev         uint64
	at          time.Time
}

func (e *latestEntry) Bucket() string                  { return e.bucket }
func (e *latestEntry) Key() string                     { return e.key }
func (e *latestEntry) Value() []byte                   { return e.value }
func (e *latestEntry) Revision() uint64                { return e.rev }
func (e *latestEntry) Created() time.Time              { return e.at }
func (e *latestEntry) Delta() uint64                   { return 0 }
func (e *latestEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }
