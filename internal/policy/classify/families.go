package classify

import (
	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/pkg/events"
)

// Keyword families: what a provider's message says, in the words any
// provider uses, English and Chinese, matched as whole words (Rule.Words:
// "quota" is not "quotas", "rpm" is not in "rpms"; Chinese, written
// without spaces, matches anywhere). They read the error text the extractor
// found wherever the body or the client put it (a JSON error object at any
// depth, a Python or JavaScript object an SDK printed, the last error event
// of a stream, a log line, a transport exception's text, the words of an
// error name such as AccountOverdueError), so they hold for providers no
// code table knows. A proxy's HTML page is left to the gateway rules: its
// words are the proxy's, not the provider's.
//
// The families run after the providers' code tables and the code families,
// each after the phrase rule of its class (see rules_builtin.go), and on
// any status unless noted: a provider's refusal wrapped in an application's
// 500 is still a refusal. The status decides only when the words say
// nothing.
//
// Order matters where the words of two classes meet:
//   - overflow first: a length limit is the most specific statement;
//   - money (balance, overdue, billing) before access: "Access denied,
//     please make sure your account is in good standing" is an overdue
//     account, "suspended due to insufficient balance" too;
//   - model before access: "does not exist or you do not have access to
//     it" is an inaccessible model;
//   - a locked or banned account before refusals: "账户存违规行为，账号已
//     被锁定" locks the account;
//   - per-day limits before quotas and quotas before rate limits, each
//     guarded by the per-minute words of the next.

// perMinute are the words of a limit that clears within the minute: a
// quota or billing phrase beside them is a rate limit (Google's "You
// exceeded your current quota, please check your plan and billing details"
// for a per-minute quota).
var perMinute = rl("per minute", "perminute", "per second", "rpm", "tpm", "qps", "rps", "rate limit*", "ratelimit*",
	"requests per min*", "tokens per min*", "concurren*",
	"每分钟", "每秒", "秒级", "并发", "频率", "频繁", "限流")

var famOverflow = builtin{Rule: Rule{ID: "family.overflow", Class: cOverflow,
	Words: rl("context length", "context window", "context size", "context limit", "context overflow", "maximum context",
		"max context", "model token limit", "token limit of the model", "exceeds the model's maximum",
		"prompt is too long", "prompt too long", "prompt tokens too long", "prompt is too large", "prompt too large",
		"input is too long", "input too long", "input is too large", "input too large", "input length",
		"prompt length", "message is too long", "messages are too long", "messages too long", "too many input tokens",
		"max_seq_len", "max_model_len", "maximum model length", "model max length", "max input length",
		"maximum input length", "n_ctx", "n_keep", "exceeds the maximum length", "exceeds maximum length",
		"exceed the maximum length", "exceeds the max length", "too long for the model", "longer than the maximum",
		"longer than the model", "token count exceeds", "exceeds the token limit", "exceeded the token limit",
		"exceeds token limit", "too many tokens in the prompt",
		"超长", "长度超过", "长度超出", "超出最大长度", "超过最大长度", "最大长度", "上下文长度", "上下文窗口", "超出上下文",
		"超过上下文", "token数量超过", "token 数量超过", "token数超过", "tokens数量超过", "输入内容过长", "输入过长",
		"输入长度", "超过模型最大", "最大上下文", "超出限制长度", "文本过长", "内容过长", "提示词过长", "消息过长"),
	// An output budget over the model's maximum is a parameter error:
	// "max_tokens must be less than or equal to 16384, the maximum value
	// for max_tokens is less than the context_window for this model".
	NotWords: rl("max_tokens", "max_completion_tokens", "max_new_tokens", "max_output_tokens")}, html: -1}

// famOverflowCount: a count of the request's tokens set against a limit,
// however the sentence runs ("input tokens (35000) plus prefix length (0)
// must be < 4096", "the number of tokens in the prompt exceeds the
// limit"). Only where an overflow can be a client error: a 429 that counts
// input tokens is a rate limit.
var famOverflowCount = builtin{Rule: Rule{ID: "family.overflow_count", Class: cOverflow,
	Status: rl("400", "413", "422", noResponse, success),
	Body: rl("input tokens", "inputs tokens", "prompt tokens", "input token count", "prompt token count",
		"number of tokens", "token count", "tokens in the prompt", "tokens in your prompt"),
	Words: rl("must be <", "must be less than", "must not exceed", "exceed*", "greater than", "more than the",
		"larger than", "longer than", "over the limit", "above the limit", "超过", "超出", "大于"),
	NotWords: append(rl("max_tokens", "max_completion_tokens", "max_new_tokens", "max_output_tokens",
		"per day", "daily", "per hour", "per month"), perMinute...)}, html: -1}

