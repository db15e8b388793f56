package consumer_test

import (
	"testing"

	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// ValueAs decodes a message once: the value it decoded (or the runner's
// Decode did) is what the next caller gets, and bytes that do not decode
// are an error that names the problem.
func TestValueAsDecodesOnce(t *testing.T) {
	c := &events.Classification{OutcomeID: "o-1", Agent: "a", Provider: "openai", Class: events.ClassServerError, Rule: "test"}
	data, hdr, err := events.Encode(c)
	if err != nil {
		t.Fatal(err)
	}
	m := &consumer.Msg{Subject: events.ClassifiedSubject(c.Provider, c.Class), Header: hdr, Data: data}
	first, err := consumer.ValueAs[*events.Classification](m)
	if err != nil || first.OutcomeID != "o-1" {
		t.Fatalf("first: %+v, %v", first, err)
	}
	again, err := consumer.ValueAs[*events.Classification](m)
	if err != nil || again != first {
		t.Fatalf("second call decoded again (%p, was %p), %v", again, first, err)
	}

	bad := &consumer.Msg{Subject: m.Subject, Header: hdr, Data: []byte{0xc1}}
	if v, err := consumer.ValueAs[*events.Classification](bad); err == nil || bad.Value != nil {
		t.Fatalf("undecodable bytes: %+v, %v, Value %v; want an error and nothing kept", v, err, bad.Value)
	}
}
