package classify

import (
	"strings"
	"testing"

	"github.com/failbus/failbus/pkg/events"
)

// TestSignatureGroupsWhatVaries: two outcomes a single rule would cover
// share a signature although their numbers, names, ids and URLs differ;
// the signature never shows a secret.
func TestSignatureGroupsWhatVaries(t *testing.T) {
	t.Parallel()
	a := events.Outcome{Status: 400, Body: `{"error":{"message":"Model 'gpt-4o' has 12000 tokens, limit 8192; see https://x.example/a","type":"invalid_request_error","code":"too_big"}}`}
	b := events.Outcome{Status: 400, Body: `{"error":{"message":"Model 'llama-3' has 99 tokens, limit 64; see https://y.example/b?c=d","type":"invalid_request_error","code":"too_big"}}`}
	sa, sb := Signature(&a), Signature(&b)
	if sa != sb {
		t.Fatalf("signatures differ:\n%s\n%s", sa, sb)
	}
	want := "status 400 | invalid_request_error,too_big | model '…' has N tokens, limit N; see <url>"
	if sa != want {
		t.Fatalf("signature %q, want %q", sa, want)
	}
	other := events.Outcome{Status: 429, Body: a.Body}
	if Signature(&other) == sa {
		t.Fatal("a different status shares the signature")
	}
	for _, o := range []events.Outcome{
		{TransportError: "dial tcp 10.0.0.7:443: connect: connection refused"},
		{Status: 502},
		{Status: 200, StopReason: "weird_stop"},
		{Status: 401, Body: "invalid key sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"},
	} {
		s := Signature(&o)
		if s == "" || strings.Contains(s, "AbCdEfGh") {
			t.Errorf("signature %q", s)
		}
	}
	if s := Signature(&events.Outcome{TransportError: "dial tcp 10.0.0.7:443: connect: connection refused"}); s != "no response | dial tcp N: connect: connection refused" {
		t.Errorf("transport signature %q", s)
	}
}

// TestExplainerGroupsWeak: only weak classifications are grouped, largest
// group first, with the providers and an example.
func TestExplainerGroupsWeak(t *testing.T) {
	t.Parallel()
	outs := []events.Outcome{
		{ID: "1", Provider: "gw-a", Status: 400, Body: `{"error":{"message":"Widget 7 is frobnicated"}}`},
		{ID: "2", Provider: "gw-b", Status: 400, Body: `{"error":{"message":"Widget 12 is frobnicated"}}`},
		{ID: "3", Provider: "gw-a", Status: 418, Body: "teapot"},
		{ID: "4", Provider: "openai", Status: 429, Body: `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`},
		{ID: "5", Provider: "x", Status: 200, Body: "???", StopReason: "odd"},
	}
	var e Explainer
	for i := range outs {
		outs[i].Agent = "a"
		e.Add(&outs[i], Classify(&outs[i]))
	}
	if e.Total != 5 || e.Weak != 4 {
		t.Fatalf("total %d weak %d, want 5 and 4", e.Total, e.Weak)
	}
	g := e.Groups()
	if len(g) != 3 {
		t.Fatalf("%d groups, want 3: %+v", len(g), g)
	}
	if g[0].Count != 2 || g[0].Example != "1" || strings.Join(g[0].Providers, ",") != "gw-a,gw-b" || g[0].Rules["status.4xx"] != 2 {
		t.Fatalf("first group %+v", g[0])
	}
	if !strings.Contains(g[0].Signature, "widget N is frobnicated") {
		t.Fatalf("first group signature %q", g[0].Signature)
	}
}

// TestWeakRules: what counts as weakly explained.
func TestWeakRules(t *testing.T) {
	t.Parallel()
	for rule, weak := range map[string]bool{
		RuleNone: true, "status.4xx": true, "status.5xx": true, "upstream.rate_limit": true, "transport.other": true,
		"gateway.empty_4xx": true, "gateway.html_4xx": true,
		"overflow.text": false, "transport.connection": false, "openai.insufficient_quota": false, RuleOK: false,
	} {
		if got := Weak(events.Classification{Rule: rule}); got != weak {
			t.Errorf("Weak(%s) = %v, want %v", rule, got, weak)
		}
	}
}
