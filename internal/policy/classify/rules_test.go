package classify

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/failbus/failbus/internal/policy/classify/internal/delay"
	"github.com/failbus/failbus/internal/policy/classify/internal/digest"
	"github.com/failbus/failbus/internal/policy/classify/internal/excerpt"
	"github.com/failbus/failbus/pkg/events"
	"go.yaml.in/yaml/v3"
)

// TestGatewayEmpty400IsNoOverflow: a gateway's empty 400 with an upstream
// CONTEXT_WINDOW_EXCEEDED far below the window is no overflow, and a
// provider whose empty 400 does mean overflow keeps its rule.
func TestGatewayEmpty400IsNoOverflow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name          string
		outcome       events.Outcome
		class, over   string
		evidence, rul string
	}{
		{
			name: "generic gateway empty 400 with upstream CONTEXT_WINDOW_EXCEEDED at 41k of 256k is a retryable server_error",
			outcome: events.Outcome{ID: "s1", Agent: "a", Provider: "my-gateway", Status: 400, UpstreamCode: "CONTEXT_WINDOW_EXCEEDED",
				RequestTokens: 41000, ContextWindow: 256000},
			class: events.ClassServerError, over: events.ClassContextOverflow, evidence: "41000 of 256000 tokens", rul: "gateway.empty_4xx",
		},
		{
			name:    "cerebras empty 413 at 130.9k of 131k is a context overflow",
			outcome: events.Outcome{ID: "s2", Agent: "a", Provider: "cerebras", Status: 413, RequestTokens: 130900, ContextWindow: 131000},
			class:   events.ClassContextOverflow, evidence: "130900 of 131000 tokens", rul: "cerebras.empty_400_overflow",
		},
		{
			name:    "the cerebras rule does not fire for a generic gateway",
			outcome: events.Outcome{ID: "s3", Agent: "a", Provider: "my-gateway", Status: 413, RequestTokens: 130900, ContextWindow: 131000},
			class:   events.ClassServerError, rul: "gateway.empty_4xx",
		},
		{
			name:    "an empty 400 over the window is an overflow on evidence alone",
			outcome: events.Outcome{ID: "s4", Agent: "a", Provider: "my-gateway", Status: 400, RequestTokens: 300000, ContextWindow: 256000},
			class:   events.ClassContextOverflow, rul: "evidence.tokens_exceed_window",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := Classify(&tt.outcome)
			if c.Class != tt.class || c.Overruled != tt.over || c.Rule != tt.rul {
				t.Fatalf("got class %q overruled %q rule %q (evidence %q), want %q %q %q", c.Class, c.Overruled, c.Rule, c.Evidence, tt.class, tt.over, tt.rul)
			}
			if tt.evidence != "" && !strings.Contains(strings.Join(c.Evidence, "|"), tt.evidence) {
				t.Fatalf("evidence %q lacks %q", c.Evidence, tt.evidence)
			}
			checkShape(t, &tt.outcome, c)
		})
	}
}

// TestEchoedStatusIsNotEvidence: a 400 whose text mentions 429 and rate
// limits stays a bad request; the same words on a 429 are a rate limit.
func TestEchoedStatusIsNotEvidence(t *testing.T) {
	t.Parallel()
	body := `{"error":{"message":"Invalid value: tool output was 'HTTP 429 Too Many Requests: rate limit exceeded, retry after 30 seconds'","type":"invalid_request_error","code":null}}`
	c := Classify(&events.Outcome{ID: "e", Agent: "a", Provider: "openai", Status: 400, Body: body})
	if c.Class != events.ClassBadRequest {
		t.Fatalf("400 echoing 429: class %q rule %s", c.Class, c.Rule)
	}
	c = Classify(&events.Outcome{ID: "e", Agent: "a", Provider: "openai", Status: 429, Body: body})
	if c.Class != events.ClassRateLimit {
		t.Fatalf("429: class %q rule %s", c.Class, c.Rule)
	}
}

