package scheduler

// The retry ledger: one subject per budget in FAILBUS_RETRIES,
// events.RetryLedgerSubject(retry.BudgetKey.Token()), holding LedgerEntry
// messages in order. The last one is the budget's state (its Retry is the
// count spent); earlier ones are the history a redelivered outcome is looked
// up in. Appends are compare-and-set on the subject's last sequence.

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/jspub"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// SchemaLedgerEntry is the Failbus-Schema name of a LedgerEntry.
const SchemaLedgerEntry = "retry_ledger"

// LedgerEntry is one message of a budget's ledger: the retry record written
// before the wait (retry.Record, with the same keys), and the
// agent's answer to it once it came: started or cancelled, whichever came
// first. A mark is a new entry with the same record, so the last entry of a
// budget always carries the budget's count.
type LedgerEntry struct {
	retry.Record
	// CancelledAt is when the agent cancelled the pending retry; zero when
	// it did not.
	CancelledAt events.Time `msgpack:"cancelled_at,omitempty" json:"cancelled_at,omitzero"`
	// StartedAt is when the agent started the retry after it came due;
	// zero when it did not (yet).
	StartedAt events.Time `msgpack:"started_at,omitempty" json:"started_at,omitzero"`
}

// SchemaName implements events.Message.
func (*LedgerEntry) SchemaName() string { return SchemaLedgerEntry }

// Validate implements events.Message: an entry names its retry, its budget
// and a retry number.
func (e *LedgerEntry) Validate() error {
	for _, f := range []struct{ name, v string }{
		{"retry_id", e.RetryID}, {"outcome_id", e.OutcomeID}, {"agent", e.Agent},
		{"provider", e.Provider}, {"policy_key", e.PolicyKey},
	} {
		if f.v == "" {
			return &events.FieldError{Field: f.name, Problem: "required"}
		}
	}
	if e.Retry < 1 {
		return &events.FieldError{Field: "retry", Problem: "must be >= 1"}
	}
	return nil
}

// Cancelled reports whether the agent cancelled the retry.
func (e *LedgerEntry) Cancelled() bool { return !e.CancelledAt.IsZero() }

// Started reports whether the agent started the retry.
func (e *LedgerEntry) Started() bool { return !e.StartedAt.IsZero() }

// ledgerRead is an entry as stored, with its stream sequence.
type ledgerRead struct {
	entry LedgerEntry
	seq   uint64
}

// errLedgerConflict: another writer appended to the budget first.
var errLedgerConflict = errors.New("ledger: the budget changed since it was read")

// DecodeLedgerEntry reads a ledger message (for tools and tests that audit
// the ledger).
func DecodeLedgerEntry(h nats.Header, data []byte) (*LedgerEntry, error) {
	if v := h.Get(events.HeaderSchema); v != "" {
		name, ver, err := events.ParseSchemaHeader(v)
		if err != nil {
			return nil, err
		}
		if name != SchemaLedgerEntry {
			return nil, fmt.Errorf("got a %s message on the ledger, want %s", name, SchemaLedgerEntry)
		}
		if ver > events.CurrentVersion {
			return nil, fmt.Errorf("ledger entry version %d is newer than this reader (%d)", ver, events.CurrentVersion)
		}
	}
	var e LedgerEntry
	if err := events.Unmarshal(data, &e); err != nil {
		return nil, err
	}
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("invalid ledger entry: %w", err)
	}
	return &e, nil
}

func decodeRaw(m *jetstream.RawStreamMsg) (*ledgerRead, error) {
	e, err := DecodeLedgerEntry(m.Header, m.Data)
	if err != nil {
		return nil, fmt.Errorf("ledger %s seq %d: %w", m.Subject, m.Sequence, err)
	}
	return &ledgerRead{entry: *e, seq: m.Sequence}, nil
}

// ledgerLast reads the budget's last entry; nil when the budget is
// untouched. The index learns the budget's last sequence. Reads of
// concurrent handlers go to the server together (streamread.LastReader).
func (s *Service) ledgerLast(ctx context.Context, token string) (*ledgerRead, error) {
	subj := events.RetryLedgerSubject(token)
	reads := s.ledgerReads
	if s.replicated && isCurrent(ctx) {
		reads = s.leaderReads
	}
	m, err := reads.Last(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		s.index.sawLast(token, nil)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read ledger %s: %w", subj, err)
	}
	r, err := decodeRaw(m)
	if err != nil {
		return nil, err
	}
	s.index.sawLast(token, r)
	return r, nil
}

