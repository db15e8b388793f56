package chaos

import (
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// The answers, in each API's real shape. OpenAI errors are
// {"error":{"message","type","param","code"}}; Anthropic errors are
// {"type":"error","error":{"type","message"},"request_id"}. The messages
// are those the providers send (docs/CHAOS.md lists each).

// errKind is an error answer, independent of the API.
type errKind int

const (
	errBadRequest errKind = iota
	errInvalidPrompt
	errUnavailable
	errOverloaded
	errRateLimit
	errQuota
	errOverflow
	errStream
)

// errorShape is one error answer in one API.
type errorShape struct {
	status  int
	typ     string // OpenAI error.type / Anthropic error.type
	code    any    // OpenAI error.code (nil: null)
	param   any    // OpenAI error.param
	message string
}

// shape returns the error answer kind in api, with detail where the
// message carries one (the request's model, token counts).
func (a *answer) shape(kind errKind, detail string) errorShape {
	openai := a.in.api == OpenAI
	switch kind {
	case errBadRequest:
		return errorShape{status: http.StatusBadRequest, typ: "invalid_request_error", message: detail}
	case errInvalidPrompt:
		return errorShape{status: http.StatusBadRequest, typ: "invalid_request_error", code: "invalid_prompt",
			message: "Invalid prompt: your prompt was flagged as potentially violating our usage policy. Please try again with a different prompt: https://platform.openai.com/docs/guides/reasoning#advice-on-prompting"}
	case errUnavailable:
		if openai {
			return errorShape{status: http.StatusServiceUnavailable, typ: "server_error", message: "Service Unavailable"}
		}
		return errorShape{status: http.StatusServiceUnavailable, typ: "api_error", message: "Service Unavailable"}
	case errOverloaded:
		if openai {
			return errorShape{status: http.StatusServiceUnavailable, typ: "server_error", message: "The server is overloaded or not ready yet."}
		}
		return errorShape{status: 529, typ: "overloaded_error", message: "Overloaded"}
	case errRateLimit:
		if openai {
			return errorShape{status: http.StatusTooManyRequests, typ: "requests", code: "rate_limit_exceeded",
				message: fmt.Sprintf("Rate limit reached for %s in organization org-chaos on requests per min (RPM): Limit 60, Used 60, Requested 1.%s Visit https://platform.openai.com/account/rate-limits to learn more.", a.in.model, detail)}
		}
		return errorShape{status: http.StatusTooManyRequests, typ: "rate_limit_error",
			message: "This request would exceed the rate limit for your organization of 60 requests per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later."}
	case errQuota:
		if openai {
			return errorShape{status: http.StatusTooManyRequests, typ: "insufficient_quota", code: "insufficient_quota",
				message: "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."}
		}
		return errorShape{status: http.StatusPaymentRequired, typ: "billing_error",
			message: "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}
	case errOverflow:
		return errorShape{status: http.StatusBadRequest, typ: "invalid_request_error", code: "context_length_exceeded", param: "messages", message: detail}
	default: // errStream
		if openai {
			return errorShape{typ: "server_error", message: "The server had an error while processing your request. Sorry about that!"}
		}
		return errorShape{typ: "overloaded_error", message: "Overloaded"}
	}
}

// body is the JSON of an error answer.
func (a *answer) body(e errorShape) any {
	if a.in.api == OpenAI {
		return map[string]any{"error": map[string]any{"message": e.message, "type": e.typ, "param": e.param, "code": e.code}}
	}
	return map[string]any{"type": "error", "error": map[string]any{"type": e.typ, "message": e.message}, "request_id": a.id("req_")}
}

// apiError answers an error, with extra headers h.
func (a *answer) apiError(kind errKind, detail string, h http.Header) {
	e := a.shape(kind, detail)
	a.errMsg = e.message
	for k, v := range h {
		a.w.Header()[k] = v
	}
	a.writeJSON(e.status, a.body(e))
}

// faultError answers the error of a fault window that answers with one.
func (a *answer) faultError(f *Fault) {
	h := http.Header{}
	detail := ""
	if f.RetryAfter > 0 {
		// To the millisecond (at least one), so a scaled value reads
		// 0.05, not 0.050000001.
		wait := max(a.s.wall(f.RetryAfter).Round(time.Millisecond), time.Millisecond)
		h.Set("retry-after", strconv.FormatFloat(wait.Seconds(), 'f', -1, 64))
		if f.RetryAfterMs {
			h.Set("retry-after-ms", strconv.FormatInt(wait.Milliseconds(), 10))
		}
		detail = " Please try again in " + wait.String() + "."
	}
	switch f.Kind {
	case KindUnavailable:
		a.apiError(errUnavailable, "", h)
	case KindOverloaded:
		a.apiError(errOverloaded, "", h)
	case KindRateLimit:
		a.apiError(errRateLimit, detail, h)
	case KindQuota:
		a.apiError(errQuota, "", h)
	case KindOverflow:
		msg := fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages.", f.AboveTokens, a.in.tokens)
		if a.in.api == Anthropic {
			msg = fmt.Sprintf("prompt is too long: %d tokens > %d maximum", a.in.tokens, f.AboveTokens)
		}
		a.apiError(errOverflow, msg, nil)
	}
}

// openAICompletion is a chat.completion object.
func (a *answer) openAICompletion(text string, refusal bool, outTokens int) any {
	var content any = text
	finish := "stop"
	if refusal {
		content, finish = nil, "content_filter"
	}
	return map[string]any{
		"id": a.id("chatcmpl-"), "object": "chat.completion", "created": a.s.clock.Now().Unix(), "model": a.in.model,
		"choices": []any{map[string]any{
			"index":         0,
			"message":       map[string]any{"role": "assistant", "content": content, "refusal": nil, "annotations": []any{}},
			"logprobs":      nil,
			"finish_reason": finish,
		}},
		"usage":              map[string]any{"prompt_tokens": a.in.tokens, "completion_tokens": outTokens, "total_tokens": a.in.tokens + outTokens},
		"system_fingerprint": "fp_chaos",
	}
}

// anthropicMessage is a message object.
func (a *answer) anthropicMessage(text string, refusal bool, outTokens int) any {
	content := []any{map[string]any{"type": "text", "text": text}}
	stop := "end_turn"
	if refusal {
		content, stop = []any{}, "refusal"
	}
	return map[string]any{
		"id": a.id("msg_"), "type": "message", "role": "assistant", "model": a.in.model,
		"content": content, "stop_reason": stop, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": a.in.tokens, "output_tokens": outTokens},
	}
}

// streamer writes one API's stream; each method returns false once the
// client is gone.
type streamer interface {
	begin() bool
	delta(text string) bool
	end(refusal bool, outTokens int) bool
	fail() bool
}

// openAIStream is chat.completion.chunk events ending in data: [DONE].
type openAIStream struct{ a *answer }

func (s *openAIStream) chunk(delta map[string]any, finish any) map[string]any {
	c := map[string]any{
		"id": s.a.id("chatcmpl-"), "object": "chat.completion.chunk", "created": s.a.s.clock.Now().Unix(), "model": s.a.in.model,
		"system_fingerprint": "fp_chaos",
		"choices":            []any{map[string]any{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}},
	}
	if s.a.in.includeUsage {
		c["usage"] = nil
	}
	return c
}

func (s *openAIStream) begin() bool {
	return s.a.event("", s.chunk(map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil))
}

func (s *openAIStream) delta(text string) bool {
	return s.a.event("", s.chunk(map[string]any{"content": text}, nil))
}

func (s *openAIStream) end(refusal bool, outTokens int) bool {
	finish := "stop"
	if refusal {
		finish = "content_filter"
	}
	if !s.a.event("", s.chunk(map[string]any{}, finish)) {
		return false
	}
	if s.a.in.includeUsage {
		u := s.chunk(nil, nil)
		u["choices"] = []any{}
		u["usage"] = map[string]any{"prompt_tokens": s.a.in.tokens, "completion_tokens": outTokens, "total_tokens": s.a.in.tokens + outTokens}
		if !s.a.event("", u) {
			return false
		}
	}
	return s.a.event("", "[DONE]")
}

// fail sends the in-band error object OpenAI streams carry, and ends the
// stream without [DONE].
func (s *openAIStream) fail() bool {
	return s.a.event("", s.a.body(s.a.shape(errStream, "")))
}

// anthropicStream is the messages event sequence: message_start,
// content_block_start, ping, content_block_delta…, content_block_stop,
// message_delta, message_stop; or an error event.
type anthropicStream struct {
	a     *answer
	block bool // a content block is open
}

func (s *anthropicStream) begin() bool {
	return s.a.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": s.a.id("msg_"), "type": "message", "role": "assistant", "model": s.a.in.model,
		"content": []any{}, "stop_reason": nil, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": s.a.in.tokens, "output_tokens": 1},
	}})
}

func (s *anthropicStream) delta(text string) bool {
	if !s.block {
		s.block = true
		if !s.a.event("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}}) ||
			!s.a.event("ping", map[string]any{"type": "ping"}) {
			return false
		}
	}
	return s.a.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": text}})
}

func (s *anthropicStream) end(refusal bool, outTokens int) bool {
	if s.block && !s.a.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}) {
		return false
	}
	stop := "end_turn"
	if refusal {
		stop = "refusal"
	}
	return s.a.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": outTokens}}) &&
		s.a.event("message_stop", map[string]any{"type": "message_stop"})
}

// fail sends event: error, as the API does when it fails mid-stream.
func (s *anthropicStream) fail() bool {
	return s.a.event("error", s.a.body(s.a.shape(errStream, "")))
}
