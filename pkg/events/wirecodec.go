package events

import (
	"github.com/vmihailenco/msgpack/v5"

	"github.com/failbus/failbus/internal/wire"
)

var outcomeWire = wire.NewFieldTable(
	wire.StringField("id", false, func(o *Outcome) *string { return &o.ID }),
	wire.TimeField("at", false, func(o *Outcome) *Time { return &o.At }),
	wire.StringField("agent", false, func(o *Outcome) *string { return &o.Agent }),
	wire.StringField("session", true, func(o *Outcome) *string { return &o.Session }),
	wire.IntField("segment", true, func(o *Outcome) *int { return &o.Segment }),
	wire.IntField("turn", true, func(o *Outcome) *int { return &o.Turn }),
	wire.IntField("step", true, func(o *Outcome) *int { return &o.Step }),
	wire.StringField("provider", false, func(o *Outcome) *string { return &o.Provider }),
	wire.StringField("model", true, func(o *Outcome) *string { return &o.Model }),
	wire.StringField("profile", true, func(o *Outcome) *string { return &o.Profile }),
	wire.BoolField("ok", false, func(o *Outcome) *bool { return &o.OK }),
	wire.IntField("status", true, func(o *Outcome) *int { return &o.Status }),
	wire.StringField("body", true, func(o *Outcome) *string { return &o.Body }),
	wire.ReflectField("headers", func(o *Outcome) bool { return len(o.Headers) == 0 }, func(o *Outcome) *map[string]string { return &o.Headers }),
	wire.StringField("transport_error", true, func(o *Outcome) *string { return &o.TransportError }),
	wire.StringField("upstream_code", true, func(o *Outcome) *string { return &o.UpstreamCode }),
	wire.StringField("stop_reason", true, func(o *Outcome) *string { return &o.StopReason }),
	wire.StringField("refusal_scope", true, func(o *Outcome) *string { return &o.RefusalScope }),
	wire.IntField("request_tokens", true, func(o *Outcome) *int { return &o.RequestTokens }),
	wire.IntField("context_window", true, func(o *Outcome) *int { return &o.ContextWindow }),
	wire.IntField("max_output_tokens", true, func(o *Outcome) *int { return &o.MaxOutputTokens }),
	wire.ReflectField("origin", func(o *Outcome) bool { return o.Origin == nil }, func(o *Outcome) **Origin { return &o.Origin }),
)

var classificationWire = wire.NewFieldTable(
	wire.StringField("outcome_id", false, func(c *Classification) *string { return &c.OutcomeID }),
	wire.TimeField("at", true, func(c *Classification) *Time { return &c.At }),
	wire.StringField("agent", true, func(c *Classification) *string { return &c.Agent }),
	wire.StringField("provider", true, func(c *Classification) *string { return &c.Provider }),
	wire.StringField("model", true, func(c *Classification) *string { return &c.Model }),
	wire.StringField("profile", true, func(c *Classification) *string { return &c.Profile }),
	wire.StringField("class", false, func(c *Classification) *string { return &c.Class }),
	wire.BoolField("retryable", false, func(c *Classification) *bool { return &c.Retryable }),
	wire.StringField("scope", true, func(c *Classification) *string { return &c.Scope }),
	wire.StringField("rule", false, func(c *Classification) *string { return &c.Rule }),
	wire.ReflectField("evidence", func(c *Classification) bool { return len(c.Evidence) == 0 }, func(c *Classification) *[]string { return &c.Evidence }),
	wire.StringField("overruled", true, func(c *Classification) *string { return &c.Overruled }),
	wire.ReflectField("hints", func(c *Classification) bool { return c.Hints == nil }, func(c *Classification) **RetryHints { return &c.Hints }),
	wire.StringField("session", true, func(c *Classification) *string { return &c.Session }),
	wire.IntField("segment", true, func(c *Classification) *int { return &c.Segment }),
	wire.IntField("turn", true, func(c *Classification) *int { return &c.Turn }),
	wire.IntField("step", true, func(c *Classification) *int { return &c.Step }),
	wire.StringField("refusal_scope", true, func(c *Classification) *string { return &c.RefusalScope }),
)

var decisionWire = wire.NewFieldTable(
	wire.StringField("outcome_id", false, func(d *Decision) *string { return &d.OutcomeID }),
	wire.TimeField("at", true, func(d *Decision) *Time { return &d.At }),
	wire.StringField("agent", false, func(d *Decision) *string { return &d.Agent }),
	wire.StringField("action", false, func(d *Decision) *string { return &d.Action }),
	wire.StringField("reason", true, func(d *Decision) *string { return &d.Reason }),
	wire.StringField("class", true, func(d *Decision) *string { return &d.Class }),
	wire.StringField("rule", true, func(d *Decision) *string { return &d.Rule }),
	wire.Int64Field("delay_ms", true, func(d *Decision) *int64 { return &d.DelayMS }),
	wire.TimeField("due_at", true, func(d *Decision) *Time { return &d.DueAt }),
	wire.IntField("retry", true, func(d *Decision) *int { return &d.Retry }),
	wire.StringField("retry_id", true, func(d *Decision) *string { return &d.RetryID }),
	wire.StringField("provider", true, func(d *Decision) *string { return &d.Provider }),
	wire.StringField("model", true, func(d *Decision) *string { return &d.Model }),
	wire.StringField("profile", true, func(d *Decision) *string { return &d.Profile }),
)

var (
	_ msgpack.CustomEncoder = (*Outcome)(nil)
	_ msgpack.CustomDecoder = (*Outcome)(nil)
	_ msgpack.CustomEncoder = (*Classification)(nil)
	_ msgpack.CustomDecoder = (*Classification)(nil)
	_ msgpack.CustomEncoder = (*Decision)(nil)
	_ msgpack.CustomDecoder = (*Decision)(nil)
)

// EncodeMsgpack writes the outcome without reflection (wirecodec.go).
func (o Outcome) EncodeMsgpack(enc *msgpack.Encoder) error { return outcomeWire.Encode(enc, &o) }

// DecodeMsgpack reads an outcome without reflection (wirecodec.go).
func (o *Outcome) DecodeMsgpack(dec *msgpack.Decoder) error { return outcomeWire.Decode(dec, o) }

// EncodeMsgpack writes the classification without reflection (wirecodec.go).
func (c Classification) EncodeMsgpack(enc *msgpack.Encoder) error {
	return classificationWire.Encode(enc, &c)
}

// DecodeMsgpack reads a classification without reflection (wirecodec.go).
func (c *Classification) DecodeMsgpack(dec *msgpack.Decoder) error {
	return classificationWire.Decode(dec, c)
}

// EncodeMsgpack writes the decision without reflection (wirecodec.go).
func (d Decision) EncodeMsgpack(enc *msgpack.Encoder) error { return decisionWire.Encode(enc, &d) }

// DecodeMsgpack reads a decision without reflection (wirecodec.go).
func (d *Decision) DecodeMsgpack(dec *msgpack.Decoder) error { return decisionWire.Decode(dec, d) }
