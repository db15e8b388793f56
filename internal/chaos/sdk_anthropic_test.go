package chaos_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/failbus/failbus/internal/chaos"
)

// anResult is what anthropic-sdk-go reported for one call (or the last of
// a few).
type anResult struct {
	text        string
	stop        anthropic.StopReason
	blocks      int
	inputTokens int64
	deltas      int
	err         error
	first       error // the first call's error, in rows of two calls
}

func anClient(srv *chaos.Server, attempts *atomic.Int32, opts ...option.RequestOption) anthropic.Client {
	return anthropic.NewClient(append([]option.RequestOption{
		option.WithBaseURL(srv.AnthropicBaseURL("")),
		option.WithAPIKey("sk-ant-a"),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			attempts.Add(1)
			return next(r)
		}),
	}, opts...)...)
}

func anParams(prompt string) anthropic.MessageNewParams {
	return anthropic.MessageNewParams{Model: "claude-chaos", MaxTokens: 256,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(prompt))}}
}

func anResultOf(m *anthropic.Message) anResult {
	r := anResult{stop: m.StopReason, blocks: len(m.Content), inputTokens: m.Usage.InputTokens}
	for _, b := range m.Content {
		r.text += b.Text
	}
	return r
}

func anMessage(ctx context.Context, c anthropic.Client, prompt string, opts ...option.RequestOption) anResult {
	m, err := c.Messages.New(ctx, anParams(prompt), opts...)
	if err != nil {
		return anResult{err: err}
	}
	return anResultOf(m)
}

// anStream streams a call; after is called with the count of deltas after
// each (nil: not).
func anStream(ctx context.Context, c anthropic.Client, prompt string, after func(deltas int)) anResult {
	s := c.Messages.NewStreaming(ctx, anParams(prompt))
	defer s.Close()
	var m anthropic.Message
	deltas := 0
	var accErr error
	for s.Next() {
		ev := s.Current()
		if err := m.Accumulate(ev); err != nil {
			accErr = err
		}
		if ev.Type == "content_block_delta" {
			deltas++
			if after != nil {
				after(deltas)
			}
		}
	}
	r := anResultOf(&m)
	r.deltas, r.err = deltas, errors.Join(s.Err(), accErr)
	return r
}

// anAPIError is err as anthropic-sdk-go's API error, or a test failure.
func anAPIError(t *testing.T, err error, status int, typ string) *anthropic.Error {
	t.Helper()
	var e *anthropic.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T); want an *anthropic.Error", err, err)
	}
	if e.StatusCode != status || string(e.Type()) != typ {
		t.Errorf("status %d type %q; want %d %q", e.StatusCode, e.Type(), status, typ)
	}
	return e
}

