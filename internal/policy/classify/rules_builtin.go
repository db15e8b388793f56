package classify

import (
	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/pkg/events"
)

// builtinRules is the built-in rule table, in precedence order (see the
// Classifier doc comment). Rule ids are public: the classifier service
// reports them and operators grep for them, so never rename one.
//
// Sources for the shapes: the providers' API error docs and SDKs, and the
// real responses in testdata/corpus.jsonl (each row names its
// source).
var builtinRules = []builtin{
	// ── 1. End of stream: the model or the provider's filter refused. ──
	{Rule: Rule{ID: "stop.refusal", Class: cRefusal, StopReasons: rl("refusal", "content_filter", "content_filtered",
		"safety", "recitation", "prohibited_content", "blocklist", "spii", "image_safety", "guardrail_intervened")}},
	// The window filled up while generating. Anthropic Messages and Bedrock
	// Converse stop_reason model_context_window_exceeded (Anthropic docs
	// "Handling stop reasons"; Bedrock StopReason; Z.ai's Anthropic
	// endpoint), Mistral finish_reason model_length (Mistral API
	// ChatCompletionChoice). The provider counted input and output itself,
	// so the overflow evidence check does not apply (stated).
	{Rule: Rule{ID: "stop.context_window", Class: cOverflow, StopReasons: rl("model_context_window_exceeded", "model_length")}, stated: true},
	// Bedrock Converse StopReason malformed_model_output / malformed_tool_use:
	// the model's output broke the tool-use grammar.
	{Rule: Rule{ID: "stop.malformed_output", Class: cInvariant, StopReasons: rl("malformed_model_output", "malformed_tool_use")}},

	// ── 2. No (complete) HTTP response: transport families. ──
	// Node/undici/Bun, Go net/http, Python (requests, httpx, aiohttp).
	//
	// First what the client library says before any exchange: no
	// credentials, an unusable URL, a request it already knows is too long.
	// No retry fixes these.
	{Rule: Rule{ID: "transport.credentials", Class: cAuth, Status: rl(noResponse, success),
		Transport: rl(
			"api_key client option must be set",                     // openai-python / openai-node OpenAIError
			"could not resolve authentication method",               // anthropic-sdk-typescript / -python / Claude Code
			"unable to locate credentials",                          // botocore NoCredentialsError
			"could not load credentials from any providers",         // aws-sdk-js-v3 CredentialsProviderError
			"default credentials were not found",                    // google-auth DefaultCredentialsError
			"could not load the default credentials",                // google-auth-library-nodejs
			"defaultazurecredential failed",                         // azure-identity DefaultAzureCredential
			`invalid character in header content ["authorization"]`, // Node http: a key with a newline
			`invalid character in header content ["x-api-key"]`,
			"invalid header field value for \"authorization\"")}, transport: true,
		note: "the client had no usable credentials; nothing was sent"},
	{Rule: Rule{ID: "transport.client_config", Class: cBadRequest, Status: rl(noResponse, success),
		Transport: rl(
			"unsupportedprotocol", "request url is missing an", // httpx.UnsupportedProtocol
			"unsupported protocol scheme",                               // Go net/http
			"invalid url protocol",                                      // Bun fetch
			"failed to parse url",                                       // undici fetch
			"err_invalid_url",                                           // Node URL
			"no scheme supplied", "no connection adapters were found")}, // requests MissingSchema / InvalidSchema
		transport: true, note: "the client's configuration is unusable; nothing was sent"},
	{Rule: Rule{ID: "transport.overflow", Class: cOverflow, Status: rl(noResponse, success),
		Transport: rl(
			"exceed context window of",         // llama-cpp-python in process: "Requested tokens (516) exceed context window of 512"
			"is less than floor_output_tokens", // Continue: "availableContext 843 is less than FLOOR_OUTPUT_TOKENS 3000"
			"exceeds the context window",
			"maximum context length")}, transport: true,
		note: "the client counted the request against the window before sending"},
	{Rule: Rule{ID: "stream.invariant", Class: cInvariant, Status: rl(noResponse, success),
		Transport: rl("invariant", "unexpected event order", "stream grammar")}, transport: true},
	{Rule: Rule{ID: "transport.dns", Class: cDNS, Status: rl(noResponse, success),
		Transport: rl("enotfound", "eai_again", "eai_noname", "getaddrinfo", "no such host", "name or service not known",
			"temporary failure in name resolution", "nodename nor servname", "name resolution", "failed to resolve",
			"dns", "lookup ")}, transport: true},
	{Rule: Rule{ID: "transport.handshake_timeout", Class: cTimeout, Status: rl(noResponse, success),
		Transport: rl("tls handshake timeout", "handshake timed out", "handshake timeout")}, transport: true},
	{Rule: Rule{ID: "transport.tls_reset", Class: cTransport, Status: rl(noResponse, success),
		Transport: rl("eof occurred in violation of protocol", "disconnected before secure tls connection",
			"sslzeroreturnerror", "unexpected eof while reading")}, transport: true},
	{Rule: Rule{ID: "transport.tls", Class: cTLS, Status: rl(noResponse, success),
		// "[ssl:" (Python's "[SSL: CERTIFICATE_VERIFY_FAILED]"), not bare
		// "ssl:": aiohttp writes "Cannot connect to host h:11434
		// ssl:default [Connect call failed …]" for a refused connection.
		Transport: rl("x509", "certificate", "cert_", "err_tls", "tls:", "[ssl:", "ssl routines", "sslerror",
			"ssl error", "handshake failure", "unable_to_verify", "unable to verify", "self signed", "self-signed",
			"unable_to_get_issuer", "wrong version number", "altname", "depth_zero", "err_ssl")}, transport: true},
	{Rule: Rule{ID: "transport.timeout", Class: cTimeout, Status: rl(noResponse, success),
		Transport: rl("etimedout", "esockettimedout", "timed out", "timeout", "deadline exceeded",
			"aborted due to timeout")}, transport: true},
	{Rule: Rule{ID: "transport.connection", Class: cTransport, Status: rl(noResponse, success),
		Transport: rl("econnreset", "econnrefused", "econnaborted", "epipe", "ehostunreach", "enetunreach", "enetdown",
			"und_err", "other side closed", "socket hang up", "connection reset", "connection refused",
			"connection aborted", "connection closed", "connection error", "broken pipe", "fetch failed",
			"network error", "networkerror", "socket connection was closed", "unable to connect", "connectionrefused",
			"failedtoopensocket", "premature close", "terminated", "stream ended", "incomplete chunked read",
			"peer closed connection", "server disconnected", "remoteprotocolerror", "goaway", "stream error",
			"use of closed network connection", "no route to host", "network is unreachable", "eof", "aborted")},
		transport: true},

	// ── 3. Structured error codes, most specific first. ──
	// The providers' own code tables (tables/*.yaml) first: what a
	// provider's code means there, before any code family.
	{tables: true},
	// Hard spend limits: OpenAI 429 organization_/project_spend_limit_exceeded,
	// Groq 400 blocked_api_access. Access returns next month, not next minute.
	{Rule: Rule{ID: "spend_limit.code", Class: cQuota, Codes: rl("organization_spend_limit_exceeded",
		"project_spend_limit_exceeded", "blocked_api_access")}},
	// LiteLLM proxy ProxyErrorTypes.budget_exceeded (litellm/proxy/_types.py).
	{Rule: Rule{ID: "litellm.budget_exceeded", Class: cQuota, Codes: rl("budget_exceeded")}},
	// Per-day limits of rate-limit shaped errors (OpenAI RPD, Groq TPD,
	// Bedrock "tokens per day", OpenRouter free-models-per-day).
	{Rule: Rule{ID: "ratelimit.per_day", Class: cQuota, Status: rl("429", noResponse, success, "413"),
		Body: rl("per day", "(rpd)", "(tpd)", "-per-day", "daily limit", "daily quota", "per_day")}},
	// A single request larger than the profile's per-minute budget can never
	// pass on this profile (OpenAI 429, Groq 413 "Request too large").
	{Rule: Rule{ID: "ratelimit.request_exceeds_limit", Class: cQuota, Status: rl("429", "413"),
		Body: rl("request too large for")}},
	// Load shedding reported with a rate-limit code is the provider's
	// overload, not this profile's limit (Azure "peak load").
	{Rule: Rule{ID: "ratelimit.capacity", Class: cOverloaded, Codes: rateLimitCodes,
		Body: rl("high demand", "peak load", "currently overloaded", "over capacity")}},
	rateCodeQuota,
	{Rule: Rule{ID: "ratelimit.code", Class: cRate, Codes: rateLimitCodes}},
	{Rule: Rule{ID: "llamacpp.unavailable", Class: cOverloaded, Codes: rl("unavailable_error")}},
	// TGI ErrorResponse.error_type of a failed generation (router/src/server.rs),
	// often as a "data:{…}" event inside a 200 stream.
	{Rule: Rule{ID: "tgi.generation_error", Class: cServer, Status: rl("5xx", noResponse, success),
		Codes: rl("generation", "incomplete_generation")}},
	{Rule: Rule{ID: "provider.server_error", Class: cServer, Status: rl("5xx", noResponse, success),
		Codes:   rl("server_error", "api_error", "internal_error", "internal", "internal_server_error"),
		NotBody: overloadWords, NotWords: statedWords}},
	{Rule: Rule{ID: "overflow.code", Class: cOverflow, Codes: rl("context_length_exceeded", "exceed_context_size_error",
		"context_window_exceeded", "string_above_max_length")}},
	{Rule: Rule{ID: "refusal.code", Class: cRefusal, Codes: rl("content_filter", "content_policy_violation", "invalid_prompt",
		"responsibleaipolicyviolation", "safety", "prohibited_content", "blocklist", "recitation", "guardrail_intervened",
		"data_inspection_failed", "content_filtered")}},
	authCodeBilling,
	authCodeModel,
	{Rule: Rule{ID: "auth.code", Class: cAuth, Codes: authCodes}},
	{Rule: Rule{ID: "model.code", Class: cModel, Codes: rl("model_not_found", "model_decommissioned", "deploymentnotfound",
		"resourcenotfoundexception", "not_found_error", "notfounderror", "not_found", "model_not_available",
		"dedicated_endpoint_not_running")}}, // Together 400: the model's dedicated endpoint is stopped
	{Rule: Rule{ID: "param.code", Class: cParam, Codes: rl("unsupported_parameter", "unsupported_value", "extra_forbidden",
		"invalid_request_body", "unknown_parameter")}},

	// ── 4. Provider-scoped heuristics. ──
	// Cerebras reports an overflow as an empty 400/413; a generic gateway's
	// empty 400 means nothing of the kind.
	{Rule: Rule{ID: "cerebras.empty_400_overflow", Class: cOverflow, Status: rl("400", "413"), EmptyBody: ptrTrue()},
		emptyOverflow: true, heuristic: true, note: "provider reports overflow as an empty 400/413"},

	// ── 5. What the provider's message says. ──
	// Cloudflare's 52x pages describe the origin ("may be overloaded") and a
	// proxy's HTML 5xx page is the proxy's: the status is the verdict.
	{Rule: Rule{ID: "gateway.html_5xx", Class: cServer, Status: rl("5xx")}, html: 1, note: "HTML page from a proxy"},
	{Rule: Rule{ID: "cloudflare.origin_error", Class: cServer, Status: rl("520-527", "530")}},
	{Rule: Rule{ID: "overflow.text", Class: cOverflow, Body: rl("prompt is too long", "input is too long for requested model",
		"exceeds the context window", "input token count", "maximum prompt length is", "reduce the length of the messages",
		"maximum context length", "prompt token count of", "exceeds the available context size",
		"greater than the context length", "context window exceeds limit", "exceeded model token limit",
		"context length exceeded", "exceed context limit", "context the overflows", "too many input tokens",
		"exceeds the maximum number of tokens", "exceeds max context", "context window of this model",
		// TGI 422 input validation (router/src/validation.rs).
		"input validation error: `inputs` tokens + `max_new_tokens`", "input validation error: `inputs` must have less than",
		"exceeds context length",     // LM Studio: "Input length 1581 exceeds context length 1500"
		"request body too large for", // GitHub Models 413: "… for gpt-4.1 model. Max size: 8000 tokens."
		"input_too_large",            // xAI gRPC INVALID_ARGUMENT
		"total number of tokens (prompt and prediction) cannot exceed", // Cohere
		"the decoder prompt (length")}},                                // vLLM, also inside a router's 500
	famOverflow,
	famOverflowCount,
	famBilling,
	{Rule: Rule{ID: "capability.text", Class: cParam, Status: rl("400", "404", "422", success),
		Body: rl("no endpoints found that support", "not a chat model", "only supported in v1/responses",
			"missing conversation_config")}},
	{Rule: Rule{ID: "model.text", Class: cModel, Status: rl("400", "403", "404", "422", success),
		Body: rl("model not found", "model_not_found", "does not exist", "not a valid model", "invalid model",
			"unknown model", "no such model", "model not exist", "is not found for api version", "decommissioned",
			"no models loaded", "deployment for this resource does not exist", "try pulling it first",
			"model identifier is invalid", "end of its life", "is not supported for generatecontent",
			"no endpoints found for")}}, // OpenRouter 404: no provider serves the model id
	famModel,
	famRegion,
	{Rule: Rule{ID: "param.text", Class: cParam, Status: rl("400", "422", success),
		Body: rl("unsupported parameter", "unsupported value", "does not support tools", "does not support",
			"not supported with this model", "is not supported", "unknown name", "cannot find field",
			"extra inputs are not permitted", "additional properties", "json schema is invalid", "invalid schema",
			"tool choice requires", "unrecognized request argument", "unknown parameter", "unexpected keyword")}},
	famParam,
	{Rule: Rule{ID: "auth.text", Class: cAuth, Status: rl("400", "401", "403", "407"),
		Body: rl("api key not valid", "invalid api key", "provide an api key", "missing api key", "incorrect api key", "invalid x-api-key", "api key not found",
			"unauthorized", "authentication", "no auth credentials", "access denied", "permission denied",
			"invalid token", "token has expired", "expired token", "security token included in the request is invalid",
			"not authorized", "invalid subscription key",
			"organization has been restricted", "organization has been disabled", // Groq, Anthropic 400
			"api key expired",       // Gemini 400 INVALID_ARGUMENT
			"has been suspended")}}, // Gemini 403 "Consumer 'api_key:…' has been suspended"
	// The same statements on any status: a gateway that wraps them in a 500
	// (Pollinations "Invalid or unrecognized token provided", LiteLLM's 500
	// around Bedrock's "not authorized to perform … aws-marketplace" denial).
	{Rule: Rule{ID: "auth.stated", Class: cAuth,
		Body: rl("invalid or unrecognized token", "is not authorized to perform", "api key expired",
			"organization has been disabled", "organization has been restricted")}},
	famAccount,
	famAuth,
	{Rule: Rule{ID: "refusal.text", Class: cRefusal, Status: rl("400", "403", "451", "422", success),
		Body: rl("content management policy", "flagged as potentially violating", "usage policies", "usage policy",
			"content filter", "safety system", "content exists risk", "responsible ai", "guardrail",
			"sensitive content", "inappropriate content", "prohibited content", "high risk",
			"requires moderation", "input was flagged", // OpenRouter 403 moderation
			"content blocked",                // LiteLLM content filter guardrail (400, 403)
			"is being blocked for reason")}}, // NextChat relaying Gemini's blockReason
	famRefusal,
	{Rule: Rule{ID: "quota.text", Class: cQuota, Status: rl(anyHTTPError, noResponse, success),
		Body: rl("credit balance is too low", "insufficient balance", "insufficient credits", "requires more credits",
			"can only afford", "exceeded your current quota", "usage limit", "spend limit", "spending limit",
			"out of credits", "payment required", "insufficient funds", "balance is insufficient",
			"quota exceeded for quota metric",
			"budget has been exceeded", "exceeded budget", // LiteLLM proxy budgets (400, 429)
			"trial request limit", // Cursor 429
			// Claude subscription limits as Claude Code shows them (429):
			// "You've hit your limit · resets 1:30am (Asia/Dhaka)".
			"hit your limit · resets", "hit your limit for claude")}},
	famQuotaDay,
	famQuota,
	{Rule: Rule{ID: "overloaded.text", Class: cOverloaded, Status: rl("5xx", "429", noResponse, success),
		Body: rl("overloaded", "over capacity", "at capacity", "high demand", "capacity exceeded", "server is busy",
			"too busy", "loading model")}}, // llama.cpp server 503 "Loading model"
	famOverloaded,
	{Rule: Rule{ID: "ratelimit.text", Class: cRate, Status: rl("429", "503", noResponse, success),
		Body: rl("rate limit", "rate-limit", "ratelimit", "too many requests", "throttl", "slow down",
			"per minute", "too many tokens",
			"_per_minute")}}, // Vertex quota ids: generate_content_requests_per_minute_per_project…
	// A rate limit relayed inside a 5xx: the body states it (gpt4free's 500
	// around Together's "You have reached the rate limit specific to this
	// model").
	{Rule: Rule{ID: "ratelimit.text_5xx", Class: cRate, Status: rl("5xx"),
		Body: rl("reached the rate limit", "rate limit exceeded", "rate limit reached")}},
	famRateLimit,
	famTimeout,
	famServer,
	// What is not empty in a success status: Gemini's "Content has no parts"
	// (google-cloud-aiplatform, relayed by LiteLLM).
	{Rule: Rule{ID: "empty.text", Class: cEmpty, Status: rl(success, noResponse),
		Body: rl("content has no parts")}},
	famTransport,
	famTransportBody,
	// Any other transport error, after what its words say: without a
	// response, or with a success status (a stream that broke after the
	// answer began, in words of the client's own: a parser's "Unexpected
	// end of JSON input").
	{Rule: Rule{ID: "transport.other", Class: cTransport, Status: rl(noResponse, success)}, when: func(o *events.Outcome, _ *digest.View) bool { return o.TransportError != "" },
		note: "transport error", transport: true},
	// ── 6. LiteLLM's verdicts: its exception names in a message, after the
	// provider's own words and before the status (litellm/exceptions.py;
	// the proxy returns them as "litellm.RateLimitError: …").
	litellmName("litellm.exception.content_policy", cRefusal, "ContentPolicyViolationError", "RejectedRequestError"),
	litellmName("litellm.exception.context_window", cOverflow, "ContextWindowExceededError"),
	litellmName("litellm.exception.budget", cQuota, "BudgetExceededError"),
	litellmName("litellm.exception.auth", cAuth, "AuthenticationError", "PermissionDeniedError"),
	litellmName("litellm.exception.not_found", cModel, "NotFoundError"),
	litellmName("litellm.exception.rate_limit", cRate, "RateLimitError"),
	litellmName("litellm.exception.timeout", cTimeout, "Timeout"),
	litellmName("litellm.exception.unavailable", cOverloaded, "ServiceUnavailableError"),
	litellmName("litellm.exception.server_error", cServer, "InternalServerError"),
	litellmName("litellm.exception.connection", cTransport, "APIConnectionError"),
	litellmName("litellm.exception.unsupported_params", cParam, "UnsupportedParamsError"),
	// LiteLLM proxy type auth_error also labels a budget refusal ("Budget has
	// been exceeded!", type auth_error): only after the wording.
	{Rule: Rule{ID: "litellm.auth_error", Class: cAuth, Codes: rl("auth_error")}},

	// ── 7. Gateway and proxy pages. ──
	{Rule: Rule{ID: "envoy.upstream", Class: cServer, Status: rl("5xx"),
		Body: rl("upstream connect error", "no healthy upstream", "upstream request timeout", "disconnect/reset before headers")}},
	{Rule: Rule{ID: "gateway.request_too_large", Class: cBadRequest, Status: rl("413"),
		Body: rl("request entity too large", "payload too large", "content too large")}},
	{Rule: Rule{ID: "gateway.html_4xx", Class: cServer, Status: unexplained4xx}, html: 1,
		when: func(_ *events.Outcome, v *digest.View) bool { return !v.JSON }, note: "HTML page without an API error"},

	// ── 8. upstream_code: another library's verdict, a hint only. ──
	{Rule: Rule{ID: "upstream.context_overflow", Class: cOverflow, UpstreamCodes: rl("CONTEXT_WINDOW_EXCEEDED",
		"CONTEXT_LENGTH_EXCEEDED", "CONTEXT_OVERFLOW", "PROMPT_TOO_LONG", "context_overflow")}, heuristic: true},
	{Rule: Rule{ID: "upstream.rate_limit", Class: cRate, UpstreamCodes: rl("RATE_LIMIT", "RATE_LIMITED", "RATE_LIMIT_EXCEEDED", "TOO_MANY_REQUESTS", "rate_limit")}, heuristic: true},
	{Rule: Rule{ID: "upstream.quota_exhausted", Class: cQuota, UpstreamCodes: rl("QUOTA", "QUOTA_EXCEEDED", "QUOTA_EXHAUSTED", "INSUFFICIENT_QUOTA", "BILLING", "quota_exhausted")}, heuristic: true},
	{Rule: Rule{ID: "upstream.overloaded", Class: cOverloaded, UpstreamCodes: rl("OVERLOADED", "overloaded")}, heuristic: true},
	{Rule: Rule{ID: "upstream.server_error", Class: cServer, UpstreamCodes: rl("SERVER", "SERVER_ERROR", "INTERNAL", "server_error")}, heuristic: true},
	{Rule: Rule{ID: "upstream.timeout", Class: cTimeout, UpstreamCodes: rl("TIMEOUT", "TIMED_OUT", "timeout")}, heuristic: true},
	{Rule: Rule{ID: "upstream.transport", Class: cTransport, UpstreamCodes: rl("TRANSPORT", "NETWORK", "CONNECTION", "transport")}, heuristic: true},
	{Rule: Rule{ID: "upstream.empty_response", Class: cEmpty, UpstreamCodes: rl("EMPTY_RESPONSE", "EMPTY", "empty_response")}, heuristic: true},
	{Rule: Rule{ID: "upstream.invariant", Class: cInvariant, UpstreamCodes: rl("INVARIANT", "invariant")}, heuristic: true},
	{Rule: Rule{ID: "upstream.auth", Class: cAuth, UpstreamCodes: rl("AUTH", "UNAUTHORIZED", "AUTHENTICATION", "FORBIDDEN", "auth")}, heuristic: true},
	{Rule: Rule{ID: "upstream.model_not_found", Class: cModel, UpstreamCodes: rl("MODEL_NOT_FOUND", "model_not_found")}, heuristic: true},
	{Rule: Rule{ID: "upstream.content_refusal", Class: cRefusal, UpstreamCodes: rl("REFUSAL", "CONTENT_FILTER", "SAFETY", "content_refusal")}, heuristic: true},
	{Rule: Rule{ID: "upstream.unsupported_param", Class: cParam, UpstreamCodes: rl("UNSUPPORTED_PARAM", "INVALID_SCHEMA", "unsupported_param")}, heuristic: true},

	// ── 9. Hard evidence: the request is larger than the window. ──
	{Rule: Rule{ID: "evidence.tokens_exceed_window", Class: cOverflow, Status: rl("400", "413", "422")},
		when: func(o *events.Outcome, _ *digest.View) bool {
			return o.ContextWindow > 0 && o.RequestTokens >= o.ContextWindow
		}},

	// ── 10. What the status alone says. ──
	// CONTRACT.md: an unexplained empty-body 4xx from a gateway is a
	// server_error (retryable), never a guess at a cause.
	{Rule: Rule{ID: "gateway.empty_4xx", Class: cServer, Status: unexplained4xx, EmptyBody: ptrTrue()},
		note: "no reason given: treated as a gateway fault"},
	{Rule: Rule{ID: "status.401", Class: cAuth, Status: rl("401", "403", "407")}},
	{Rule: Rule{ID: "status.402", Class: cQuota, Status: rl("402")}},
	{Rule: Rule{ID: "status.404_model", Class: cModel, Status: rl("404"), Body: rl("model")}},
	{Rule: Rule{ID: "status.408", Class: cTimeout, Status: rl("408")}},
	{Rule: Rule{ID: "status.422", Class: cParam, Status: rl("422")}},
	{Rule: Rule{ID: "status.429", Class: cRate, Status: rl("429")}},
	{Rule: Rule{ID: "status.529", Class: cOverloaded, Status: rl("529")}},
	{Rule: Rule{ID: "status.5xx", Class: cServer, Status: rl("5xx")}},
	// An error object in a success status that nothing above explains: a
	// stream that ended on an error event (TGI "data:{\"error\":…}").
	{Rule: Rule{ID: "status.2xx_error", Class: cServer, Status: rl(success)}, when: func(_ *events.Outcome, v *digest.View) bool { return v.BodyError },
		note: "error object in a success response"},
	{Rule: Rule{ID: "status.4xx", Class: cBadRequest, Status: rl("4xx")}, note: "the provider stated a reason"},
	{Rule: Rule{ID: "status.2xx_empty", Class: cEmpty, Status: rl(success)}, when: func(o *events.Outcome, v *digest.View) bool { return v.EmptyBody && o.TransportError == "" },
		note: "success status without content"},
	// A complete JSON response without an error and without any content:
	// Gemini candidates without parts (finishReason OTHER, or MAX_TOKENS
	// spent on thinking), an OpenAI-style choice whose content is null.
	{Rule: Rule{ID: "status.2xx_no_content", Class: cEmpty, Status: rl(success)},
		when: func(o *events.Outcome, v *digest.View) bool {
			return v.Whole && !v.BodyError && !v.HasContent && o.TransportError == ""
		},
		note: "success response without content"},
}