// ledgerFind returns the latest entry of the budget written for outcomeID
// (its record, or the started or cancel mark appended after it), or nil.
// The latest, not the first: a redelivery that finds the record behind a
// later retry must still see that the agent cancelled it, or it would
// restore a purged schedule. The budget of an outcome without turn and
// step holds many retry episodes, and only entries after from, the stream
// sequence its current episode began after (retry.Record.EpisodeFrom),
// count. It reads only the entries the index has not seen
// (ledgerindex.go): none when the index has seen the budget up to the last
// sequence ledgerLast read just before (engine.Decide reads the last entry
// first), else those after its watermark (or after from, when that is
// later). The walk it replaces read every entry of the budget for every
// failure whose budget's last entry was not its own.
func (s *Service) ledgerFind(ctx context.Context, token, outcomeID string, from uint64) (*ledgerRead, error) {
	found, next, ok := s.index.find(token, outcomeID, from)
	if ok {
		return found, nil
	}
	subj := events.RetryLedgerSubject(token)
	var read []*ledgerRead
	seq := next
	for {
		m, err := s.retriesMsg(ctx, streamread.MsgQuery{Seq: seq, NextFor: subj})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read ledger %s from seq %d: %w", subj, seq, err)
		}
		r, err := decodeRaw(m)
		if err != nil {
			return nil, err
		}
		read = append(read, r)
		seq = m.Sequence + 1
	}
	return s.index.scanned(token, next, read, outcomeID, from), nil
}

// ledgerAppend stores e as the budget's new last entry if the budget's last
// sequence is still expect (0: untouched); otherwise errLedgerConflict. The
// Nats-Msg-Id is "scheduler:<retry id>:<kind>". A duplicate acknowledgement
// counts as success only when the stored message is this very entry; dup
// says it was one.
func (s *Service) ledgerAppend(ctx context.Context, e *LedgerEntry, expect uint64, kind string) (seq uint64, dup bool, err error) {
	subj := events.RetryLedgerSubject(e.Budget().Token())
	msgID := Name + ":" + e.RetryID + ":" + kind
	ack, err := s.publish(ctx, subj, e, msgID, nil, jetstream.WithExpectLastSequencePerSubject(expect))
	if streamread.IsWrongLastSeq(err) {
		return 0, false, errLedgerConflict
	}
	if err != nil {
		return 0, false, err
	}
	if ack.Duplicate {
		// Just acknowledged: a replica may not hold it yet.
		m, err := s.retriesMsg(withCurrent(ctx), streamread.MsgQuery{Seq: ack.Sequence})
		if err != nil {
			return 0, false, fmt.Errorf("read back ledger %s seq %d: %w", subj, ack.Sequence, err)
		}
		r, err := decodeRaw(m)
		if err != nil {
			return 0, false, err
		}
		if r.entry.OutcomeID != e.OutcomeID || r.entry.RetryID != e.RetryID ||
			r.entry.Cancelled() != e.Cancelled() || r.entry.Started() != e.Started() || r.entry.EndedBy != e.EndedBy {
			return 0, false, errLedgerConflict
		}
		return ack.Sequence, true, nil
	}
	s.index.appended(e.Budget().Token(), expect, &ledgerRead{entry: *e, seq: ack.Sequence})
	return ack.Sequence, false, nil
}

// retriesMsg reads the one message of FAILBUS_RETRIES q names (the
// ledger's entries, a pending schedule): from the stream's leader when
// ctx asks for current reads of a replicated stream (current.go), else by
// the stream's own get (a direct get).
func (s *Service) retriesMsg(ctx context.Context, q streamread.MsgQuery) (*jetstream.RawStreamMsg, error) {
	switch {
	case s.replicated && isCurrent(ctx):
		return streamread.LeaderGet(ctx, s.js, topology.StreamRetries, q)
	case q.LastFor != "":
		return s.retries.GetLastMsgForSubject(ctx, q.LastFor)
	case q.NextFor != "":
		return s.retries.GetMsg(ctx, q.Seq, jetstream.WithGetMsgSubject(q.NextFor))
	}
	return s.retries.GetMsg(ctx, q.Seq)
}

// publish stores v on subject with Nats-Msg-Id msgID and extra headers
// (jspub.Publish) and waits for the stream's acknowledgement.
func (s *Service) publish(ctx context.Context, subject string, v events.Message, msgID string, extra nats.Header, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return jspub.Publish(ctx, s.js, subject, v, msgID, extra, opts...)
}
