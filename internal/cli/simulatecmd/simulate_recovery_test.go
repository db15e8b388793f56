package simulatecmd

import (
	"os"
	"strings"
	"testing"
)

// `failbus simulate` runs the eight-hour outage story (the file the engine's
// test checks in full, internal/engine/sim/testdata/recovery-8h.jsonl): the
// checklist's records, kills, re-runs, write checks and the release come
// out as dispatch, control and recovery records at their virtual times.
func TestSimulateRecoveryStory(t *testing.T) {
	t.Parallel()
	input, err := os.ReadFile("../../../internal/engine/sim/testdata/recovery-8h.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	code, lines, stderr := runSimulateLines(t, nil, string(input))
	if code != 0 {
		t.Fatalf("exit %d, stderr %s", code, stderr)
	}
	count := map[string]int{}
	var steps []string
	released := 0
	for _, l := range lines {
		typ, _ := l["type"].(string)
		switch typ {
		case "error":
			t.Errorf("error record %v", l)
		case "control":
			count[l["action"].(string)]++
		case "recovery":
			steps = append(steps, l["step"].(string))
		case "dispatch":
			if strings.HasPrefix(l["task_id"].(string), "q-") {
				released++
			}
		case "notification":
			if strings.HasPrefix(l["dedupe_key"].(string), "recovery:openai:") {
				count["recovery notification"]++
			}
		}
	}
	if got := strings.Join(steps, " "); got != "confirm subagents kill crons writes redispatch release" {
		t.Errorf("recovery records %q", got)
	}
	if count["kill"] != 5 || count["run_cron"] != 7 || count["check_write"] != 2 || released != 200 || count["recovery notification"] != 1 {
		t.Errorf("controls %v, %d released; want 5 kills, 7 cron re-runs, 2 write checks, 200 released, 1 recovery notification", count, released)
	}
	t.Logf("%d output records: %v, %d released", len(lines), count, released)
}
