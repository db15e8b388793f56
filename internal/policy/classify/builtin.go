package classify

// The pieces the built-in rule table (rules_builtin.go) is written with.

import (
	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/pkg/events"
)

// builtin is a built-in rule: a Rule plus the few conditions the policy
// file cannot express.
type builtin struct {
	Rule
	html          int8
	transport     bool // transport stage: yields to an error object in the body
	heuristic     bool
	emptyOverflow bool
	stated        bool // a provider's own overflow statement: no evidence ratio
	when          func(o *events.Outcome, v *digest.View) bool
	note          string
	// tables marks where the built-in code tables (tables.go) run; the
	// entry is no rule itself.
	tables bool
}

func rl(s ...string) []string { return s }

func ptrTrue() *bool { b := true; return &b }

const (
	cOK          = events.ClassOK
	cTransport   = events.ClassTransport
	cTimeout     = events.ClassTimeout
	cTLS         = events.ClassTLS
	cDNS         = events.ClassDNS
	cRate        = events.ClassRateLimit
	cQuota       = events.ClassQuotaExhausted
	cOverloaded  = events.ClassOverloaded
	cServer      = events.ClassServerError
	cEmpty       = events.ClassEmptyResponse
	cAuth        = events.ClassAuth
	cBadRequest  = events.ClassBadRequest
	cParam       = events.ClassUnsupportedParam
	cModel       = events.ClassModelNotFound
	cOverflow    = events.ClassContextOverflow
	cRefusal     = events.ClassContentRefusal
	cInvariant   = events.ClassInvariant
	noResponse   = "0"
	success      = "2xx"
	anyHTTPError = "4xx"
)

// The statuses of "an unexplained 4xx": every 4xx that does not carry a
// meaning of its own (401/402/403/407 credentials and money, 408 timeout,
// 429 rate limit).
// 422 is not among them: it says the request was understood and its content
// rejected (status.422), and a client that drops the body leaves only the
// status (Mistral's empty 422, "Error: 422 status code (no body)").
var unexplained4xx = rl("400", "404-406", "409-413", "414-421", "423-428", "431", "451", "499")

var rateLimitCodes = rl("rate_limit_exceeded", "rate_limit_error", "rate_limited", "ratelimitexceeded", "rate_limit",
	"too_many_requests", "throttlingexception", "throttled")

// authCodes are the structured codes of a refused credential or
// permission (auth.code).
var authCodes = rl("authentication_error", "invalid_api_key", "permission_error",
	"permission_denied", "unauthenticated", "unauthorized", "accessdeniedexception", "unrecognizedclientexception",
	"expiredtokenexception", "invalidsignatureexception", "api_key_invalid", "incorrect_api_key",
	"invalid_authentication", "access_terminated", "unsupported_country_region_territory", "token_expired",
	"authentication_failed", "forbidden",
	"organization_restricted", // Groq 400: the organization was restricted
	// LiteLLM proxy ProxyErrorTypes (litellm/proxy/_types.py): the key,
	// team, user or organization may not use the model, or the key is gone.
	"expired_key", "token_not_found_in_db", "key_model_access_denied", "team_model_access_denied",
	"user_model_access_denied", "org_model_access_denied")

var overloadWords = rl("overloaded", "high demand", "over capacity", "at capacity")

// litellmName is a rule on LiteLLM exception names in the error text, as
// LiteLLM writes them: "litellm.RateLimitError: …" and
// "litellm.exceptions.RateLimitError".
func litellmName(id, class string, names ...string) builtin {
	var body []string
	for _, n := range names {
		body = append(body, "litellm."+n, "litellm.exceptions."+n)
		if distinctiveLiteLLMName[n] {
			body = append(body, n) // also printed bare: "ContextWindowExceededError: …"
		}
	}
	return builtin{Rule: Rule{ID: id, Class: class, Body: body}}
}

// distinctiveLiteLLMName: exception names no other library uses, matched
// without the "litellm." prefix too. RateLimitError, NotFoundError and the
// like are also openai-python's and need the prefix.
var distinctiveLiteLLMName = map[string]bool{
	"ContentPolicyViolationError": true, "ContextWindowExceededError": true, "BudgetExceededError": true,
}
