package drillcmd

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/drill"
)

// failbus drill prints the table of the strategies it ran, with the rows
// of another client's drill (--rows) beside them.
func TestCLIDrillPrintsItsTable(t *testing.T) {
	t.Parallel()
	// A row of the TypeScript drill's --json: its own figures, not all of ours.
	extra := clitest.WriteFile(t, "ts.json", `{"client":"typescript","rows":[{"strategy":"openai","label":"ts: openai SDK, default retries",`+
		`"client":"typescript","tasks":2,"completed":1,"lost":1,"lost_by":{"error":1},"calls":9,"probes":0,`+
		`"wasted":{"outage":3,"past_cap":0,"refused_resent":0,"nonretryable_retried":0,"total":3,"prompt_tokens":120},`+
		`"calls_per_completed_task":9,"burst_after_recovery":2,"hung_calls":0,"seconds":3.1}]}`)
	var stdout, stderr clitest.SyncBuffer
	code := drillMain(t.Context(), []string{"--strategies", "go-sdk", "--agents", "2", "--tasks", "1", "--steps", "1", "--scale", "0.02", "--rows", extra},
		&stdout, &stderr, func(string) string { return "" })
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	lines := strings.Split(stdout.String(), "\n")
	if len(lines) < 3 || !strings.Contains(lines[0], "wasted tok") ||
		!strings.Contains(lines[1], "go-sdk") ||
		!strings.Contains(lines[2], "openai") || strings.Count(lines[2], "—") != 6 {
		t.Errorf("stdout:\n%s\nwant the header, go-sdk's row, and the TypeScript openai row with the six figures it does not carry as —", stdout.String())
	}
	if !strings.Contains(stdout.String(), "openai: ts: openai SDK, default retries") || !strings.Contains(stdout.String(), "wasted: outage 3") {
		t.Errorf("stdout lacks the details of the added row:\n%s", stdout.String())
	}
	if !strings.Contains(stderr.String(), "go-sdk: done in") {
		t.Errorf("no progress on stderr:\n%s", stderr.String())
	}
}

// --json prints the report: every figure of every row.
func TestDrillReportJSONRoundTrips(t *testing.T) {
	t.Parallel()
	row := drill.Row{Strategy: drill.StrategyFailbus, Tasks: 3, Completed: 3, Wasted: drill.Waste{Outage: 1, Total: 1, PromptTokens: 40}}
	data, err := json.Marshal(drill.Report{Rows: []drill.Row{row}})
	if err != nil {
		t.Fatal(err)
	}
	path := clitest.WriteFile(t, "go.json", string(data))
	rows, err := readRows(path)
	if err != nil || len(rows) != 1 || rows[0].Wasted != row.Wasted || !rows[0].Has("subagents_killed") {
		t.Errorf("read back %+v, %v; want the row with all its figures", rows, err)
	}
}

func TestCLIDrillRejectsBadArguments(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--strategies", "go-magic"}, `strategy "go-magic"`},
		{[]string{"--agents", "1"}, "at least 2 agents"},
		{[]string{"--real"}, "OPENAI_API_KEY"},
		{[]string{"surplus"}, "unexpected arguments"},
	} {
		var stdout, stderr clitest.SyncBuffer
		code := drillMain(t.Context(), tt.args, &stdout, &stderr, func(string) string { return "" })
		if code == 0 || !strings.Contains(stderr.String(), tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error naming %q", tt.args, code, stderr.String(), tt.want)
		}
	}
}
