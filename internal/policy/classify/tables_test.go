package classify

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// TestTablesLoaded: the built-in code tables are there, in file-name order,
// each owned by its provider, and a numeric code is never left unscoped (a
// number means something else at every provider).
func TestTablesLoaded(t *testing.T) {
	t.Parallel()
	names := Tables()
	for _, want := range []string{"anthropic", "bedrock", "dashscope", "google", "minimax", "moonshot", "openai",
		"qianfan", "siliconflow", "volcengine", "zhipu"} {
		if !slices.Contains(names, want) {
			t.Errorf("no table %q in %v", want, names)
		}
	}
	if !slices.IsSorted(names) {
		t.Errorf("tables %v not in file-name order", names)
	}
	for _, p := range []string{"zhipu", "ZAI", "bigmodel", "qwen", "kimi", "ernie", "gemini", "vertex", "doubao"} {
		if len(TablesOf(p)) == 0 {
			t.Errorf("provider %q owns no table", p)
		}
	}
	if got := TablesOf("my-gateway"); got != nil {
		t.Errorf("TablesOf(my-gateway) = %v", got)
	}
	for _, tb := range tables {
		for _, r := range tb.rules {
			for _, c := range r.Codes {
				if isDigits(c) && len(r.Providers) == 0 {
					t.Errorf("tables/%s.yaml: rule %s: numeric code %q without providers", tb.name, r.ID, c)
				}
			}
		}
	}
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// TestTablesScopeNumericCodes: one number, two providers, two meanings.
func TestTablesScopeNumericCodes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		provider, body, class, rule string
	}{
		{"zhipu", `{"error":{"code":"1002","message":"Authorization Token非法，请确认Authorization Token正确传递。"}}`, "auth", "zhipu.auth"},
		{"minimax", `{"base_resp":{"status_code":1002,"status_msg":"rate limit exceeded(RPM)"}}`, "rate_limit", "minimax.rate"},
		{"zhipu", `{"error":{"code":"1113","message":"余额不足或无可用资源包,请充值。"}}`, "quota_exhausted", "zhipu.balance"},
		// An unknown provider with Zhipu's number: the words decide.
		{"my-gateway", `{"error":{"code":"1113","message":"余额不足或无可用资源包,请充值。"}}`, "quota_exhausted", "family.billing"},
	} {
		o := events.Outcome{ID: "x", Agent: "a", Provider: tt.provider, Status: 429, Body: tt.body}
		c := Classify(&o)
		if string(c.Class) != tt.class || c.Rule != tt.rule {
			t.Errorf("%s %s: %s by %s, want %s by %s", tt.provider, tt.body, c.Class, c.Rule, tt.class, tt.rule)
		}
	}
}

// TestParseTable: a table is held to the policy file's rules: unknown keys
// and invalid rules are errors.
func TestParseTable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ name, doc, want string }{
		{"unknown key", "classify:\n  rules:\n    - id: x.a\n      class: auth\n      code: [a]\n", "code"},
		{"not a class", "classify:\n  rules:\n    - id: x.a\n      class: busy\n      codes: [a]\n", "not a contract class"},
		{"no condition", "classify:\n  rules:\n    - id: x.a\n      class: auth\n      providers: [x]\n", "at least one"},
		{"duplicate id", "classify:\n  rules:\n    - id: x.a\n      class: auth\n      codes: [a]\n    - id: x.a\n      class: auth\n      codes: [b]\n", "duplicate"},
		{"other section", "retry:\n  mode: off\n", "retry"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseTable([]byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want it to contain %q", err, tt.want)
			}
		})
	}
	files, err := filepath.Glob("tables/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no tables: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rules, err := ParseTable(data)
		if err != nil || len(rules) == 0 {
			t.Errorf("%s: %d rules, %v", f, len(rules), err)
		}
	}
}

// TestTableIDsReserved: a user rule may not take a table rule's id, as it
// may not take a built-in one.
func TestTableIDsReserved(t *testing.T) {
	t.Parallel()
	err := Config{Rules: []Rule{{ID: "zhipu.balance", Class: "auth", Codes: []string{"x"}}}}.Validate()
	if err == nil || !strings.Contains(err.Error(), "built-in") {
		t.Fatalf("err %v, want the id refused as built-in", err)
	}
}
