package dlq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/requeue"
	"github.com/failbus/failbus/internal/watch"
)

// Requeuer puts dead letters back on their original subjects, each once
// (see the package doc).
type Requeuer struct {
	// JS is the bus.
	JS jetstream.JetStream
	// By names who requeues, in the marks (user@host:pid). Required.
	By string
	// Now is the clock of the marks. Defaults to time.Now.
	Now func() time.Time
	// Stream is the dead-letter stream. Defaults to topology.StreamDLQ.
	Stream string

	// hook, when set (tests), runs after each durable step ("claimed",
	// "published"); an error stops the requeue there, as a crash would.
	hook func(step string) error
}

// Result says what one requeue did.
type Result struct {
	// DeadLetter is "<stream>:<seq>" of the dead letter.
	DeadLetter string `json:"dead_letter"`
	// Subject is where the copy went.
	Subject string `json:"subject"`
	// Stream and Seq say where the copy is stored.
	Stream string `json:"stream"`
	Seq    uint64 `json:"seq"`
	// Already is set when an earlier run had requeued it: nothing was
	// published now.
	Already bool `json:"already,omitempty"`
	// Resumed is set when this run finished an interrupted one.
	Resumed bool `json:"resumed,omitempty"`
	// Found is set when the copy an interrupted run had stored was found,
	// so nothing was published now.
	Found bool `json:"found,omitempty"`
	// Mark is the requeue record as it now stands.
	Mark *Mark `json:"mark"`
}

// maxTakeovers bounds the compare-and-set retries on a contested claim.
const maxTakeovers = 5

// findSlack is how far before a claim's time the search for an
// interrupted run's copy starts: the claim is dated by the operator's
// clock, the copy by the server's.
const findSlack = 10 * time.Minute

func (q *Requeuer) now() time.Time {
	if q.Now != nil {
		return q.Now()
	}
	return time.Now()
}

func (q *Requeuer) step(name string) error {
	if q.hook == nil {
		return nil
	}
	return q.hook(name)
}

// Requeue puts the dead letter at seq back on its original subject, once.
func (q *Requeuer) Requeue(ctx context.Context, seq uint64) (*Result, error) {
	if q.By == "" {
		return nil, errors.New("requeue: By is required")
	}
	l, err := Get(ctx, q.JS, q.Stream, seq)
	if err != nil {
		return nil, err
	}
	if l.DL == nil {
		return nil, fmt.Errorf("%s is not a dead letter: %w", l.ID(), l.Err)
	}
	orig, err := OriginalOf(ctx, q.JS, &l)
	if err != nil {
		return nil, err
	}
	target, err := q.JS.StreamNameBySubject(ctx, orig.Subject)
	if err != nil {
		return nil, fmt.Errorf("dead letter %s: no stream holds its subject %s: %w", l.ID(), orig.Subject, err)
	}
	kv, err := marksBucket(ctx, q.JS)
	if err != nil {
		return nil, err
	}
	res := &Result{DeadLetter: l.ID(), Subject: orig.Subject}
	key := markKey(l.Stream, l.Seq)
	dlID := dlMsgID(&l)

	// 1. Claim, or take over an unfinished claim.
	mk := &Mark{DeadLetter: l.ID(), DeadLetterMsgID: dlID, State: MarkClaimed, By: q.By, ClaimedAt: q.now().UTC(),
		Runs: 1, Subject: orig.Subject, Service: l.DL.Service}
	rev, err := kv.Create(ctx, key, encodeMark(mk))
	for i := 0; errors.Is(err, jetstream.ErrKeyExists); i++ {
		cur, curRev, gerr := getMark(ctx, q.JS, key)
		if gerr != nil {
			return nil, gerr
		}
		if cur == nil { // deleted meanwhile: claim afresh
			rev, err = kv.Create(ctx, key, encodeMark(mk))
			continue
		}
		if cur.DeadLetterMsgID != dlID {
			return nil, fmt.Errorf("requeue mark %s in %s belongs to another dead letter (%q, not %q): was the stream recreated? delete the key to requeue this one",
				key, kv.Bucket(), cur.DeadLetterMsgID, dlID)
		}
		if cur.State == MarkRequeued {
			res.Stream, res.Seq, res.Already, res.Mark = cur.Stream, cur.Seq, true, cur
			return res, nil
		}
		if i >= maxTakeovers {
			return nil, fmt.Errorf("requeue mark %s: changed by others %d times while taking it over", key, i)
		}
		cur.By, cur.Runs = q.By, cur.Runs+1
		mk, res.Resumed = cur, true
		rev, err = kv.Update(ctx, key, encodeMark(mk), curRev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			err = jetstream.ErrKeyExists // someone else moved it: look again
		}
	}
	if err != nil {
		return nil, fmt.Errorf("claim requeue mark %s: %w", key, err)
	}
	if err := q.step("claimed"); err != nil {
		return nil, err
	}

	// 2. Publish, unless an interrupted run already stored the copy.
	if res.Resumed {
		seq, err := findCopy(ctx, q.JS, target, orig.Subject, l.ID(), mk.ClaimedAt.Add(-findSlack))
		if err != nil {
			return nil, err
		}
		if seq != 0 {
			res.Stream, res.Seq, res.Found = target, seq, true
		}
	}
	if !res.Found {
		ack, err := q.JS.PublishMsg(ctx, copyOf(orig, &l))
		if err != nil {
			return nil, fmt.Errorf("publish %s to %s: %w", l.ID(), orig.Subject, err)
		}
		res.Stream, res.Seq = ack.Stream, ack.Sequence
	}
	if err := q.step("published"); err != nil {
		return nil, err
	}

	// 3. Mark it done, with where the copy is.
	mk.State, mk.Stream, mk.Seq, mk.RequeuedAt = MarkRequeued, res.Stream, res.Seq, q.now().UTC()
	if _, err := kv.Update(ctx, key, encodeMark(mk), rev); err != nil {
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, fmt.Errorf("mark %s requeued (the copy is stored at %s:%d): %w", key, res.Stream, res.Seq, err)
		}
		// Another run took the claim over meanwhile; it publishes the
		// same message id and finds or dedupes this copy.
		cur, _, gerr := getMark(ctx, q.JS, key)
		if gerr != nil {
			return nil, gerr
		}
		res.Mark = cur
		return res, nil
	}
	res.Mark = mk
	return res, nil
}