var famBilling = builtin{Rule: Rule{ID: "family.billing", Class: cQuota,
	Words: rl("insufficient balance", "balance is insufficient", "balance insufficient", "insufficient account balance",
		"account balance", "paid balance", "insufficient funds", "insufficient credit*", "credit balance", "credits balance", "out of credits",
		"no credits", "not enough credits", "credits have been exhausted", "overdue", "arrears", "arrearage",
		"in good standing", "recharge", "top up", "billing", "payment required", "payment method",
		"payment information", "add a payment", "prepaid", "unpaid", "delinquent", "resource package",
		"subscription has expired", "subscription expired", "plan has expired", "plan expired",
		"quota is not enough", "quota not enough", "user quota", "token quota", "insufficient quota",
		"exceeded your current quota", "budget has been exceeded", "budget exceeded",
		"exceeded budget", "over budget", "spend limit", "spending limit", "extra usage",
		"余额不足", "余额已用完", "余额为零", "余额耗尽", "账户余额", "欠费", "欠款", "充值", "续费", "额度不足", "额度已用尽",
		"额度已用完", "额度用尽", "额度耗尽", "额度不够", "用户额度", "令牌额度", "剩余额度", "配额不足", "资源包",
		"套餐已到期", "套餐到期", "订阅已到期", "服务已到期", "账户已到期", "付费"),
	NotWords: perMinute}, html: -1}

var famModel = builtin{Rule: Rule{ID: "family.model", Class: cModel,
	Words: rl("model not found", "model does not exist", "model not exist", "model doesn't exist", "no such model",
		"unknown model", "invalid model", "not a valid model", "model is not available", "model not available",
		"model has been deprecated", "model is deprecated", "model deprecated", "has been deprecated",
		"model has been retired", "model is retired", "not activated the model", "activate the model",
		"model is not enabled", "model not enabled", "model is not supported", "model not supported",
		"endpoint does not exist", "endpoint not found", "does not exist or you do not have access",
		"do not have access to the model", "not have access to model", "no access to the model",
		"access to this model", "access to the model", "model access",
		"模型不存在", "模型不可用", "模型未开通", "未开通该模型", "开通模型", "模型已下线", "模型下线", "无权访问该模型",
		"无该模型", "没有该模型", "模型名称错误", "模型名称不正确", "找不到模型", "不支持该模型", "暂未开放")}, html: -1}

var famParam = builtin{Rule: Rule{ID: "family.param", Class: cParam,
	Words: rl("is allowed for this model", "are allowed for this model", "allowed for this model",
		"not supported for this model", "not supported by this model", "not supported with this model",
		"not supported by the model", "model does not support", "does not support the parameter",
		"unsupported parameter", "unsupported param*", "unsupported value", "unsupported argument",
		"unsupported field", "unrecognized parameter", "unknown parameter", "unknown field", "only supports stream",
		"only support stream", "only the default",
		"不支持该参数", "参数不支持", "不支持此参数", "不支持参数", "调用方式", "仅支持", "只支持", "暂不支持")}, html: -1}

var famAccount = builtin{Rule: Rule{ID: "family.account", Class: cAuth,
	Words: rl("account is disabled", "account has been disabled", "account disabled", "account suspended",
		"account has been suspended", "account is suspended", "account locked", "account is locked",
		"account has been locked", "account banned", "account has been banned", "key has been revoked",
		"key was revoked", "access terminated",
		"账户已被锁定", "账号已被锁定", "已被锁定", "账户被锁定", "账号被锁定", "账户被禁用", "账号被禁用", "账号被封",
		"已被封禁", "封禁", "账户已冻结", "账号已冻结")}, html: -1}

