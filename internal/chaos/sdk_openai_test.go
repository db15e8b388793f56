package chaos_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/failbus/failbus/internal/chaos"
)

// oaResult is what openai-go reported for one call (or the last of a few).
type oaResult struct {
	text, finish string
	promptTokens int64
	deltas       int
	err          error
	first        error // the first call's error, in rows of two calls
}

func oaClient(srv *chaos.Server, attempts *atomic.Int32, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithBaseURL(srv.OpenAIBaseURL("")),
		option.WithAPIKey("sk-a"),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			attempts.Add(1)
			return next(r)
		}),
	}, opts...)...)
}

func oaParams(prompt string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: "gpt-chaos", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
}

func oaChat(ctx context.Context, c openai.Client, prompt string) oaResult {
	res, err := c.Chat.Completions.New(ctx, oaParams(prompt))
	if err != nil {
		return oaResult{err: err}
	}
	return oaResult{text: res.Choices[0].Message.Content, finish: res.Choices[0].FinishReason, promptTokens: res.Usage.PromptTokens}
}

// oaStream streams a call; after is called with the count of deltas after
// each (nil: not).
func oaStream(ctx context.Context, c openai.Client, prompt string, after func(deltas int)) oaResult {
	p := oaParams(prompt)
	p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(ctx, p)
	defer s.Close()
	var acc openai.ChatCompletionAccumulator
	var r oaResult
	for s.Next() {
		chunk := s.Current()
		acc.AddChunk(chunk)
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
			r.deltas++
			if after != nil {
				after(r.deltas)
			}
		}
	}
	r.err = s.Err()
	if len(acc.Choices) > 0 {
		r.text, r.finish = acc.Choices[0].Message.Content, acc.Choices[0].FinishReason
	}
	r.promptTokens = acc.Usage.PromptTokens
	return r
}

// oaAPIError is err as openai-go's API error, or a test failure.
func oaAPIError(t *testing.T, err error, status int) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T); want an *openai.Error", err, err)
	}
	if e.StatusCode != status {
		t.Errorf("status %d; want %d", e.StatusCode, status)
	}
	return e
}

func wantCalls(t *testing.T, log chaos.Log, attempts int, retryNumbers ...int) {
	t.Helper()
	if got := retries(log); !slices.Equal(got, retryNumbers) {
		t.Errorf("the server got calls with SDK retry numbers %v; want %v", got, retryNumbers)
	}
	if attempts != len(retryNumbers) {
		t.Errorf("the SDK made %d attempts; the server got %d", attempts, len(retryNumbers))
	}
}

// fastBackoff keeps openai-go's retry count and shortens its backoff
// (WithMaxRetryDelay caps it), for rows about how often, not how long.
var fastBackoff = option.WithMaxRetryDelay(time.Millisecond)