// dlMsgID is the dead letter's own Nats-Msg-Id, or its position when it
// has none.
func dlMsgID(l *Letter) string {
	if l.MsgID != "" {
		return l.MsgID
	}
	return l.ID()
}

func encodeMark(mk *Mark) []byte {
	b, _ := json.Marshal(mk) // plain fields: cannot fail
	return b
}

// copyOf is the message requeue publishes: the original bytes and
// headers, with the requeue headers, a message id derived from the dead
// letter (the original's is kept in Failbus-Requeued-Msg-Id), and none of
// the publish expectations the original may have carried (they held for
// the first publish, not for this one).
func copyOf(orig *Original, l *Letter) *nats.Msg {
	h := nats.Header{}
	for k, vs := range orig.Header {
		if strings.HasPrefix(k, "Nats-Expected-") || k == "Nats-Rollup" || k == nats.MsgIdHdr {
			continue
		}
		h[k] = append([]string(nil), vs...)
	}
	if id := orig.Header.Get(nats.MsgIdHdr); id != "" && h.Get(requeue.HeaderMsgID) == "" {
		h.Set(requeue.HeaderMsgID, id)
	}
	h.Set(requeue.HeaderFrom, l.ID())
	h.Set(requeue.HeaderFor, l.DL.Service)
	h.Set(nats.MsgIdHdr, requeue.MsgID(l.Stream, l.Seq))
	return &nats.Msg{Subject: orig.Subject, Header: h, Data: orig.Data}
}

// findCopy looks for the copy of the dead letter from (its
// Failbus-Requeued-From) on subject in stream, stored at or after since,
// reading headers only; 0 when there is none.
func findCopy(ctx context.Context, js jetstream.JetStream, stream, subject, from string, since time.Time) (uint64, error) {
	var found uint64
	err := watch.Read(ctx, js, watch.Config{
		Stream: stream, Filters: []string{subject}, HeadersOnly: true,
		DeliverPolicy: jetstream.DeliverByStartTimePolicy, StartTime: &since,
	}, func(m jetstream.Msg) error {
		if m.Headers().Get(requeue.HeaderFrom) != from {
			return nil
		}
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		found = md.Sequence.Stream
		return watch.ErrStop
	})
	if err != nil {
		return 0, fmt.Errorf("look for an earlier copy of %s on %s: %w", from, subject, err)
	}
	return found, nil
}
