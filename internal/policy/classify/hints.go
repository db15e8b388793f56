package classify

import (
	"bytes"
	"strings"

	"github.com/failbus/failbus/internal/policy/classify/internal/delay"
	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/internal/policy/classify/internal/pattern"
	"github.com/failbus/failbus/pkg/events"
)

// Retry hints: what the provider itself said about when
// to try again. The scheduler takes such a delay as is when it is within its
// max delay, so the hint must be the provider's number, not a guess.
//
// Sources, strongest first (the first one found wins):
//
//  1. header retry-after-ms (OpenAI, Anthropic SDKs): milliseconds.
//  2. header retry-after: delta-seconds, or an HTTP-date taken relative to
//     the outcome's `at` (pkg/policy has no clock of its own).
//  3. body: Google RetryInfo `retryDelay` ("39s", "22.718768524s"), or a
//     numeric `retry_after` in seconds (Cloudflare's JSON error pages).
//  4. body text: "Please try again in 634ms" / "in 9m38.016s" (OpenAI,
//     Groq), "Please retry in 25.4s" (Gemini), "Your quota will reset after
//     39s" (Gemini Code Assist), "Please retry after 6 seconds" (Azure).
//
// x-should-retry ("true"/"false", OpenAI and Anthropic) is reported on its
// own, whatever the delay source.

// Hint sources named in events.RetryHints.Source.
const (
	HintRetryAfterMS = "retry-after-ms"
	HintRetryAfter   = "retry-after"
	HintRetryDelay   = "retryDelay"
	HintBody         = "body"
)

// hintPhrases introduce a delay in lower-cased error text.
var hintPhrases = [...]string{
	"try again in ",
	"retry in ",
	"retry after ",
	"reset after ",
	"try again after ",
	"retrying in ",
}

// retryHints extracts the hints of one outcome classified as class; nil
// when there are none. Headers and structured fields are always read; the
// body's prose only for the classes a delay applies to (rate_limit,
// quota_exhausted, overloaded, server_error), and never in an HTML page.
func (c *Classifier) retryHints(o *events.Outcome, v *digest.View, class string) *events.RetryHints {
	var (
		should    *bool
		afterMS   int64
		source    string
		haveDelay bool
	)
	if len(o.Headers) > 0 {
		if s, ok := o.Headers["x-should-retry"]; ok {
			switch strings.TrimSpace(strings.ToLower(s)) {
			case "true":
				b := true
				should = &b
			case "false":
				b := false
				should = &b
			}
		}
		if s, ok := o.Headers["retry-after-ms"]; ok {
			if ms, ok := delay.Number(strings.TrimSpace(s), 1); ok {
				afterMS, source, haveDelay = ms, HintRetryAfterMS, true
			}
		}
		if !haveDelay {
			if s, ok := o.Headers["retry-after"]; ok {
				if ms, ok := delay.RetryAfter(strings.TrimSpace(s), o.At); ok {
					afterMS, source, haveDelay = ms, HintRetryAfter, true
				}
			}
		}
	}
	if !haveDelay && v.RetryDelay.OK() {
		if ms, ok := delay.Text(v.Str(v.RetryDelay)); ok {
			afterMS, source, haveDelay = ms, HintRetryDelay, true
		}
	}
	if !haveDelay && v.RetryAfterSec > 0 {
		afterMS, source, haveDelay = delay.Clamp(v.RetryAfterSec*1000), HintBody, true
	}
	if !haveDelay && len(v.Text) > 0 && !v.HTML && proseHintClass(class) {
		hits := c.textHits(v)
		for k, p := range hintPhrases {
			if !pattern.Hit(hits, c.hintIDs[k]) {
				continue
			}
			if i := bytes.Index(v.Text, []byte(p)); i >= 0 {
				if ms, ok := delay.Text(v.Text[i+len(p):]); ok {
					afterMS, source, haveDelay = ms, HintBody, true
					break
				}
			}
		}
	}
	if should == nil && !haveDelay {
		return nil
	}
	return &events.RetryHints{ShouldRetry: should, AfterMS: afterMS, Source: source}
}

func proseHintClass(class string) bool {
	switch class {
	case events.ClassRateLimit, events.ClassQuotaExhausted, events.ClassOverloaded, events.ClassServerError:
		return true
	}
	return false
}
