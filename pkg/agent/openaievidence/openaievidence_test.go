package openaievidence_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/failbus/failbus/pkg/agent/openaievidence"
)

// The SDK's error for a 429 reads back as the API sent it: status, body,
// retry-after, code.
func TestDescribeAnAPIError(t *testing.T) {
	const body = `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey("k"), option.WithMaxRetries(0))
	_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	ev, ok := openaievidence.Describe(err)
	if !ok || ev.Status != 429 || ev.Headers["retry-after"] != "7" || ev.UpstreamCode != "rate_limit_exceeded" || !strings.Contains(ev.Body, "Rate limit reached") {
		t.Fatalf("evidence %+v (%v) of %v", ev, ok, err)
	}
	if _, ok := openaievidence.Describe(context.Canceled); ok {
		t.Error("a non-API error described as one")
	}
}