func TestClassifyConfig(t *testing.T) {
	t.Parallel()
	empty400 := events.Outcome{ID: "x", Agent: "a", Provider: "cerebras", Status: 400}
	gw400 := events.Outcome{ID: "x", Agent: "a", Provider: "my-gateway", Status: 400}
	tests := []struct {
		name  string
		cfg   Config
		o     events.Outcome
		class string
	}{
		{"default: cerebras empty 400 is overflow", Config{}, empty400, events.ClassContextOverflow},
		{"explicit empty list turns the cerebras rule off", Config{EmptyOverflowProviders: []string{}}, empty400, events.ClassServerError},
		{"a configured provider gets the rule", Config{EmptyOverflowProviders: []string{"My-Gateway"}}, gw400, events.ClassContextOverflow},
		{"ratio 0.1 keeps a claim at 16%", Config{OverflowEvidenceRatio: 0.1},
			events.Outcome{ID: "x", Agent: "a", Provider: "cerebras", Status: 400, RequestTokens: 41000, ContextWindow: 256000}, events.ClassContextOverflow},
		{"quota_after off keeps a long rate limit", Config{QuotaAfter: -1},
			events.Outcome{ID: "x", Agent: "a", Provider: "openai", Status: 429, Headers: map[string]string{"retry-after": "86400"}}, events.ClassRateLimit},
		{"default quota_after makes a day-long wait a quota", Config{},
			events.Outcome{ID: "x", Agent: "a", Provider: "openai", Status: 429, Headers: map[string]string{"retry-after": "86400"}}, events.ClassQuotaExhausted},
		{"user rule runs before built-ins", Config{Rules: []Rule{{ID: "gw.busy", Class: events.ClassOverloaded, Providers: []string{"my-gateway"}, Status: []string{"400"}, EmptyBody: ptrTrue()}}},
			gw400, events.ClassOverloaded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cl, err := New(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if c := cl.Classify(&tt.o); c.Class != tt.class {
				t.Fatalf("class %q (rule %s, evidence %q), want %q", c.Class, c.Rule, c.Evidence, tt.class)
			}
		})
	}
}

func TestValidateNamesTheBadRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown class", Config{Rules: []Rule{{ID: "ok.one", Class: "rate_limit", Status: []string{"429"}}, {ID: "my.rule", Class: "overflow", Body: []string{"x"}}}},
			`classify.rules[1] (id "my.rule"): class: "overflow" is not a contract class`},
		{"missing id", Config{Rules: []Rule{{Class: "auth", Status: []string{"401"}}}}, `classify.rules[0]: id: missing`},
		{"no condition", Config{Rules: []Rule{{ID: "empty", Class: "auth"}}}, `(id "empty"): conditions:`},
		{"bad status", Config{Rules: []Rule{{ID: "s", Class: "auth", Status: []string{"4x"}}}}, `(id "s"): status: "4x"`},
		{"duplicate id", Config{Rules: []Rule{{ID: "d", Class: "auth", Status: []string{"401"}}, {ID: "d", Class: "auth", Status: []string{"403"}}}}, `classify.rules[1] (id "d"): id: duplicate of classify.rules[0]`},
		{"built-in id", Config{Rules: []Rule{{ID: "gateway.empty_4xx", Class: "auth", Status: []string{"401"}}}}, `is a built-in rule id`},
		{"upper-case header", Config{Rules: []Rule{{ID: "h", Class: "auth", Headers: map[string]string{"X-Foo": ""}}}}, `(id "h"): headers:`},
		{"ratio", Config{OverflowEvidenceRatio: 1.5}, `classify.overflow_evidence_ratio`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to contain %q", err, tt.want)
			}
			if _, err := New(tt.cfg); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
	var re *RuleError
	if err := (Config{Rules: []Rule{{ID: "x", Class: "nope", Status: []string{"1"}}}}).Validate(); !errors.As(err, &re) || re.Field != "class" {
		t.Fatalf("want a *RuleError on class, got %v", err)
	}
}

