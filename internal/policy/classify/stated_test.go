package classify

import (
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// The body's stated reason outranks the status code.

// TestOutputBudgetCounts: the output budget counts against the window as
// the provider counts it, so vLLM's "33000 tokens requested (1000 in the
// messages, 32000 in the completion)" is an overflow the evidence
// confirms; without the budget the same claim at 3% is overruled.
func TestOutputBudgetCounts(t *testing.T) {
	t.Parallel()
	body := `{"object":"error","message":"This model's maximum context length is 32768 tokens. However, you requested 33000 tokens (1000 in the messages, 32000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}`
	o := events.Outcome{ID: "v", Agent: "a", Provider: "vllm", Status: 400, Body: body,
		RequestTokens: 1000, MaxOutputTokens: 32000, ContextWindow: 32768}
	c := Classify(&o)
	if c.Class != events.ClassContextOverflow || c.Overruled != "" {
		t.Fatalf("with the output budget: class %q overruled %q (evidence %q)", c.Class, c.Overruled, c.Evidence)
	}
	if ev := strings.Join(c.Evidence, "|"); !strings.Contains(ev, "1000 input + 32000 output of 32768 tokens (100%)") {
		t.Fatalf("evidence %q lacks the counted tokens", c.Evidence)
	}
	checkShape(t, &o, c)

	o.MaxOutputTokens = 0
	c = Classify(&o)
	if c.Class == events.ClassContextOverflow || c.Overruled != events.ClassContextOverflow {
		t.Fatalf("input alone at 3%%: class %q overruled %q, want the claim overruled", c.Class, c.Overruled)
	}

	// A gateway's empty 400 is no overflow with a budget too: 41k + 8k of 256k is no overflow.
	seed := events.Outcome{ID: "s", Agent: "a", Provider: "my-gateway", Status: 400, UpstreamCode: "CONTEXT_WINDOW_EXCEEDED",
		RequestTokens: 41000, MaxOutputTokens: 8192, ContextWindow: 256000}
	if c := Classify(&seed); c.Class != events.ClassServerError || c.Overruled != events.ClassContextOverflow {
		t.Fatalf("empty 400 with a budget: class %q overruled %q", c.Class, c.Overruled)
	}
}

// TestStopReasonOverflowIsStated: a stop reason saying the window filled up
// is the provider's count; a small request does not overrule it, and an
// outcome the agent marked ok is not ok.
func TestStopReasonOverflowIsStated(t *testing.T) {
	t.Parallel()
	for _, stop := range []string{"model_context_window_exceeded", "model_length"} {
		o := events.Outcome{ID: "s", Agent: "a", Provider: "anthropic", Status: 200, OK: true, StopReason: stop,
			RequestTokens: 20000, ContextWindow: 200000}
		c := Classify(&o)
		if c.Class != events.ClassContextOverflow || c.Rule != "stop.context_window" || c.Overruled != "" {
			t.Fatalf("%s: class %q rule %s overruled %q", stop, c.Class, c.Rule, c.Overruled)
		}
		checkShape(t, &o, c)
	}
}

// TestStatedReasonOutranksStatus: one case per family of stated reasons, each
// body's words deciding against what its status alone would say.
func TestStatedReasonOutranksStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		o     events.Outcome
		class string
		rule  string
	}{
		{"credentials missing before any request", events.Outcome{TransportError: "openai.OpenAIError: The api_key client option must be set either by passing api_key to the client or by setting the OPENAI_API_KEY environment variable"},
			events.ClassAuth, "transport.credentials"},
		{"a URL without a scheme", events.Outcome{TransportError: `unsupported protocol scheme ""`}, events.ClassBadRequest, "transport.client_config"},
		{"aiohttp's ssl:default is not TLS", events.Outcome{TransportError: "Cannot connect to host localhost:11434 ssl:default [Connect call failed ('127.0.0.1', 11434)]"},
			events.ClassTransport, "transport.other"},
		{"an error event the SDK put in its message", events.Outcome{Status: 200, TransportError: `received error while streaming: {"type":"error","error":{"details":null,"type":"overloaded_error","message":"Overloaded"} }`},
			events.ClassOverloaded, "anthropic.overloaded"},
		{"a stream broken after the answer began, in the client's own words", events.Outcome{Status: 200, TransportError: "SyntaxError: Unexpected end of JSON input"},
			events.ClassTransport, "transport.other"},
		{"usage limit under 429", events.Outcome{Status: 429, Body: "You've reached your trial request limit"}, events.ClassQuotaExhausted, "quota.text"},
		{"budget under 400 typed auth_error", events.Outcome{Status: 400, Body: `{"error":{"message":"Budget has been exceeded! Current cost: 0.0010747, Max budget: 0.0","type":"auth_error","param":null,"code":400}}`},
			events.ClassQuotaExhausted, "family.billing"},
		{"moderation under 403", events.Outcome{Status: 403, Body: `{"error":{"code":403,"message":"Your chosen model requires moderation and your input was flagged"}}`},
			events.ClassContentRefusal, "refusal.text"},
		{"disabled organization under 400, wrapped across lines", events.Outcome{Status: 400, Body: `API Error: 400 {"type":"error","error":{"type":"invalid_request_error","message":"This organization has been\ndisabled."}}`},
			events.ClassAuth, "auth.text"},
		{"overflow inside a router's 500", events.Outcome{Status: 500, Body: `{"error":{"type":"Internal Server Error","code":"prefill_worker_failed_to_start","message":"Prefill worker failed to start: The decoder prompt (length 375008) is longer than ..."}}`},
			events.ClassContextOverflow, "overflow.text"},
		{"no endpoint supports tools under 404", events.Outcome{Status: 404, Body: `{"error":{"message":"No endpoints found that support tool use. To learn more about provider routing, visit: https://openrouter.ai/docs/provider-routing","code":404}}`},
			events.ClassUnsupportedParam, "capability.text"},
		{"a success without content", events.Outcome{Status: 200, Body: `{"candidates":[{"finishReason":"OTHER","index":0}],"usageMetadata":{"promptTokenCount":171}}`},
			events.ClassEmptyResponse, "status.2xx_no_content"},
		{"LiteLLM's exception name", events.Outcome{Status: 400, Body: "400 litellm.BadRequestError: litellm.ContentPolicyViolationError: Azure Exception - Error code: 400"},
			events.ClassContentRefusal, "family.refusal"},
		{"a Python repr body with the code inside", events.Outcome{Status: 429, Body: `Error code: 429 - {'error': {'message': 'You exceeded your current quota.', 'type': 'insufficient_quota', 'param': None, 'code': 'insufficient_quota'}}`},
			events.ClassQuotaExhausted, "openai.insufficient_quota"},
		{"the provider's code inside a wrapper's message", events.Outcome{Status: 500, Body: `{"error":{"message":"litellm.APIError: OpenAIException - Error code: 429 - {'error': {'code': 'insufficient_quota', 'message': 'quota'}}","code":"500"}}`},
			events.ClassQuotaExhausted, "openai.insufficient_quota"},
		{"an error object in a 200 that nothing names", events.Outcome{Status: 200, Body: `data:{"error":"Request failed: something","error_type":"mystery"}`},
			events.ClassServerError, "status.2xx_error"},
		{"an empty 422 is the status's meaning, not a gateway fault", events.Outcome{Status: 422, Body: "Error: 422 status code (no body)"},
			events.ClassUnsupportedParam, "status.422"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := tt.o
			o.ID, o.Agent, o.Provider = "x", "a", "p"
			c := Classify(&o)
			if c.Class != tt.class || c.Rule != tt.rule {
				t.Fatalf("class %q rule %s (evidence %q), want %q by %s", c.Class, c.Rule, c.Evidence, tt.class, tt.rule)
			}
			checkShape(t, &o, c)
		})
	}
}

