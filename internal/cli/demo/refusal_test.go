package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// The refusal scenario walks one segment's whole life and says so.
func TestCLIDemoRefusalScenario(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := runScenarios(context.Background(), []demoScenario{refusalScenario}, zerolog.Nop(), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"bounded re-probes at +50ms, +200ms, +1.2s after the latest refusal",
		"(send 1 of this segment)",
		"may be re-probed (3 of 3)",
		"notify normal  provider-refusal:demo-session#1:0:strict-llm",
		"notify critical  provider-refusal:demo-session#1:3:strict-llm",
		"strict-llm frozen in every one",
		"received segment demo-session#1 4 times in all",
		"segment demo-session#2: allowed strict-llm, fallback-llm",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