// TestClassifyYAML decodes the documented `classify:` section.
func TestClassifyYAML(t *testing.T) {
	t.Parallel()
	doc := `
rules:
  - id: my-gateway.busy
    class: overloaded
    providers: [my-gateway]
    status: [503, 4xx, 520-530]
    body: ["queue full"]
    headers: {x-gateway: busy}
empty_overflow_providers: [cerebras, my-llm]
overflow_evidence_ratio: 0.8
quota_after: 30m
`
	var cfg Config
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.QuotaAfter != 30*time.Minute || cfg.OverflowEvidenceRatio != 0.8 || len(cfg.Rules) != 1 || cfg.Rules[0].Status[0] != "503" {
		t.Fatalf("decoded %+v", cfg)
	}
	cl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := cl.Classify(&events.Outcome{ID: "y", Agent: "a", Provider: "my-gateway", Status: 502, Body: "Gateway QUEUE FULL, come back later",
		Headers: map[string]string{"x-gateway": "node-7 busy"}})
	if c.Class != events.ClassServerError {
		// 502 is outside the rule's statuses: the built-ins decide.
		t.Fatalf("502: class %q rule %s", c.Class, c.Rule)
	}
	c = cl.Classify(&events.Outcome{ID: "y", Agent: "a", Provider: "my-gateway", Status: 503, Body: "Gateway QUEUE FULL, come back later",
		Headers: map[string]string{"x-gateway": "node-7 busy"}})
	if c.Class != events.ClassOverloaded || c.Rule != "my-gateway.busy" {
		t.Fatalf("503: class %q rule %s evidence %q", c.Class, c.Rule, c.Evidence)
	}
}

func TestRetryHints(t *testing.T) {
	t.Parallel()
	at := events.At(time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC))
	f := false
	tests := []struct {
		name    string
		o       events.Outcome
		afterMS int64
		source  string
		should  *bool
		none    bool
	}{
		{name: "retry-after-ms wins over retry-after", o: events.Outcome{Headers: map[string]string{"retry-after-ms": "1500.2", "retry-after": "9"}}, afterMS: 1501, source: HintRetryAfterMS},
		{name: "retry-after seconds", o: events.Outcome{Headers: map[string]string{"retry-after": "20"}}, afterMS: 20000, source: HintRetryAfter},
		{name: "retry-after HTTP-date against at", o: events.Outcome{At: at, Headers: map[string]string{"retry-after": "Mon, 02 Mar 2026 10:00:45 GMT"}}, afterMS: 45000, source: HintRetryAfter},
		{name: "x-should-retry false alone", o: events.Outcome{Headers: map[string]string{"x-should-retry": "false"}}, should: &f},
		{name: "Gemini retryDelay", o: events.Outcome{Body: `{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"22.718768524s"}]}}`}, afterMS: 22719, source: HintRetryDelay},
		{name: "please try again in 634ms", o: events.Outcome{Body: `{"error":{"message":"Rate limit reached. Please try again in 634ms.","code":"rate_limit_exceeded"}}`}, afterMS: 634, source: HintBody},
		{name: "quota will reset after 39s", o: events.Outcome{Body: `{"error":{"message":"Your quota will reset after 39s.","status":"RESOURCE_EXHAUSTED"}}`}, afterMS: 39000, source: HintBody},
		{name: "compound duration", o: events.Outcome{Body: `Please try again in 9m38.016s.`}, afterMS: 578016, source: HintBody},
		{name: "retry after N seconds", o: events.Outcome{Body: `{"error":{"message":"Please retry after 6 seconds."}}`}, afterMS: 6000, source: HintBody},
		{name: "no hint", o: events.Outcome{Body: `{"error":{"message":"Please try again later."}}`}, none: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := tt.o
			o.ID, o.Agent, o.Provider, o.Status = "h", "a", "p", 429
			h := Classify(&o).Hints
			if tt.none {
				if h != nil {
					t.Fatalf("hints %+v, want none", h)
				}
				return
			}
			if h == nil || h.AfterMS != tt.afterMS || h.Source != tt.source {
				t.Fatalf("hints %+v, want after_ms %d from %s", h, tt.afterMS, tt.source)
			}
			if (tt.should == nil) != (h.ShouldRetry == nil) || tt.should != nil && *tt.should != *h.ShouldRetry {
				t.Fatalf("should_retry %v, want %v", h.ShouldRetry, tt.should)
			}
		})
	}
}

