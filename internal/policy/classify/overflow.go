package classify

// The overflow evidence check: a context_overflow claim against what the
// request is known to use (Config.OverflowEvidenceRatio).

import (
	"strconv"

	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/pkg/events"
)

// checkOverflow applies the overflow evidence check to a claim by r. It
// returns whether to reject the claim and the evidence either way.
//
// The request counts what the provider counts: the input and the output
// budget it asked for (max_output_tokens). vLLM, TGI and Anthropic reject
// input + max_tokens > window ("you requested 6616 tokens (568 in the
// messages, 6048 in the completion)"), so a 568-token prompt is an overflow
// the evidence confirms. A stop reason that says the window filled up is
// the provider's count of what it generated: evidence, not a claim.
func (c *Classifier) checkOverflow(o *events.Outcome, v *digest.View, r *rule) (bool, string) {
	if o.RequestTokens > 0 && o.ContextWindow > 0 {
		need := o.RequestTokens + o.MaxOutputTokens
		ratio := float64(need) / float64(o.ContextWindow)
		var tokens string
		if o.MaxOutputTokens > 0 {
			tokens = strconv.Itoa(o.RequestTokens) + " input + " + strconv.Itoa(o.MaxOutputTokens) + " output of " +
				strconv.Itoa(o.ContextWindow) + " tokens (" + pct(ratio) + ")"
		} else {
			tokens = strconv.Itoa(o.RequestTokens) + " of " + strconv.Itoa(o.ContextWindow) + " tokens (" + pct(ratio) + ")"
		}
		if r.stated {
			return false, tokens
		}
		if ratio < c.ratio {
			return true, tokens + ", below the overflow evidence ratio " + pct(c.ratio)
		}
		return false, tokens
	}
	if r.heuristic && len(r.upstream) > 0 && v.EmptyBody && !c.emptyOverflowProvider(o.Provider) {
		return true, "empty body from " + strconv.Quote(o.Provider) +
			", which is not configured to report overflow that way; the upstream code can only be a guess"
	}
	return false, ""
}
