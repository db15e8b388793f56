package classify

import (
	"bytes"
	"embed"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Provider error-code tables: what each provider's own error codes mean, as
// data in the policy file's format (tables/<provider>.yaml, each a
// `classify.rules` list whose rules are validated as a policy file's are).
// A user adds the codes of a provider these tables do not know the same
// way, in `classify.rules`.
//
// The tables run where structured error codes are read (stage 3 of the
// precedence, see Classifier), in file-name order, each file's rules in
// file order. A numeric code means nothing across providers (Zhipu's 1002
// is a bad token, MiniMax's 1002 a rate limit), so a table's numeric codes
// are scoped to its provider's names with `providers:`; textual codes
// (Arrearage, AccountOverdueError, exceeded_current_quota_error) are
// distinctive and apply to any provider, so a gateway relaying them is
// read too.
//
// The tables are what a provider the rules were never tuned on does not
// have: Evaluate's leave-one-provider-out pass classifies each provider's
// rows without that provider's tables, so the figure shows what the general
// families and the extractor achieve alone.

//go:embed tables/*.yaml
var tableFS embed.FS

// table is one built-in code table.
type table struct {
	name   string   // file name without .yaml
	owners []string // lower-case provider names the table belongs to
	rules  []Rule
}

// tableAliases are further provider names, as outcomes spell them, that a
// built-in table belongs to, beyond its file name and the names its rules
// are scoped to (leave-one-provider-out leaves the table out for them too).
var tableAliases = map[string][]string{
	"google":     {"vertex", "gemini", "gemini-cli", "gemini-code-assist", "google-vertex", "aistudio"},
	"dashscope":  {"qwen", "qwen-oauth", "bailian", "aliyun", "alibaba", "tongyi", "modelstudio"},
	"moonshot":   {"kimi", "kimi-coding", "moonshotai"},
	"qianfan":    {"baidu", "wenxin", "ernie"},
	"volcengine": {"doubao", "ark", "volcano", "volces", "byteplus"},
	"openai":     {"azure-openai", "azure"},
	"anthropic":  {"claude"},
	"bedrock":    {"aws-bedrock", "amazon-bedrock"},
}

// tables are the built-in code tables, parsed and validated once.
var tables = mustLoadTables()

func mustLoadTables() []table {
	ts, err := loadTables()
	if err != nil {
		panic("classify: built-in code tables are invalid: " + err.Error())
	}
	return ts
}

func loadTables() ([]table, error) {
	entries, err := tableFS.ReadDir("tables")
	if err != nil {
		return nil, err
	}
	var out []table
	seen := map[string]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		data, err := tableFS.ReadFile(path.Join("tables", e.Name()))
		if err != nil {
			return nil, err
		}
		rules, err := ParseTable(data)
		if err != nil {
			return nil, fmt.Errorf("tables/%s: %w", e.Name(), err)
		}
		t := table{name: strings.TrimSuffix(e.Name(), ".yaml"), rules: rules}
		owners := map[string]bool{t.name: true}
		for _, a := range tableAliases[t.name] {
			owners[a] = true
		}
		for i, r := range rules {
			if f, dup := seen[r.ID]; dup {
				return nil, fmt.Errorf("tables/%s: rules[%d]: id %q also in tables/%s", e.Name(), i, r.ID, f)
			}
			seen[r.ID] = e.Name()
			for _, p := range r.Providers {
				owners[strings.ToLower(strings.TrimSpace(p))] = true
			}
		}
		for o := range owners {
			t.owners = append(t.owners, o)
		}
		sort.Strings(t.owners)
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// ParseTable reads a code table: a policy document holding only a
// `classify.rules` list. Unknown keys are errors, and every rule is
// validated as a policy rule is (a table's ids are built-in ids, so they
// are checked for uniqueness against each other, not against the built-in
// rules).
func ParseTable(data []byte) ([]Rule, error) {
	var doc struct {
		Classify struct {
			Rules []Rule `yaml:"rules"`
		} `yaml:"classify"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	builtin := make(map[string]bool, len(builtinRules))
	for _, b := range builtinRules {
		builtin[b.ID] = true
	}
	ids := map[string]int{}
	for i := range doc.Classify.Rules {
		r := &doc.Classify.Rules[i]
		if err := r.validate(i, builtin); err != nil {
			return nil, err
		}
		if j, dup := ids[r.ID]; dup {
			return nil, &RuleError{Index: i, ID: r.ID, Field: "id", Problem: fmt.Sprintf("duplicate of rules[%d]", j)}
		}
		ids[r.ID] = i
	}
	return doc.Classify.Rules, nil
}

// Tables returns the names of the built-in code tables, in the order they
// run.
func Tables() []string {
	out := make([]string, len(tables))
	for i, t := range tables {
		out[i] = t.name
	}
	return out
}

// TablesOf returns the names of the built-in code tables that belong to
// provider (case-insensitive): a table belongs to the provider it is named
// after, to the providers its rules are scoped to, and to that provider's
// other spellings (tableAliases). Nil when none does.
func TablesOf(provider string) []string {
	p := strings.ToLower(strings.TrimSpace(provider))
	var out []string
	for _, t := range tables {
		if slices.Contains(t.owners, p) {
			out = append(out, t.name)
		}
	}
	return out
}

// tableRuleIDs are the ids of every built-in table rule: reserved, like
// the built-in rule ids.
func tableRuleIDs() map[string]bool {
	ids := map[string]bool{}
	for _, t := range tables {
		for _, r := range t.rules {
			ids[r.ID] = true
		}
	}
	return ids
}