// TestSuccessWithContentIsNotEmpty: the no-content rule needs a whole JSON
// document without any output; a stream, a tool call or text is content.
func TestSuccessWithContentIsNotEmpty(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"choices":[{"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`,
		`{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"id":"1","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`,
		`{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{}}}]},"finishReason":"STOP"}]}`,
		"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n",
	} {
		o := events.Outcome{ID: "x", Agent: "a", Provider: "p", Status: 200, Body: body}
		if c := Classify(&o); c.Class == events.ClassEmptyResponse {
			t.Errorf("%s: class %q rule %s", body, c.Class, c.Rule)
		}
	}
}

// TestBuiltinPatternsStayCompact: the built-in body patterns must fit the
// pattern set's compact automaton; past it Scan takes the slow table and
// BenchmarkClassify loses about a third. A new phrase whose first eight
// bytes bring a new character (a backtick, a bracket) costs an alphabet
// class for every state: put such characters later in the phrase.
func TestBuiltinPatternsStayCompact(t *testing.T) {
	t.Parallel()
	ok, cells, limit := Default().pats.Compact()
	if !ok {
		t.Fatalf("body patterns need %d table cells, the compact automaton holds %d", cells, limit)
	}
	t.Logf("body pattern automaton: %d of %d cells", cells, limit)
	if ok, cells, limit := Default().tpats.Compact(); !ok {
		t.Fatalf("transport patterns need %d table cells, the compact automaton holds %d", cells, limit)
	}
	// The ASCII word patterns of the keyword families are scanned on every
	// outcome with error text, so they are held to the same table.
	ok, cells, limit = Default().wpats.Compact()
	if !ok {
		t.Fatalf("word patterns need %d table cells, the compact automaton holds %d", cells, limit)
	}
	t.Logf("word pattern automaton: %d of %d cells", cells, limit)
}
