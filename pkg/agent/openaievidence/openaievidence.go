// Package openaievidence reads what github.com/openai/openai-go/v3 returns
// as failbus evidence, so agent.Call reports an OpenAI (or
// OpenAI-compatible) call's raw status, body and headers: set
// agent.Request.Describe to Describe, and, for a completion that returned
// without an error but did not answer, pass Completion's evidence to
// Attempt.Observe. It is its own package so that pkg/agent imports no SDK.
package openaievidence

import (
	"errors"

	"github.com/openai/openai-go/v3"

	"github.com/failbus/failbus/internal/httpheader"
	"github.com/failbus/failbus/pkg/agent"
)

// Describe is an agent.Describer for openai-go's errors: an API error's
// status, its error object as the body the API sent ({"error": …}), the
// response headers (retry-after, x-should-retry) and its code as a hint.
// Other errors (a refused connection, a timeout) are left to agent.Call.
func Describe(err error) (agent.Evidence, bool) {
	var e *openai.Error
	if !errors.As(err, &e) {
		return agent.Evidence{}, false
	}
	ev := agent.Evidence{Status: e.StatusCode, UpstreamCode: e.Code}
	if raw := e.RawJSON(); raw != "" {
		ev.Body = `{"error":` + raw + `}`
	}
	if e.Response != nil {
		ev.Headers = httpheader.Map(e.Response.Header)
	}
	return ev, true
}

// Completion is the evidence of a chat completion that came back without
// an error: ok is false when it did not answer (finish_reason
// content_filter: the provider's filter refused it), and ev says so.
func Completion(c *openai.ChatCompletion) (ev agent.Evidence, ok bool) {
	if c == nil || len(c.Choices) == 0 {
		return agent.Evidence{Status: 200}, false
	}
	if r := c.Choices[0].FinishReason; r == "content_filter" {
		return agent.Evidence{Status: 200, StopReason: r}, false
	}
	return agent.Evidence{OK: true, Status: 200, RequestTokens: int(c.Usage.PromptTokens)}, true
}