func TestClassifyNilAndOK(t *testing.T) {
	t.Parallel()
	if c := Classify(nil); c.Class != events.ClassUnknown {
		t.Fatalf("nil outcome: %+v", c)
	}
	o := events.Outcome{ID: "ok", Agent: "a", Provider: "p", OK: true, Status: 200}
	c := Classify(&o)
	if c.Class != events.ClassOK || c.Rule != RuleOK || c.Retryable {
		t.Fatalf("ok outcome: %+v", c)
	}
}

// FuzzClassify: whatever the outcome, Classify never panics and always
// returns a contract class with a rule and evidence.
func FuzzClassify(f *testing.F) {
	for _, r := range loadCorpus(f) {
		o := r.outcome
		f.Add(o.Status, o.Body, o.TransportError, o.UpstreamCode, o.Provider, o.Headers["retry-after"], o.StopReason, o.RequestTokens, o.ContextWindow, o.MaxOutputTokens, o.OK)
	}
	for _, r := range loadWild(f) {
		o := r.outcome
		f.Add(o.Status, o.Body, o.TransportError, o.UpstreamCode, o.Provider, o.Headers["retry-after"], o.StopReason, o.RequestTokens, o.ContextWindow, o.MaxOutputTokens, o.OK)
	}
	f.Add(200, `{"error":{"message":"{\"error\":{\"message\":\"[{\\\"a\\\":1}]\"}}"}}`, "", "", "x", "", "", 0, 0, 0, false)
	f.Add(400, `{"error":`, "", "CONTEXT_WINDOW_EXCEEDED", "cerebras", "Mon, 02 Jan 2006 15:04:05 GMT", "", -5, 0, 0, false)
	f.Add(200, `{'error': {'message': "x {'a': None, 'b': 'it\\'s'}"}}`, `SSE Error: {"error":{"type":"overloaded_error"}}`, "", "x", "", "model_length", 10, 20, 1<<62, true)
	f.Fuzz(func(t *testing.T, status int, body, transport, upstream, provider, retryAfter, stop string, tokens, window, maxOut int, ok bool) {
		o := events.Outcome{ID: "f", Agent: "a", Provider: provider, Status: status, Body: body, TransportError: transport,
			UpstreamCode: upstream, StopReason: stop, RequestTokens: tokens, ContextWindow: window, MaxOutputTokens: maxOut, OK: ok,
			Headers: map[string]string{"retry-after": retryAfter, "retry-after-ms": retryAfter, "x-amzn-errortype": upstream}}
		c := Classify(&o)
		if _, valid := events.LookupClass(c.Class); !valid {
			t.Fatalf("class %q is not a contract class", c.Class)
		}
		if c.Rule == "" || len(c.Evidence) == 0 {
			t.Fatalf("rule %q evidence %q", c.Rule, c.Evidence)
		}
		if c.Hints != nil && (c.Hints.AfterMS < 0 || c.Hints.AfterMS > delay.MaxMS) {
			t.Fatalf("hint %d out of range", c.Hints.AfterMS)
		}
		for _, e := range c.Evidence {
			// Each field on its own: two invalid halves can concatenate
			// into a valid rune ("\xd5" + "\x96").
			if !utf8.ValidString(e) && allUTF8(body, transport, upstream, provider, stop) {
				t.Fatalf("evidence %q is not UTF-8 though the input is", e)
			}
		}
		if s := Signature(&o); len(s) > maxSignature {
			t.Fatalf("signature of %d bytes: %q", len(s), s)
		}
	})
}

