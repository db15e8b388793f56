package invariant_test

import (
	"errors"
	"fmt"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/invariant"
)

// sseEvent stands for a provider's streamed event (here shaped like
// Anthropic's Messages stream).
type sseEvent struct {
	Type  string // message_start, content_block_start, content_block_delta, content_block_stop, message_delta, message_stop, ping
	Index int
	Block string
}

// anthropicGrammar maps the provider's events onto the grammar.
func anthropicGrammar(e sseEvent) (invariant.Event, bool) {
	switch e.Type {
	case "content_block_start":
		return invariant.Event{Type: invariant.BlockStart, Index: e.Index, Block: e.Block}, true
	case "content_block_delta":
		return invariant.Event{Type: invariant.Delta, Index: e.Index}, true
	case "content_block_stop":
		return invariant.Event{Type: invariant.BlockEnd, Index: e.Index}, true
	case "message_delta":
		return invariant.Event{Type: invariant.Usage}, true
	case "message_stop":
		return invariant.Event{Type: invariant.Finish}, true
	}
	return invariant.Event{}, false // message_start, ping: not grammar
}

// A provider stream whose adapter forgot to open the block: the consumer
// sees nothing past the first bad event, and the call is reported as an
// outcome the classifier files as `invariant`.
func ExampleStream() {
	provider := func(yield func(sseEvent, error) bool) {
		for _, e := range []sseEvent{{Type: "message_start"}, {Type: "content_block_delta"}, {Type: "message_stop"}} {
			if !yield(e, nil) {
				return
			}
		}
	}
	for e, err := range invariant.Stream(provider, anthropicGrammar) {
		var v *invariant.Violation
		if errors.As(err, &v) {
			o := v.Outcome(events.Outcome{ID: "call-1", Agent: "bot", Provider: "anthropic", Status: 200})
			fmt.Println(v.Rule)
			fmt.Println(o.TransportError)
			break
		}
		fmt.Println("consumer got", e.Type)
	}
	// Output:
	// consumer got message_start
	// delta_in_open_block
	// stream invariant violated: delta_in_open_block at event 1: delta into block 0, which is not open
}
