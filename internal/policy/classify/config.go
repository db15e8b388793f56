package classify

import (
	"fmt"
	"strings"
	"time"
)

// Defaults of Config.
const (
	// DefaultOverflowEvidenceRatio: an overflow claim is overruled when the
	// request is known to use less than 90% of the model's context window.
	// Token counts are estimates on both sides (tokenizers differ, tool
	// schemas and images count), so a request close to the window may
	// really overflow; one at 16% of it (41k of 256k) does not.
	DefaultOverflowEvidenceRatio = 0.9
	// DefaultQuotaAfter: a rate limit whose provider hint asks to wait longer
	// than an hour is reported as quota_exhausted — it will not clear soon
	// (Azure "retry after 86400 seconds", Gemini "reset after 8h44m7s").
	DefaultQuotaAfter = time.Hour
)

// DefaultEmptyOverflowProviders are the providers known to report a context
// overflow as a 400/413 with an empty body (Cerebras). For everyone else an
// empty 4xx is unexplained, and so a retryable server_error.
func DefaultEmptyOverflowProviders() []string { return []string{"cerebras"} }

// Config is the `classify:` section of the policy file.
//
//	classify:
//	  rules: []                          # user rules, tried before the built-in ones
//	  empty_overflow_providers: [cerebras]
//	  overflow_evidence_ratio: 0.9
//	  quota_after: 1h
//
// Every key is optional; the zero value is the default policy.
type Config struct {
	// Rules are user rules, tried in order before every built-in rule. The
	// first rule that matches decides (subject to the overflow evidence
	// check). See Rule for the format.
	Rules []Rule `yaml:"rules,omitempty" json:"rules,omitempty"`
	// EmptyOverflowProviders are the providers for which an empty-body 400
	// or 413 means "context overflow" (rule cerebras.empty_400_overflow).
	// Absent: DefaultEmptyOverflowProviders ([cerebras]). An explicit empty
	// list turns the rule off.
	EmptyOverflowProviders []string `yaml:"empty_overflow_providers,omitempty" json:"empty_overflow_providers,omitempty"`
	// OverflowEvidenceRatio: when an outcome carries request_tokens and
	// context_window and request_tokens/context_window is below this ratio,
	// any context_overflow claim — by a pattern, a provider heuristic or
	// upstream_code — is overruled: the classification records `overruled:
	// context_overflow` with the token evidence, and the next rule decides.
	// Must be in (0, 1]; 0 means DefaultOverflowEvidenceRatio (0.9).
	OverflowEvidenceRatio float64 `yaml:"overflow_evidence_ratio,omitempty" json:"overflow_evidence_ratio,omitempty"`
	// QuotaAfter: a rate_limit whose retry hint is longer than this becomes
	// quota_exhausted (`overruled: rate_limit`). 0 means DefaultQuotaAfter
	// (1h); negative turns the promotion off.
	QuotaAfter time.Duration `yaml:"quota_after,omitempty" json:"quota_after,omitempty"`
}

// Validate checks the section and names the offending rule or key.
func (c Config) Validate() error {
	if c.OverflowEvidenceRatio < 0 || c.OverflowEvidenceRatio > 1 {
		return fmt.Errorf("classify.overflow_evidence_ratio: %v is outside (0, 1]", c.OverflowEvidenceRatio)
	}
	for i, p := range c.EmptyOverflowProviders {
		if strings.TrimSpace(p) == "" {
			return fmt.Errorf("classify.empty_overflow_providers[%d]: empty provider name", i)
		}
	}
	builtinIDs := tableRuleIDs()
	for _, b := range builtinRules {
		if b.ID != "" {
			builtinIDs[b.ID] = true
		}
	}
	seen := make(map[string]int, len(c.Rules))
	for i := range c.Rules {
		r := &c.Rules[i]
		if err := r.validate(i, builtinIDs); err != nil {
			return err
		}
		if j, dup := seen[r.ID]; dup {
			return &RuleError{Index: i, ID: r.ID, Field: "id", Problem: fmt.Sprintf("duplicate of classify.rules[%d]", j)}
		}
		seen[r.ID] = i
	}
	return nil
}