func allUTF8(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// BenchmarkClassify classifies the corpus mix, one outcome per op.
func BenchmarkClassify(b *testing.B) {
	rows := loadCorpus(b)
	outs := make([]events.Outcome, len(rows))
	for i := range rows {
		outs[i] = rows[i].outcome
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		_ = Classify(&outs[i])
		i++
		if i == len(outs) {
			i = 0
		}
	}
}

// TestEvidenceRedactsAcrossTheCut: a credential that straddles the
// excerpt's cut is masked, not cut down to a stub too short to look like a
// key and shown.
func TestEvidenceRedactsAcrossTheCut(t *testing.T) {
	t.Parallel()
	secrets := []struct {
		name, text, stub string // stub: the first secret bytes after the kept prefix
	}{
		{"openai project key", "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "AbCd"},
		{"anthropic key", "sk-ant-api03-QwErTyUiOpAsDfGhJkLzXcVbNm0123456789", "api0"},
		{"google key", "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW", "SyA1"},
		{"bearer token", "Bearer QwErTyUiOpAsDfGhJkLz0123456789", "QwEr"},
		{"json api_key", `"api_key": "ZxCvBnMaSdFgHjKl0123"`, "ZxCv"},
		{"key in a URL", "https://h.example/v1?key=ZxCvBnMaSdFgHjKl0123&x=1", "ZxCv"},
	}
	for _, sc := range secrets {
		for pad := excerpt.Max - 40; pad <= excerpt.Max+8; pad++ {
			text := strings.Repeat("y", pad) + " " + sc.text + " tail"
			body, err := json.Marshal(map[string]any{"error": map[string]string{"message": text, "type": "invalid_request_error"}})
			if err != nil {
				t.Fatal(err)
			}
			outcomes := []events.Outcome{
				{ID: "r", Agent: "a", Provider: "openai", Status: 401, Body: string(body)},
				{ID: "r", Agent: "a", Provider: "openai", TransportError: "fetch failed: ECONNRESET " + text},
				{ID: "r", Agent: "a", Provider: "my-gateway", Status: 502, Body: text},
			}
			for _, o := range outcomes {
				c := Classify(&o)
				for _, e := range c.Evidence {
					if strings.Contains(e, sc.stub) {
						t.Fatalf("%s at offset %d: evidence %q shows part of the secret", sc.name, pad, e)
					}
				}
			}
		}
	}
}

// TestNoBodyPlaceholder: the SDK text for a response without a body is an
// empty body ("400 status code (no body)").
func TestNoBodyPlaceholder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body  string
		empty bool
	}{
		{"400 status code (no body)", true},
		{"Error: 413 status code (no body)", true},
		{"  502 status code (no body)\n", true},
		{"(no status code or body)", true},
		{"400 status code (no body) CONTEXT_WINDOW_EXCEEDED", false},
		{"999 status code (no body)", false},
		{"40x status code (no body)", false},
		{"400 Bad Request", false},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			t.Parallel()
			v := digest.Get()
			defer digest.Put(v)
			v.Reset(&events.Outcome{Status: 400, Body: tt.body})
			if v.EmptyBody != tt.empty || v.Placeholder != tt.empty {
				t.Fatalf("empty %v placeholder %v, want %v", v.EmptyBody, v.Placeholder, tt.empty)
			}
		})
	}
	// Through the classifier: a gateway's placeholder keeps no overflow
	// claim; Cerebras' is its overflow signal.
	gw := Classify(&events.Outcome{ID: "p", Agent: "a", Provider: "my-gateway", Status: 400, Body: "400 status code (no body)", UpstreamCode: "CONTEXT_WINDOW_EXCEEDED"})
	if gw.Class != events.ClassServerError || gw.Overruled != events.ClassContextOverflow {
		t.Fatalf("gateway placeholder: %q overruled %q (%q)", gw.Class, gw.Overruled, gw.Evidence)
	}
	cb := Classify(&events.Outcome{ID: "p", Agent: "a", Provider: "cerebras", Status: 400, Body: "400 status code (no body)"})
	if cb.Class != events.ClassContextOverflow {
		t.Fatalf("cerebras placeholder: %q (%q)", cb.Class, cb.Evidence)
	}
}