// What anthropic-sdk-go, as it comes, does against each fault of the
// chaos provider. It has no option to shorten its backoff, so the rows
// about how often it retries wait it out (at once, see runSDKRows).
func TestAnthropicSDKAgainstEachFault(t *testing.T) {
	t.Parallel()
	runSDKRows(t, []sdkRow[anResult]{
		{
			name: "a healthy call is answered once", timeline: "",
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if r.err != nil || r.text != chaos.DefaultAnswerText || r.stop != anthropic.StopReasonEndTurn || r.inputTokens != int64(log[0].Tokens) {
					t.Errorf("got %+v; want the answer text, end_turn, %d input tokens", r, log[0].Tokens)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "a healthy stream is the full event sequence", timeline: "",
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anStream(ctx, anClient(srv, n), "hello", nil)
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if r.err != nil || r.text != chaos.DefaultAnswerText || r.stop != anthropic.StopReasonEndTurn || r.deltas != chaos.DefaultChunks || r.inputTokens != int64(log[0].Tokens) {
					t.Errorf("got %+v; want the answer in %d deltas, end_turn, usage", r, chaos.DefaultChunks)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "529 overloaded_error is retried twice with the default backoff", timeline: alwaysOverloaded,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				anAPIError(t, r.err, 529, "overloaded_error")
				wantCalls(t, log, attempts, 0, 1, 2)
				t.Logf("anthropic-sdk-go's default backoff between the attempts: %v", gaps(log))
			},
		},
		{
			name: "503 is retried twice", timeline: always503,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				anAPIError(t, r.err, 503, "api_error")
				wantCalls(t, log, attempts, 0, 1, 2)
			},
		},
		{
			name: "a refused port is retried twice, unseen by the server", timeline: alwaysRefused,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				waitRefusing(srv)
				return anMessage(ctx, anClient(srv, n), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
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
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if !errors.Is(r.err, syscall.ECONNRESET) && !errors.Is(r.err, io.EOF) {
					t.Errorf("error %v; want a connection reset", r.err)
				}
				wantCalls(t, log, attempts, 0, 1, 2)
			},
		},
		{
			name: "429 without retry-after is retried twice", timeline: always429,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				anAPIError(t, r.err, 429, "rate_limit_error")
				wantCalls(t, log, attempts, 0, 1, 2)
			},
		},
		{
			name: "retry-after-ms is honoured", timeline: always429AfterMs,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n, option.WithMaxRetries(1)), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				anAPIError(t, r.err, 429, "rate_limit_error")
				wantCalls(t, log, attempts, 0, 1)
				if g := gaps(log); len(g) != 1 || g[0] < 600*time.Millisecond {
					t.Errorf("retried after %v; want at least the 600ms of retry-after-ms", g)
				}
			},
		},
		{
			name: "retry-after in seconds is honoured", timeline: always429After1s,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n, option.WithMaxRetries(1)), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				anAPIError(t, r.err, 429, "rate_limit_error")
				wantCalls(t, log, attempts, 0, 1)
				if g := gaps(log); len(g) != 1 || g[0] < time.Second {
					t.Errorf("retried after %v; want at least the 1s of retry-after", g)
				}
			},
		},
		{
			name: "retry-after of three minutes is waited out, with no cap", timeline: always429After3m,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				ctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
				defer cancel()
				return anMessage(ctx, anClient(srv, n), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if !errors.Is(r.err, context.DeadlineExceeded) {
					t.Errorf("error %v; want the caller's deadline, reached while the SDK waits", r.err)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "402 billing_error is not retried", timeline: quotaAfterOne,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				c := anClient(srv, n)
				first := anMessage(ctx, c, "hello")
				r := anMessage(ctx, c, "hello")
				r.first = first.err
				return r
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if r.first != nil {
					t.Errorf("the first call: %v", r.first)
				}
				anAPIError(t, r.err, 402, "billing_error")
				wantCalls(t, log, attempts, 0, 0)
			},
		},
		{
			name: "the gateway's empty 400 is not retried", timeline: alwaysEmpty400,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if e := anAPIError(t, r.err, 400, ""); e.Message != "" {
					t.Errorf("an empty 400 reported with message %q", e.Message)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "refused content ends with stop_reason refusal", timeline: refuseMarked,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				c := anClient(srv, n)
				plain := anMessage(ctx, c, "tell me about [[no]] please")
				streamed := anStream(ctx, c, "tell me about [[no]] please", nil)
				if plain.stop != streamed.stop || plain.text != streamed.text {
					streamed.err = errors.Join(streamed.err, errors.New("plain and streamed refusals differ: "+string(plain.stop)+" "+string(streamed.stop)))
				}
				return streamed
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if r.err != nil || r.stop != anthropic.StopReasonRefusal || r.blocks != 0 {
					t.Errorf("got %+v; want no content and stop_reason refusal", r)
				}
				wantCalls(t, log, attempts, 0, 0)
			},
		},
		{
			name: "context overflow is a 400 prompt is too long, not retried", timeline: overflowAbove100,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n), strings.Repeat("long ", 200))
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if e := anAPIError(t, r.err, 400, "invalid_request_error"); !strings.HasPrefix(e.Message, "prompt is too long: ") {
					t.Errorf("message %q", e.Message)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
		{
			name: "its own request timeout is retried", timeline: slowHeaders,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anMessage(ctx, anClient(srv, n, option.WithMaxRetries(1)), "hello", option.WithRequestTimeout(500*time.Millisecond))
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if !errors.Is(r.err, context.DeadlineExceeded) {
					t.Errorf("error %v; want the deadline", r.err)
				}
				wantCalls(t, log, attempts, 0, 1)
			},
		},
		{
			name: "a response header timeout of the transport is retried", timeline: slowHeaders,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				// The default client's header timeout is 10 minutes; this
				// is the same path, shorter.
				hc := &http.Client{Transport: &http.Transport{ResponseHeaderTimeout: 200 * time.Millisecond}}
				return anMessage(ctx, anClient(srv, n, option.WithHTTPClient(hc), option.WithMaxRetries(1)), "hello")
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				if r.err == nil || !strings.Contains(r.err.Error(), "timeout awaiting response headers") {
					t.Errorf("error %v; want the header timeout", r.err)
				}
				wantCalls(t, log, attempts, 0, 1)
			},
		},
		{
			name: "a stalled stream hangs until the caller gives up, not retried", timeline: stallAfterTwo,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				ctx, cancel := context.WithCancel(ctx)
				defer cancel()
				return anStream(ctx, anClient(srv, n), "hello", giveUpAfter(2, cancel))
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
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
			name: "an error event mid-stream is an overloaded_error, not retried", timeline: breakAfterTwo,
			call: func(ctx context.Context, srv *chaos.Server, n *atomic.Int32) anResult {
				return anStream(ctx, anClient(srv, n), "hello", nil)
			},
			check: func(t *testing.T, r anResult, attempts int, log chaos.Log) {
				anAPIError(t, r.err, 200, "overloaded_error")
				if r.deltas != 2 {
					t.Errorf("%d deltas before the error; want 2", r.deltas)
				}
				wantCalls(t, log, attempts, 0)
			},
		},
	})
}