// What openai-go, as it comes, does against each fault of the chaos
// provider.
func TestOpenAISDKAgainstEachFault(t *testing.T) {
	t.Parallel()
	runSDKRows(t, []sdkRow[oaResult]{
		{
			name: "a healthy call is answered once", timeline: "",
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if r.err != nil || r.text != chaos.DefaultAnswerText || r.finish != "stop" || r.promptTokens != int64(log[0].Tokens) {
					t.Errorf("got %+v; want the answer text, stop, %d prompt tokens", r, log[0].Tokens)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "a healthy stream ends with [DONE] and its usage", timeline: "",
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaStream(ctx, oaClient(srv, n), "hello", nil)
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if r.err != nil || r.text != chaos.DefaultAnswerText || r.finish != "stop" || r.deltas != chaos.DefaultChunks || r.promptTokens != int64(log[0].Tokens) {
					t.Errorf("got %+v; want the answer in %d deltas, stop, usage", r, chaos.DefaultChunks)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "503 is retried twice with the default backoff", timeline: always503,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if e := oaAPIError(t, r.err, 503); e.Type != "server_error" {
					t.Errorf("error type %q", e.Type)
				}
				wantCalls(t, log, attempts, 0, 1, 2)
				t.Logf("openai-go's default backoff between the attempts: %v", gaps(log))
			},
		},
		{
			name: "overloaded is OpenAI's 503, retried twice", timeline: alwaysOverloaded,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n, fastBackoff), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if e := oaAPIError(t, r.err, 503); !strings.Contains(e.Message, "overloaded") {
					t.Errorf("message %q", e.Message)
				}
				wantCalls(t, log, attempts, 0, 1, 2)
			},
		},
		{
			name: "a refused port is retried twice, unseen by the server", timeline: alwaysRefused,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				waitRefusing(srv)
				return oaChat(ctx, oaClient(srv, n, fastBackoff), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if !errors.Is(r.err, syscall.ECONNREFUSED) {
					t.Errorf("error %v; want connection refused", r.err)
				}
				if attempts != 3 || len(log) != 0 {
					t.Errorf("%d attempts, %d seen by the server; want 3 and 0", attempts, len(log))
				}
			},
		},
		{
			name: "a reset connection is retried twice, each counted", timeline: alwaysReset,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n, fastBackoff), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if !errors.Is(r.err, syscall.ECONNRESET) && !errors.Is(r.err, io.EOF) {
					t.Errorf("error %v; want a connection reset", r.err)
				}
				wantCalls(t, log, attempts, 0, 1, 2)
				if len(log.Where(func(r chaos.Request) bool { return r.Refused })) != 3 {
					t.Errorf("log %+v: want 3 refused", log)
				}
			},
		},
		{
			name: "429 without retry-after is retried twice", timeline: always429,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n, fastBackoff), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if e := oaAPIError(t, r.err, 429); e.Code != "rate_limit_exceeded" {
					t.Errorf("code %q", e.Code)
				}
				wantCalls(t, log, attempts, 0, 1, 2)
			},
		},
		{
			name: "retry-after-ms is honoured", timeline: always429AfterMs,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n, option.WithMaxRetries(1)), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				oaAPIError(t, r.err, 429)
				wantCalls(t, log, attempts, 0, 1)
				if g := gaps(log); len(g) != 1 || g[0] < 600*time.Millisecond {
					t.Errorf("retried after %v; want at least the 600ms of retry-after-ms", g)
				}
			},
		},
		{
			name: "retry-after in seconds is honoured", timeline: always429After1s,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n, option.WithMaxRetries(1)), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				oaAPIError(t, r.err, 429)
				wantCalls(t, log, attempts, 0, 1)
				if g := gaps(log); len(g) != 1 || g[0] < time.Second {
					t.Errorf("retried after %v; want at least the 1s of retry-after", g)
				}
			},
		},
		{
			name: "retry-after above two minutes is not retried at all", timeline: always429After3m,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				oaAPIError(t, r.err, 429)
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "insufficient_quota is a 429 and retried twice", timeline: quotaAfterOne,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				c := oaClient(srv, n, fastBackoff)
				first := oaChat(ctx, c, "hello")
				r := oaChat(ctx, c, "hello")
				r.first = first.err
				return r
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if r.first != nil {
					t.Errorf("the first call: %v", r.first)
				}
				if e := oaAPIError(t, r.err, 429); e.Code != "insufficient_quota" || e.Type != "insufficient_quota" {
					t.Errorf("code %q type %q", e.Code, e.Type)
				}
				wantCalls(t, log, attempts, 0, 0, 1, 2)
			},
		},
		{
			name: "the gateway's empty 400 is not retried", timeline: alwaysEmpty400,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if e := oaAPIError(t, r.err, 400); e.Message != "" || e.Code != "" {
					t.Errorf("an empty 400 reported as message %q code %q", e.Message, e.Code)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "refused content ends with finish_reason content_filter", timeline: refuseMarked,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				c := oaClient(srv, n)
				plain := oaChat(ctx, c, "tell me about [[no]] please")
				streamed := oaStream(ctx, c, "tell me about [[no]] please", nil)
				if plain.finish != streamed.finish || plain.text != streamed.text {
					streamed.err = errors.Join(streamed.err, errors.New("plain and streamed refusals differ: "+plain.finish+" "+streamed.finish))
				}
				return streamed
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if r.err != nil || r.finish != "content_filter" || r.text != "" {
					t.Errorf("got %+v; want no text and finish_reason content_filter", r)
				}
				wantCalls(t, log, attempts, 0, 0)
			},
		},
		{
			name: "refused content as OpenAI's invalid_prompt 400 is not retried", timeline: refuseMarkedError,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n), "[[no]]")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if e := oaAPIError(t, r.err, 400); e.Code != "invalid_prompt" {
					t.Errorf("code %q", e.Code)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "context overflow is a 400 context_length_exceeded, not retried", timeline: overflowAbove100,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n), strings.Repeat("long ", 200))
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if e := oaAPIError(t, r.err, 400); e.Code != "context_length_exceeded" || e.Param != "messages" {
					t.Errorf("code %q param %q", e.Code, e.Param)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "its own request timeout is not retried", timeline: slowHeaders,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaChat(ctx, oaClient(srv, n, option.WithRequestTimeout(500*time.Millisecond)), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if !errors.Is(r.err, context.DeadlineExceeded) {
					t.Errorf("error %v; want the deadline", r.err)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "a response header timeout of the transport is retried twice", timeline: slowHeaders,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				// The default client's header timeout is 10 minutes; this
				// is the same path, shorter.
				hc := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 200 * time.Millisecond}}
				return oaChat(ctx, oaClient(srv, n, option.WithHTTPClient(hc), fastBackoff), "hello")
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if r.err == nil || !strings.Contains(r.err.Error(), "timeout awaiting response headers") {
					t.Errorf("error %v; want the header timeout", r.err)
				}
				wantCalls(t, log, attempts, 0, 1, 2)
			},
		},
		{
			name: "a stalled stream hangs until the caller gives up, not retried", timeline: stallAfterTwo,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				return oaStream(ctx, oaClient(srv, n), "hello", giveUpAfter(2, cancel))
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				if !errors.Is(r.err, context.Canceled) || r.deltas != 2 {
					t.Errorf("got %+v; want 2 deltas, then the caller giving up", r)
				}
				wantCalls(t, log, attempts, 0)
				if !log[0].Aborted || log[0].Chunks != 2 {
					t.Errorf("logged %+v; want aborted after 2 deltas", log[0])
				}
			},
		},
		{
			name: "an error mid-stream ends the stream, not retried", timeline: breakAfterTwo,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) oaResult {
				return oaStream(ctx, oaClient(srv, n), "hello", nil)
			},
			check: func(t *testing.T, r oaResult, attempts int, log chaos.Log) {
				var se *ssestream.StreamError
				if !errors.As(r.err, &se) || !strings.Contains(se.Message, "server_error") || r.deltas != 2 {
					t.Errorf("got %+v; want 2 deltas, then a StreamError with server_error", r)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
	})
}

// waitRefusing waits (a short while at most) until the server's port
// refuses: a refuse window open from the start closes it just after Start.
func waitRefusing(srv *chaos.Server) {
	for range 2000 {
		if ok, refused := dialable(srv); !ok && refused {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
