package drill

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/drill"
)

// failbus drill --json prints the report of the strategies it ran, and
// --rows adds rows made elsewhere.
func TestCLIDrillPrintsItsReport(t *testing.T) {
	t.Parallel()
	extra := clitest.WriteFile(t, "rows.jsonl", `{"strategy":"ts-openai","client":"openai npm","tasks":2,"completed":1,"lost":1}`+"\n")
	var stdout, stderr clitest.SyncBuffer
	code := drillMain(t.Context(), []string{"--strategies", "go-sdk", "--agents", "2", "--tasks", "1", "--steps", "1", "--scale", "0.02", "--json", "--rows", extra},
		&stdout, &stderr, func(string) string { return "" })
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	var rep drill.Report
	if err := json.Unmarshal([]byte(stdout.String()), &rep); err != nil {
		t.Fatalf("stdout is not a report: %v\n%s", err, stdout.String())
	}
	if len(rep.Rows) != 2 || rep.Rows[0].Strategy != drill.StrategySDK || rep.Rows[0].Tasks != 2 || rep.Rows[0].Calls == 0 || rep.Rows[1].Strategy != "ts-openai" {
		t.Errorf("rows %+v; want go-sdk's (2 tasks, its calls) and the added ts-openai", rep.Rows)
	}
	if !strings.Contains(stderr.String(), "go-sdk: done in") {
		t.Errorf("no progress on stderr:\n%s", stderr.String())
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