var famAuth = builtin{Rule: Rule{ID: "family.auth", Class: cAuth,
	Words: rl("invalid api key", "api key is invalid", "api key invalid", "api key not valid",
		"api key is not valid", "incorrect api key", "wrong api key", "api key not found", "api key is missing",
		"missing api key", "no api key", "api key expired", "api key has expired", "api key is disabled",
		"api key error", "invalid token", "token is invalid", "token invalid", "token expired", "token has expired",
		"expired token", "invalid access token", "access token invalid", "access token expired",
		"authentication fail*", "authentication error", "authentication required", "unauthorized", "unauthenticated",
		"not authorized", "login fail*", "login required", "invalid credential*", "bad credentials",
		"invalid signature", "signature does not match", "signature mismatch", "permission denied", "access denied",
		"forbidden", "no permission", "not have permission", "insufficient permission*", "iam certification failed",
		"no auth", "not allowed to access",
		"鉴权失败", "认证失败", "身份验证失败", "授权失败", "授权错误", "未授权", "无权限", "没有权限", "权限不足", "无权访问",
		"api key 错误", "api key错误", "apikey错误", "api key 无效", "api key无效", "密钥无效", "密钥错误", "令牌无效",
		"token 非法", "token非法", "token 无效", "token无效", "token 已过期", "token已过期", "账户不存在", "账号不存在",
		"签名错误", "签名校验失败", "登录失败")}, html: -1}

var famRefusal = builtin{Rule: Rule{ID: "family.refusal", Class: cRefusal,
	Words: rl("inappropriate", "sensitive", "content filter*", "content policy",
		"content management policy", "moderation", "flagged", "unsafe", "high risk", "exists risk", "risk control",
		"harmful", "safety system", "safety filter", "safety reasons", "safety policy", "safety check",
		"blocked for safety", "violat*", "prohibited", "data inspection", "inspection failed", "audit", "censor*",
		"guardrail*", "responsible ai", "offensive",
		"敏感", "违规", "违法", "不安全", "不良", "审核", "内容安全", "风险", "有害", "涉政", "色情", "暴力", "拦截", "违反"),
	NotWords: rl("case sensitive")}, html: -1}

var famQuotaDay = builtin{Rule: Rule{ID: "family.quota_day", Class: cQuota,
	Words: rl("per day", "perday", "daily", "a day", "each day", "rpd", "tpd",
		"requests per day", "tokens per day", "day limit",
		"今日", "每日", "每天", "当日", "日限额", "日流控", "日调用"),
	// A per-minute limit that mentions the day ("upgrade today") is still
	// per minute.
	NotWords: rl("per minute", "perminute", "per second", "rpm", "tpm", "qps", "每分钟", "每秒", "秒级")}, html: -1}

var famQuota = builtin{Rule: Rule{ID: "family.quota", Class: cQuota,
	Words: rl("quota exceeded", "exceeded quota", "exceeded the quota", "exceeded your quota", "exceeds the quota",
		"quota exhausted", "quota has been exhausted", "quota is exhausted", "quota has been used up", "quota used up",
		"out of quota", "no quota", "quota limit", "service quota", "free tier", "free quota", "free allowance", "free allocated",
		"free trial", "trial quota", "trial limit", "usage limit", "usage cap", "usage quota", "monthly limit",
		"monthly quota", "weekly limit", "weekly quota", "limit exhausted", "limit will reset",
		"额度已用", "额度用尽", "超出额度", "超过额度", "使用上限", "用量上限", "调用次数限额", "次数限额", "配额已用", "超出配额",
		"超过配额", "免费额度", "免费配额", "试用额度", "限额将在"),
	NotWords: perMinute}, html: -1}

var famOverloaded = builtin{Rule: Rule{ID: "family.overloaded", Class: cOverloaded,
	Words: rl("overload*", "over capacity", "at capacity", "no capacity", "out of capacity", "insufficient capacity",
		"not enough capacity", "capacity constraints", "high demand", "heavy load", "high load",
		"high traffic", "too much traffic", "server is busy", "server busy", "servers are busy", "system is busy",
		"too busy", "busy", "insufficient resources", "not enough resources",
		"繁忙", "忙碌", "过载", "负载", "访问量过大", "访问量大", "请求量过大", "拥挤", "资源不足", "算力不足", "服务器压力",
		"压力过大", "人数过多", "排队")}, html: -1}

// famRateLimit counts on a 429, a 5xx that relays one, a streamed error or
// an outcome without a status: a 400 that quotes "rate limit" (a tool
// result echoing an upstream 429) is no rate limit of this profile.
var famRateLimit = builtin{Rule: Rule{ID: "family.ratelimit", Class: cRate, Status: rl("429", "5xx", noResponse, success),
	Words: rl("rate limit*", "ratelimit*", "too many requests", "too many tokens",
		"throttl*", "per minute", "per second", "requests per", "rpm", "tpm", "qps", "rps", "concurren*", "frequency",
		"slow down", "request limit", "requests limit",
		"频率", "频繁", "请求过多", "请求太多", "次数过多", "并发", "限流", "流控", "速率", "访问过快", "请求过快")}, html: -1}

