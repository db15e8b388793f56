package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// The retry scenario shows the 429 taken exactly, the 503 backing off to
// its budget, and the outage held and recovered, and says so.
func TestCLIDemoRetryScenario(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := runScenarios(context.Background(), []demoScenario{retryScenario}, zerolog.Nop(), &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"bus    retry 1 in 2s",
		"rate_limit: retry 1 of 3 after 2s (retry-after)",
		"due    retry 1 arrived",
		"retry budget exhausted: 3 of 3 retries used",
		"bus    wait_provider: provider deepseek is down",
		"health failbus.health.deepseek outage",
		"notify critical  provider-outage:deepseek:",
		"health failbus.health.deepseek degraded: recovering",
		"health failbus.health.deepseek recovered",
		"notify normal  provider-recovered:deepseek:",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
