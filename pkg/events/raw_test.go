package events_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// TestARawHoldingJSONIsRefusedWhenEncoded: a task whose payload holds JSON
// bytes (events.Raw looks like json.RawMessage) does not encode, with an
// error that says what it holds and how to build one; RawOf and RawJSON
// build the payload a dispatch gives back as the same JSON.
func TestARawHoldingJSONIsRefusedWhenEncoded(t *testing.T) {
	t.Parallel()
	bad := &events.Task{ID: "t1", Agent: "coord", Provider: "openai", Payload: events.Raw(`{"doc":"q3.pdf","pages":12}`)}
	_, _, err := events.Encode(bad)
	if !errors.Is(err, events.ErrRawNotMsgpack) || !strings.Contains(err.Error(), "JSON text") || !strings.Contains(err.Error(), "events.RawJSON") {
		t.Fatalf("encoding a JSON payload: %v; want ErrRawNotMsgpack saying it is JSON and how to build one", err)
	}
	type job struct {
		Doc   string `json:"doc"`
		Pages int    `json:"pages"`
	}
	fromValue, err := events.RawOf(job{Doc: "q3.pdf", Pages: 12})
	if err != nil {
		t.Fatal(err)
	}
	fromJSON, err := events.RawJSON([]byte(`{"pages":12,"doc":"q3.pdf"}`))
	if err != nil {
		t.Fatal(err)
	}
	if string(fromValue) != string(fromJSON) {
		t.Errorf("RawOf and RawJSON of one value differ: %x, %x", fromValue, fromJSON)
	}
	good := &events.Task{ID: "t1", Agent: "coord", Provider: "openai", Payload: fromValue}
	data, _, err := events.Encode(good)
	if err != nil {
		t.Fatal(err)
	}
	back, err := events.DecodeAs[*events.Task](events.TaskSubject("openai", "coord"), nil, data)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(back.Payload)
	if string(js) != `{"doc":"q3.pdf","pages":12}` {
		t.Errorf("payload back as JSON: %s", js)
	}
	if err := events.Raw(nil).Check(); err != nil {
		t.Errorf("an absent payload: %v", err)
	}
	if err := (events.Raw{0xc1}).Check(); !errors.Is(err, events.ErrRawNotMsgpack) {
		t.Errorf("a byte msgpack never writes: %v", err)
	}
}
