package scheduler

import (
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/pkg/events"
)

// ledgerWire is a ledger entry's msgpack codec (events.FieldTable): the
// scheduler writes one for every retry it schedules and reads the budget's
// last one back, and msgpack's reflection was most of that cost. Its keys
// are retry.Record's, inlined, then the marks'; TestLedgerCodecMatches-
// Reflection holds it to what reflection writes and reads.
var ledgerWire = events.NewFieldTable(
	events.StringField("retry_id", false, func(e *LedgerEntry) *string { return &e.RetryID }),
	events.StringField("outcome_id", false, func(e *LedgerEntry) *string { return &e.OutcomeID }),
	events.StringField("agent", false, func(e *LedgerEntry) *string { return &e.Agent }),
	events.StringField("session", true, func(e *LedgerEntry) *string { return &e.Session }),
	events.IntField("turn", false, func(e *LedgerEntry) *int { return &e.Turn }),
	events.IntField("step", false, func(e *LedgerEntry) *int { return &e.Step }),
	events.StringField("provider", false, func(e *LedgerEntry) *string { return &e.Provider }),
	events.StringField("model", true, func(e *LedgerEntry) *string { return &e.Model }),
	events.StringField("profile", true, func(e *LedgerEntry) *string { return &e.Profile }),
	events.StringField("policy_key", false, func(e *LedgerEntry) *string { return &e.PolicyKey }),
	events.IntField("retry", false, func(e *LedgerEntry) *int { return &e.Retry }),
	events.IntField("seq", true, func(e *LedgerEntry) *int { return &e.Seq }),
	events.TimeField("ended_at", true, func(e *LedgerEntry) *events.Time { return &e.EndedAt }),
	events.StringField("ended_by", true, func(e *LedgerEntry) *string { return &e.EndedBy }),
	events.Uint64Field("episode_from", true, func(e *LedgerEntry) *uint64 { return &e.EpisodeFrom }),
	events.StringField("class", false, func(e *LedgerEntry) *string { return &e.Class }),
	events.Int64Field("delay_ms", false, func(e *LedgerEntry) *int64 { return &e.DelayMS }),
	events.TimeField("at", false, func(e *LedgerEntry) *events.Time { return &e.At }),
	events.TimeField("due_at", false, func(e *LedgerEntry) *events.Time { return &e.DueAt }),
	events.StringField("delay_source", false, func(e *LedgerEntry) *string { return &e.DelaySource }),
	events.StringField("reason", true, func(e *LedgerEntry) *string { return &e.Reason }),
	events.TimeField("cancelled_at", true, func(e *LedgerEntry) *events.Time { return &e.CancelledAt }),
	events.TimeField("started_at", true, func(e *LedgerEntry) *events.Time { return &e.StartedAt }),
)

var (
	_ msgpack.CustomEncoder = (*LedgerEntry)(nil)
	_ msgpack.CustomDecoder = (*LedgerEntry)(nil)
)

// EncodeMsgpack writes the entry without reflection (ledgerWire).
func (e LedgerEntry) EncodeMsgpack(enc *msgpack.Encoder) error { return ledgerWire.Encode(enc, &e) }

// DecodeMsgpack reads an entry without reflection (ledgerWire).
func (e *LedgerEntry) DecodeMsgpack(dec *msgpack.Decoder) error { return ledgerWire.Decode(dec, e) }