// famTimeout: a timeout the provider or the client reports without a
// gateway's 5xx (a gateway's timeout page is the gateway's server error).
var famTimeout = builtin{Rule: Rule{ID: "family.timeout", Class: cTimeout, Status: rl("408", "499", noResponse, success),
	Words: rl("timed out", "timeout", "time out", "deadline exceeded", "请求超时", "超时")}, html: -1}

// famServer: a server fault stated inside a success status or a client's
// report (a 4xx is the request's fault, whatever its words).
var famServer = builtin{Rule: Rule{ID: "family.server", Class: cServer, Status: rl(noResponse, success),
	Words: rl("internal error", "internal server error", "server error", "unexpected error", "unknown error",
		"服务内部错误", "内部错误", "系统错误", "服务异常", "系统异常", "服务错误", "未知错误")}, html: -1}

// famTransport: a response that ended early, in the words of the client
// that read it (requests' "Response ended prematurely", httpx's "peer
// closed connection without sending complete message body").
var famTransport = builtin{Rule: Rule{ID: "family.transport", Class: cTransport, Status: rl(noResponse, success),
	Words: rl("ended prematurely", "incomplete chunked read", "peer closed connection", "premature close",
		"prematurely", "connection reset", "connection was reset", "connection closed", "connection aborted",
		"connection refused", "socket hang up", "broken pipe", "unexpected end of stream", "stream ended",
		"network error", "incomplete chunked encoding", "chunked encoding", "remote end closed connection",
		"connection lost", "lost connection", "connection was lost", "connection dropped",
		"remotedisconnected", "连接断开", "连接重置", "连接被重置", "网络错误", "网络异常")}, html: -1, transport: true}

// famTransportBody: the same words as the error object of a success
// status, written by a gateway that lost its upstream and answered for it
// (Portkey's 200 {"html-message": "Network connection lost."}).
var famTransportBody = builtin{Rule: Rule{ID: "family.transport_body", Class: cTransport, Status: rl(success),
	Words: famTransport.Words}, html: -1,
	when: func(_ *events.Outcome, v *digest.View) bool { return v.BodyError }}

// famRegion: the key may not be used from where the request comes (Gemini
// "User location is not supported for the API use.", OpenAI's
// unsupported_country_region_territory): a credential's restriction, not a
// parameter's, so before the parameter phrases ("is not supported").
var famRegion = builtin{Rule: Rule{ID: "family.region", Class: cAuth,
	Words: rl("location is not supported", "region is not supported", "country is not supported",
		"not available in your region", "not available in your country", "unsupported country", "unsupported region",
		"unsupported location", "or territory not supported",
		"地区不支持", "不支持该地区", "所在地区", "所在国家")}, html: -1}

// Generic codes that name only the status ("forbidden", "rate_limit_error",
// "permission_denied") yield to a message that states more: a billing
// statement or a model the key may not use under an access code, a spend
// or usage cap under a rate-limit code (Anthropic "rate_limit_error" with
// "You have reached your monthly spend limit.").
var (
	authCodeBilling = builtin{Rule: Rule{ID: "auth.code_billing", Class: cQuota, Codes: authCodes,
		Words: famBilling.Words, NotWords: perMinute}, html: -1}
	authCodeModel = builtin{Rule: Rule{ID: "auth.code_model", Class: cModel, Codes: authCodes,
		Words: rl("access to the model", "access to this model", "access to model", "model access",
			"do not have access to the model", "not activated the model", "无权访问该模型")}, html: -1}
	rateCodeQuota = builtin{Rule: Rule{ID: "ratelimit.code_quota", Class: cQuota, Codes: rateLimitCodes,
		Words: rl("spend limit", "spending limit", "extra usage", "monthly limit", "monthly spend", "weekly limit",
			"billing", "insufficient balance", "insufficient credit*", "out of credits", "usage limit"),
		NotWords: rl("per minute", "perminute", "per second", "rpm", "tpm", "qps", "每分钟", "每秒")}, html: -1}
)

// statedWords are the words of a stated reason more specific than a
// generic server-fault code: MiniMax answers "insufficient balance (1008)"
// as a 500 typed api_error, gateways wrap a refusal or an overflow in
// their own server_error. provider.server_error yields to them, and the
// families decide.
var statedWords = func() []string {
	var out []string
	for _, f := range []builtin{famOverflow, famBilling, famModel, famAccount, famAuth, famRefusal, famQuotaDay, famQuota} {
		out = append(out, f.Words...)
	}
	return out
}()
