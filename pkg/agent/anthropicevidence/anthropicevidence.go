// Package anthropicevidence reads what
// github.com/anthropics/anthropic-sdk-go/v2 returns as failbus evidence, so
// agent.Call reports an Anthropic call's raw status, body and headers: set
// agent.Request.Describe to Describe, and, for a message that returned
// without an error but did not answer, pass Message's evidence to
// Attempt.Observe. It is its own package so that pkg/agent imports no SDK.
package anthropicevidence

import (
	"errors"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/failbus/failbus/internal/httpheader"
	"github.com/failbus/failbus/pkg/agent"
)

// Describe is an agent.Describer for anthropic-sdk-go's errors: an API
// error's status, the body the API sent, the response headers
// (retry-after, x-should-retry) and its error type as a hint
// (overloaded_error, rate_limit_error). Other errors are left to
// agent.Call.
func Describe(err error) (agent.Evidence, bool) {
	var e *anthropic.Error
	if !errors.As(err, &e) {
		return agent.Evidence{}, false
	}
	ev := agent.Evidence{Status: e.StatusCode, Body: e.RawJSON(), UpstreamCode: string(e.Type())}
	if e.Response != nil {
		ev.Headers = httpheader.Map(e.Response.Header)
	}
	return ev, true
}

// Message is the evidence of a message that came back without an error:
// ok is false when it did not answer (stop_reason refusal).
func Message(m *anthropic.Message) (ev agent.Evidence, ok bool) {
	if m == nil {
		return agent.Evidence{Status: 200}, false
	}
	if m.StopReason == "refusal" {
		return agent.Evidence{Status: 200, StopReason: "refusal"}, false
	}
	return agent.Evidence{OK: true, Status: 200, RequestTokens: int(m.Usage.InputTokens)}, true
}
