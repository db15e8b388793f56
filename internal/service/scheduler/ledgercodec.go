package scheduler

import (
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/wire"
	"github.com/failbus/failbus/pkg/events"
)

// ledgerWire is a ledger entry's msgpack codec (wire.FieldTable): the
// scheduler writes one for every retry it schedules and reads the budget's
// last one back, and msgpack's reflection was most of that cost. Its keys
// are retry.Record's, inlined, then the marks'; TestLedgerCodecMatches-
// Reflection holds it to what reflection writes and reads.
var ledgerWire = wire.NewFieldTable(
	wire.StringField("retry_id", false, func(e *LedgerEntry) *string { return &e.RetryID }),
	wire.StringField("outcome_id", false, func(e *LedgerEntry) *string { return &e.OutcomeID }),
	wire.StringField("agent", false, func(e *LedgerEntry) *string { return &e.Agent }),
	wire.StringField("session", true, func(e *LedgerEntry) *string { return &e.Session }),
	wire.IntField("turn", false, func(e *LedgerEntry) *int { return &e.Turn }),
	wire.IntField("step", false, func(e *LedgerEntry) *int { return &e.Step }),
	wire.StringField("provider", false, func(e *LedgerEntry) *string { return &e.Provider }),
	wire.StringField("model", true, func(e *LedgerEntry) *string { return &e.Model }),
	wire.StringField("profile", true, func(e *LedgerEntry) *string { return &e.Profile }),
	wire.StringField("policy_key", false, func(e *LedgerEntry) *string { return &e.PolicyKey }),
	wire.IntField("retry", false, func(e *LedgerEntry) *int { return &e.Retry }),
	wire.IntField("seq", true, func(e *LedgerEntry) *int { return &e.Seq }),
	wire.TimeField("ended_at", true, func(e *LedgerEntry) *events.Time { return &e.EndedAt }),
	wire.StringField("ended_by", true, func(e *LedgerEntry) *string { return &e.EndedBy }),
	wire.Uint64Field("episode_from", true, func(e *LedgerEntry) *uint64 { return &e.EpisodeFrom }),
	wire.StringField("class", false, func(e *LedgerEntry) *string { return &e.Class }),
	wire.Int64Field("delay_ms", false, func(e *LedgerEntry) *int64 { return &e.DelayMS }),
	wire.TimeField("at", false, func(e *LedgerEntry) *events.Time { return &e.At }),
	wire.TimeField("due_at", false, func(e *LedgerEntry) *events.Time { return &e.DueAt }),
	wire.StringField("delay_source", false, func(e *LedgerEntry) *string { return &e.DelaySource }),
	wire.StringField("reason", true, func(e *LedgerEntry) *string { return &e.Reason }),
	wire.TimeField("cancelled_at", true, func(e *LedgerEntry) *events.Time { return &e.CancelledAt }),
	wire.TimeField("started_at", true, func(e *LedgerEntry) *events.Time { return &e.StartedAt }),
)

var (
	_ msgpack.CustomEncoder = (*LedgerEntry)(nil)
	_ msgpack.CustomDecoder = (*LedgerEntry)(nil)
)

// EncodeMsgpack writes the entry without reflection (ledgerWire).
func (e LedgerEntry) EncodeMsgpack(enc *msgpack.Encoder) error { return ledgerWire.Encode(enc, &e) }

// DecodeMsgpack reads an entry without reflection (ledgerWire).
func (e *LedgerEntry) DecodeMsgpack(dec *msgpack.Decoder) error { return ledgerWire.Decode(dec, e) }
