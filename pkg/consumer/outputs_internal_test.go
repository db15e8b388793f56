package consumer

import (
	"fmt"
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// An output key used twice is refused whether the outputs are few or
// many, wherever the first use was; keys left empty take their index and
// collide like any other.
func TestOutputsRefuseARepeatedKey(t *testing.T) {
	t.Parallel()
	d := &events.Decision{OutcomeID: "o-1", Agent: "a", Action: events.ActionGiveUp}
	tests := []struct {
		name   string
		keys   []string // published in order
		repeat string   // "": no repeat, every key unique
	}{
		{"one output", []string{"decision"}, ""},
		{"a few, unique", []string{"ledger", "schedule", "decision"}, ""},
		{"a few, the first repeated", []string{"a", "b", "c", "a"}, "a"},
		{"a few, the last repeated", []string{"a", "b", "c", "c"}, "c"},
		{"many, unique", keysN(24), ""},
		{"many, an early one repeated", append(keysN(16), "k0"), "k0"},
		{"many, a middle one repeated", append(keysN(16), "k9"), "k9"},
		{"many, the last repeated", append(keysN(8), "k7"), "k7"},
		{"an index key taken by a name", []string{"2", "x", ""}, "2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := &Outputs{service: "svc", inputID: "in-1"}
			for _, k := range tt.keys {
				o.Publish("failbus.decision.a", d, k)
			}
			switch {
			case tt.repeat == "" && o.err != nil:
				t.Fatalf("unique keys refused: %v", o.err)
			case tt.repeat == "" && o.Len() != len(tt.keys):
				t.Fatalf("%d outputs, want %d", o.Len(), len(tt.keys))
			case tt.repeat != "" && (o.err == nil || !strings.Contains(o.err.Error(), fmt.Sprintf("%q used twice", tt.repeat))):
				t.Fatalf("repeated key %q: err %v", tt.repeat, o.err)
			}
		})
	}
}

func keysN(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("k%d", i)
	}
	return out
}
