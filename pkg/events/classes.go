package events

// Classes of CONTRACT.md. Public interface: never rename; extend only.
const (
	ClassOK               = "ok"
	ClassTransport        = "transport"
	ClassTimeout          = "timeout"
	ClassTLS              = "tls"
	ClassDNS              = "dns"
	ClassRateLimit        = "rate_limit"
	ClassQuotaExhausted   = "quota_exhausted"
	ClassOverloaded       = "overloaded"
	ClassServerError      = "server_error"
	ClassEmptyResponse    = "empty_response"
	ClassAuth             = "auth"
	ClassBadRequest       = "bad_request"
	ClassUnsupportedParam = "unsupported_param"
	ClassModelNotFound    = "model_not_found"
	ClassContextOverflow  = "context_overflow"
	ClassContentRefusal   = "content_refusal"
	ClassInvariant        = "invariant"
	ClassUnknown          = "unknown"
)

// Scopes say where a fault lives, which decides what can fix it: a network
// fault is not fixed by switching models, a profile fault is fixed by another
// credential.
const (
	ScopeNetwork  = "network"
	ScopeProfile  = "profile"
	ScopeProvider = "provider"
	ScopeModel    = "model"
	ScopeContent  = "content"
	ScopeRequest  = "request"
)

// ClassInfo is the contract's default for one class.
type ClassInfo struct {
	Name      string
	Retryable bool
	Scope     string
}

// Classes lists every class of the contract with its default retryability
// and scope, in contract order.
var Classes = []ClassInfo{
	{ClassOK, false, ""},
	{ClassTransport, true, ScopeNetwork},
	{ClassTimeout, true, ScopeNetwork},
	{ClassTLS, false, ScopeNetwork},
	{ClassDNS, false, ScopeNetwork},
	{ClassRateLimit, true, ScopeProfile},
	{ClassQuotaExhausted, false, ScopeProfile},
	{ClassOverloaded, true, ScopeProvider},
	{ClassServerError, true, ScopeProvider},
	{ClassEmptyResponse, true, ScopeModel},
	{ClassAuth, false, ScopeProfile},
	{ClassBadRequest, false, ScopeRequest},
	{ClassUnsupportedParam, false, ScopeModel},
	{ClassModelNotFound, false, ScopeModel},
	{ClassContextOverflow, false, ScopeRequest},
	{ClassContentRefusal, false, ScopeContent},
	{ClassInvariant, false, ScopeModel},
	{ClassUnknown, false, ScopeRequest},
}

var classIndex = func() map[string]ClassInfo {
	m := make(map[string]ClassInfo, len(Classes))
	for _, c := range Classes {
		m[c.Name] = c
	}
	return m
}()

// LookupClass returns the contract defaults of a class and whether the name
// is a contract class at all.
func LookupClass(name string) (ClassInfo, bool) {
	c, ok := classIndex[name]
	return c, ok
}
