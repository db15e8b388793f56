package cli

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/failbus/failbus/pkg/events"
)

// Ways PayloadJSON renders a payload (its second result).
const (
	PayloadMsgpack = "msgpack" // msgpack, shown as the JSON of its value
	PayloadText    = "text"    // UTF-8 text, shown as a JSON string
	PayloadBase64  = "base64"  // anything else, shown as base64
)

// PayloadJSON renders bytes of unknown shape for people — a dead letter's
// original payload, say: msgpack as the JSON of its value, else UTF-8 text
// as a JSON string, else base64. as says which (PayloadMsgpack, …).
func PayloadJSON(data []byte) (out json.RawMessage, as string) {
	if b, err := events.MsgpackToJSON(data); err == nil {
		return b, PayloadMsgpack
	}
	if utf8.Valid(data) {
		b, _ := json.Marshal(string(data))
		return b, PayloadText
	}
	b, _ := json.Marshal(data)
	return b, PayloadBase64
}

// DeadLetterJSON renders a dead letter for people: its fields, with the
// payload it carries decoded where it decodes (PayloadJSON) and data_as
// saying how.
func DeadLetterJSON(dl *events.DeadLetter) ([]byte, error) {
	type plain events.DeadLetter // the same fields, without a Data override
	v := struct {
		*plain
		Data   json.RawMessage `json:"data"`
		DataAs string          `json:"data_as"`
	}{plain: (*plain)(dl)}
	v.Data, v.DataAs = PayloadJSON(dl.Data)
	return json.Marshal(v)
}
