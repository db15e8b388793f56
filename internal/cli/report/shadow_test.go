package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/bustest"
	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/pkg/events"
)

// TestReportShadowsAPolicyChange: `failbus report --shadow NEW` adds what
// NEW would have decided differently on the period's outcomes. Budget A
// (openai) fails four times and budget B (anthropic) three: under
// max_retries 1 instead of 10 every failure after a budget's first gives
// up instead of retrying — 3 + 2 changes — and the page shows the JSON's
// figures. A policy equal to its base changes nothing and says so; without
// --shadow neither JSON nor page has the section.
func TestReportShadowsAPolicyChange(t *testing.T) {
	t.Parallel()
	b := bustest.Start(t, 2*time.Minute)
	base := clitest.WriteFile(t, "base.yaml", "retry:\n  max_retries: 10\n")
	next := clitest.WriteFile(t, "new.yaml", "retry:\n  max_retries: 1\n")
	t0 := time.Now().Add(-time.Hour).UTC()
	publish := func(o *events.Outcome) {
		t.Helper()
		o.At, o.Agent, o.Step = events.At(t0), "bot", 1
		clitest.PublishOutcome(t, b.Ctx, b.JS, o)
	}
	for i := range 4 {
		publish(&events.Outcome{ID: fmt.Sprintf("a%d", i+1), Provider: "openai", Status: 500, Turn: 1})
	}
	for i := range 3 {
		publish(&events.Outcome{ID: fmt.Sprintf("b%d", i+1), Provider: "anthropic", Status: 503, Turn: 2})
	}
	publish(&events.Outcome{ID: "fine", Provider: "openai", OK: true, Status: 200, Turn: 3})

	report := func(args ...string) (*Report, []byte) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"--server", b.Srv.ClientURL(), "--since", "1h", "--json"}, args...), nil, &stdout, &stderr); code != 0 {
			t.Fatalf("report %v: exit %d: %s", args, code, stderr.String())
		}
		var r Report
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		var page bytes.Buffer
		if err := WriteHTML(&page, &r); err != nil {
			t.Fatal(err)
		}
		checkPage(t, page.String(), &r)
		return &r, page.Bytes()
	}

	r, page := report("--shadow", next, "--shadow-base", base)
	s := r.Shadow
	if s == nil {
		t.Fatal("no shadow figures with --shadow")
	}
	var ids []string
	for _, d := range s.Examples {
		if d.Base == nil || d.Base.Action != events.ActionRetry || d.New == nil || d.New.Action != events.ActionGiveUp {
			t.Errorf("example %+v: want retry → give_up", d)
		}
		ids = append(ids, d.OutcomeID)
	}
	got := []any{s.Policy, s.Base, s.Outcomes, s.Differ, s.Changes, s.ByProvider, ids}
	want := []any{"new.yaml", "base.yaml", 8, 5, map[string]int{"retry→give_up": 5},
		map[string]map[string]int{"openai": {"retry→give_up": 3}, "anthropic": {"retry→give_up": 2}}, []string{"a2", "a3", "a4", "b2", "b3"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("shadow figures %v, want %v", got, want)
	}
	if out := os.Getenv("FAILBUS_REPORT_SHADOW_HTML"); out != "" { // to look at the page
		if err := os.WriteFile(out, page, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, text := range []string{`id="shadow"`, "Under another policy", "retry 2 after", "give_up"} {
		if !bytes.Contains(page, []byte(text)) {
			t.Errorf("the page does not show %q", text)
		}
	}

	r, page = report("--shadow", base, "--shadow-base", base)
	if r.Shadow == nil || r.Shadow.Outcomes != 8 || r.Shadow.Differ != 0 || len(r.Shadow.Changes) != 0 || len(r.Shadow.Examples) != 0 {
		t.Errorf("shadow of the base itself: %+v, want 8 outcomes and nothing different", r.Shadow)
	}
	if !bytes.Contains(page, []byte("Nothing in this period: base.yaml decides every outcome as base.yaml does.")) {
		t.Error("the page of an equal policy does not say that nothing differs")
	}

	r, page = report()
	if r.Shadow != nil || bytes.Contains(page, []byte("Under another policy")) {
		t.Error("a report without --shadow has a shadow section")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--server", b.Srv.ClientURL(), "--shadow-base", base}, nil, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "--shadow") {
		t.Errorf("--shadow-base alone: exit %d, %s; want 2 naming --shadow", code, stderr.String())
	}
}
