package demo

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

func TestCLIDemoRecoveryScenario(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	printf := func(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }
	if err := runRecoveryScenario(context.Background(), printf); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"bus    health outage",
		"agent  probe: one real call to moonshot → connection refused",
		"agent  probe: one real call to moonshot → 200",
		"bus    health recovered",
		"1 confirm     moonshot down from",
		"2 subagents   still saying running: researcher",
		"3 kill        researcher",
		"agent  kill: stops researcher",
		"4 crons       re-run: digest @",
		"missed: inbox-sweep @",
		"5 writes      check: memory/today.md",
		"6 redispatch  t-research as attempt 2",
		"7 release     4 held tasks released in submission order",
		"bus    notification (normal) \"recovery checklist done for moonshot\"",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
