package consumer

import (
	"fmt"
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// An output key used twice is refused whether the outputs are few (keys
// scanned) or many (keys in a map), wherever the first use was; keys left
// empty take their index and collide like any other.
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
		{"many, unique", keysN(3 * outputKeyScan), ""},
		{"many, an early one repeated", append(keysN(2*outputKeyScan), "k0"), "k0"},
		{"many, one past the scan repeated", append(keysN(2*outputKeyScan), fmt.Sprintf("k%d", outputKeyScan+1)), fmt.Sprintf("k%d", outputKeyScan+1)},
		{"at the scan's edge", append(keysN(outputKeyScan), fmt.Sprintf("k%d", outputKeyScan-1)), fmt.Sprintf("k%d", outputKeyScan-1)},
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
