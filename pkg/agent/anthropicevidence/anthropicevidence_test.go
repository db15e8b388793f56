package anthropicevidence_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/failbus/failbus/pkg/agent/anthropicevidence"
)

// The SDK's error for a 529 reads back as the API sent it: status, body,
// error type.
func TestDescribeAnAPIError(t *testing.T) {
	const body = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Should-Retry", "true")
		w.WriteHeader(529)
		_, _ = w.Write([]byte(body))
	}))
	defer srv.Close()
	c := anthropic.NewClient(option.WithBaseURL(srv.URL), option.WithAPIKey("k"), option.WithMaxRetries(0))
	_, err := c.Messages.New(context.Background(), anthropic.MessageNewParams{
		Model: "m", MaxTokens: 10, Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))},
	})
	ev, ok := anthropicevidence.Describe(err)
	if !ok || ev.Status != 529 || ev.UpstreamCode != "overloaded_error" || !strings.Contains(ev.Body, "Overloaded") || ev.Headers["x-should-retry"] != "true" {
		t.Fatalf("evidence %+v (%v) of %v", ev, ok, err)
	}
}
