package chaos_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/chaos"
)

// dialable reports whether the server's port accepts a TCP connection, and
// whether a failure was a refusal.
func dialable(srv *chaos.Server) (ok, refused bool) {
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL(), "http://"))
	if err == nil {
		_ = c.Close()
		return true, false
	}
	return false, errors.Is(err, syscall.ECONNREFUSED)
}

// A refuse window closes the port: a new connection is refused by the
// kernel, one pooled before the window does not get through, and the
// same port listens again when the window closes.
func TestRefuseWindowClosesThePortAndOpensItAgain(t *testing.T) {
	t.Parallel()
	clock := chaos.NewManualClock(epoch)
	srv := start(t, "faults:\n  - {name: down, kind: refuse, from: 10s, to: 20s}\n", chaos.Options{Clock: clock})
	client := &http.Client{Transport: &http.Transport{}}
	url := srv.OpenAIBaseURL("") + "chat/completions"
	if r, err := post(client, url, "sk-a", chat("m", "before")); err != nil || r.status != http.StatusOK {
		t.Fatalf("before the window: %v, %v", r.status, err)
	}

	clock.Advance(10 * time.Second)
	waitFor(t, "the port to refuse connections", func() bool { ok, refused := dialable(srv); return !ok && refused })
	if r, err := post(client, url, "sk-a", chat("m", "during")); err == nil {
		t.Errorf("a request on a connection pooled before the window got %d", r.status)
	}

	clock.Advance(10 * time.Second)
	waitFor(t, "the port to listen again", func() bool { ok, _ := dialable(srv); return ok })
	if r, err := post(client, url, "sk-a", chat("m", "after")); err != nil || r.status != http.StatusOK {
		t.Fatalf("after the window: %v, %v", r.status, err)
	}
	for _, r := range srv.Requests().Between(10*time.Second, 20*time.Second) {
		if r.Status != 0 || !r.Refused || r.Window != "down" {
			t.Errorf("a request during the window was answered: %+v", r)
		}
	}
	if n := len(srv.Requests().Where(func(r chaos.Request) bool { return r.Status == http.StatusOK })); n != 2 {
		t.Errorf("%d healthy answers; want 2 (before and after)", n)
	}
}

// A reset window reads the request (so it is counted) and resets the
// connection; requests it does not catch are answered.
func TestResetWindowResetsAfterReading(t *testing.T) {
	t.Parallel()
	srv := start(t, "faults:\n  - {name: down, kind: reset, key: sk-b}\n", chaos.Options{})
	client := &http.Client{Transport: &http.Transport{}}
	url := srv.OpenAIBaseURL("") + "chat/completions"
	if r, err := post(client, url, "sk-a", chat("m", "hi")); err != nil || r.status != http.StatusOK {
		t.Fatalf("key sk-a: %v, %v", r.status, err)
	}
	_, err := post(client, url, "sk-b", chat("m", "hi"))
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Errorf("key sk-b: %v; want a connection reset", err)
	}
	log := srv.Requests()
	if len(log) != 2 {
		t.Fatalf("%d requests logged; want 2", len(log))
	}
	if r := log[1]; r.Key != "sk-b" || !r.Refused || r.Status != 0 || r.Fault != chaos.KindReset || r.Window != "down" || !r.Done {
		t.Errorf("the reset request is logged as %+v", r)
	}
}

// What the server logs is what the provider saw, the same in Requests,
// GET /_chaos/requests and the JSON Lines log.
func TestTheLogRecordsWhatTheProviderSaw(t *testing.T) {
	t.Parallel()
	var lines syncBuffer
	srv := start(t, "", chaos.Options{RequestLog: &lines})
	client := &http.Client{Transport: &http.Transport{}}

	req, _ := http.NewRequest(http.MethodPost, srv.OpenAIBaseURL("")+"chat/completions", strings.NewReader(`{"model":"gpt-x","messages":[{"role":"user","content":"hello world"}]}`))
	req.Header.Set("Authorization", "Bearer sk-a")
	req.Header.Set("X-Stainless-Retry-Count", "1")
	res, err := client.Do(req)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("openai: %v %v", res, err)
	}
	_ = res.Body.Close()
	body := message("claude-x", strings.Repeat("x", 4000))
	body["system"], body["stream"] = "be brief", true
	if r, err := post(client, srv.AnthropicBaseURL("acme")+"/v1/messages", "sk-b", body); err != nil || r.status != http.StatusOK {
		t.Fatalf("anthropic: %v %v", r.status, err)
	}
	if r, err := post(client, srv.OpenAIBaseURL("")+"chat/completions", "sk-c", chat("gpt-x", "hello world")); err != nil || r.status != http.StatusOK {
		t.Fatalf("openai again: %v %v", r.status, err)
	}

	log := srv.Requests()
	if len(log) != 3 {
		t.Fatalf("%d requests; want 3", len(log))
	}
	want := []struct {
		provider string
		api      chaos.API
		key      string
		model    string
		stream   bool
		retry    int
	}{
		{"openai", chaos.OpenAI, "sk-a", "gpt-x", false, 1},
		{"acme", chaos.Anthropic, "sk-b", "claude-x", true, -1},
		{"openai", chaos.OpenAI, "sk-c", "gpt-x", false, -1},
	}
	for i, w := range want {
		r := log[i]
		if r.Seq != i+1 || r.Provider != w.provider || r.API != w.api || r.Key != w.key || r.Model != w.model || r.Stream != w.stream ||
			r.SDKRetry != w.retry || r.Status != http.StatusOK || !r.Done || r.Fault != "" {
			t.Errorf("request %d logged as %+v; want %+v", i+1, r, w)
		}
	}
	if log[0].Fingerprint != log[2].Fingerprint || log[0].Fingerprint == log[1].Fingerprint {
		t.Errorf("fingerprints %q %q %q: the same prompt must have the same, another prompt another", log[0].Fingerprint, log[1].Fingerprint, log[2].Fingerprint)
	}
	if tok := log[1].Tokens; tok < 1000 || tok > 1010 {
		t.Errorf("a 4000-byte prompt is estimated at %d tokens; want about 1000", tok)
	}
	if log[1].Chunks != chaos.DefaultChunks {
		t.Errorf("the stream carried %d deltas; want %d", log[1].Chunks, chaos.DefaultChunks)
	}

	var served chaos.Log
	if err := getJSON(client, srv.URL()+chaos.RequestsPath, &served); err != nil || len(served) != 3 || served[1].Key != "sk-b" || served[2].Seq != 3 {
		t.Errorf("GET %s: %v, %+v", chaos.RequestsPath, err, served)
	}
	if err := getJSON(client, srv.URL()+chaos.RequestsPath+"?since=2", &served); err != nil || len(served) != 1 || served[0].Seq != 3 {
		t.Errorf("GET %s?since=2: %v, %+v", chaos.RequestsPath, err, served)
	}

	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	var fromFile chaos.Log
	sc := bufio.NewScanner(strings.NewReader(lines.String()))
	for sc.Scan() {
		var r chaos.Request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		fromFile = append(fromFile, r)
	}
	if len(fromFile) != 3 {
		t.Fatalf("%d log lines; want 3", len(fromFile))
	}
	for _, r := range fromFile {
		if !r.Done || r.Key != log[r.Seq-1].Key || r.Fingerprint != log[r.Seq-1].Fingerprint || !r.At.Equal(log[r.Seq-1].At) {
			t.Errorf("log line %+v differs from Requests: %+v", r, log[r.Seq-1])
		}
	}
}

func getJSON(client *http.Client, url string, into any) error {
	res, err := client.Get(url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	return json.NewDecoder(res.Body).Decode(into)
}

// Windows open and close on the server's clock, under the scale; the
// retry-after a window sends is scaled too.
func TestWindowsFollowTheScaledClock(t *testing.T) {
	t.Parallel()
	clock := chaos.NewManualClock(epoch)
	srv := start(t, "faults:\n  - {name: busy, kind: unavailable, from: 10s, to: 20s, retry_after: 5s, retry_after_ms: true}\n",
		chaos.Options{Clock: clock, Scale: 0.1})
	client := &http.Client{Transport: &http.Transport{}}
	url := srv.OpenAIBaseURL("") + "chat/completions"
	status := func() reply {
		t.Helper()
		r, err := post(client, url, "sk-a", chat("m", "hi"))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	clock.Advance(999 * time.Millisecond) // 9.99s of the timeline
	if r := status(); r.status != http.StatusOK {
		t.Errorf("before the window: %d", r.status)
	}
	clock.Advance(time.Millisecond)
	if got := srv.Elapsed(); got != 10*time.Second {
		t.Errorf("Elapsed %v; want 10s", got)
	}
	r := status()
	if r.status != http.StatusServiceUnavailable || r.header.Get("retry-after") != "0.5" || r.header.Get("retry-after-ms") != "500" {
		t.Errorf("in the window: %d, retry-after %q, retry-after-ms %q; want 503, 0.5, 500", r.status, r.header.Get("retry-after"), r.header.Get("retry-after-ms"))
	}
	clock.Advance(time.Second)
	if r := status(); r.status != http.StatusOK {
		t.Errorf("after the window: %d", r.status)
	}
	log := srv.Requests()
	if log[1].Offset != 10*time.Second || log[1].Window != "busy" || log[2].Offset != 20*time.Second || log[2].Window != "" {
		t.Errorf("offsets and windows: %+v", log)
	}
}

// A quota window caps each key on its own: the key past its cap gets the
// quota error of the API, until the window ends; other keys go on.
func TestQuotaCapsEachKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, timeline, url, prompt string
		api                         chaos.API
		status                      int
		errType                     string
	}{
		{"openai, after 2 requests", "faults:\n  - {name: cap, kind: quota, after_requests: 2}\n", "chat/completions", "hi", chaos.OpenAI, http.StatusTooManyRequests, "insufficient_quota"},
		{"anthropic, after 2 requests", "faults:\n  - {name: cap, kind: quota, after_requests: 2}\n", "/v1/messages", "hi", chaos.Anthropic, http.StatusPaymentRequired, "billing_error"},
		// 40 bytes of prompt are about 11 tokens, the answer some more:
		// two answers use more than 30.
		{"openai, after 30 tokens", "faults:\n  - {name: cap, kind: quota, after_tokens: 30}\n", "chat/completions", strings.Repeat("y", 40), chaos.OpenAI, http.StatusTooManyRequests, "insufficient_quota"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := start(t, tt.timeline, chaos.Options{})
			client := &http.Client{Transport: &http.Transport{}}
			send := func(key string) reply {
				t.Helper()
				var r reply
				var err error
				if tt.api == chaos.OpenAI {
					r, err = post(client, srv.OpenAIBaseURL("")+tt.url, key, chat("m", tt.prompt))
				} else {
					r, err = post(client, srv.AnthropicBaseURL("")+tt.url, key, message("m", tt.prompt))
				}
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			for i, key := range []string{"sk-a", "sk-a", "sk-a", "sk-b", "sk-a"} {
				r := send(key)
				capped := key == "sk-a" && i >= 2
				if !capped {
					if r.status != http.StatusOK {
						t.Errorf("call %d (%s): %d; want 200", i+1, key, r.status)
					}
					continue
				}
				if r.status != tt.status || !bytes.Contains(r.body, []byte(`"`+tt.errType+`"`)) {
					t.Errorf("call %d (%s): %d %s; want %d with %s", i+1, key, r.status, r.body, tt.status, tt.errType)
				}
			}
		})
	}
}

// Probability draws follow the seed: the same seed gives the same answers
// to the same requests in the same order.
func TestProbabilityFollowsTheSeed(t *testing.T) {
	t.Parallel()
	pattern := func(seed uint64) string {
		srv := start(t, "seed: 1\nfaults:\n  - {name: flaky, kind: unavailable, probability: 0.5}\n", chaos.Options{Seed: seed})
		client := &http.Client{Transport: &http.Transport{}}
		var b strings.Builder
		for range 32 {
			r, err := post(client, srv.OpenAIBaseURL("")+"chat/completions", "sk-a", chat("m", "hi"))
			if err != nil {
				t.Fatal(err)
			}
			if r.status == http.StatusOK {
				b.WriteByte('.')
			} else {
				b.WriteByte('x')
			}
		}
		return b.String()
	}
	a, again, other := pattern(3), pattern(3), pattern(4)
	if a != again {
		t.Errorf("seed 3 gave %s, then %s", a, again)
	}
	if a == other {
		t.Errorf("seeds 3 and 4 both gave %s", a)
	}
	if !strings.Contains(a, ".") || !strings.Contains(a, "x") {
		t.Errorf("probability 0.5 gave %s", a)
	}
}

// A slow window waits on the server's clock: nothing comes back until
// the clock passes the delay; a stream stalls after its first deltas and
// goes on when the stall is over.
func TestSlowAnswersWaitOnTheClock(t *testing.T) {
	t.Parallel()
	clock := chaos.NewManualClock(epoch)
	srv := start(t, `faults:
  - {name: late, kind: slow, model: delayed, delay: 30s}
  - {name: stuck, kind: slow, model: stalled, stall: 1m, after_chunks: 2}
`, chaos.Options{Clock: clock})
	client := &http.Client{Transport: &http.Transport{}}
	url := srv.OpenAIBaseURL("") + "chat/completions"

	done := make(chan reply, 1)
	go func() {
		r, err := post(client, url, "sk-a", chat("delayed", "hi"))
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	waitFor(t, "the server to wait on the delay", func() bool { return clock.Waiting() == 1 })
	select {
	case r := <-done:
		t.Fatalf("answered %d before the delay passed", r.status)
	default:
	}
	clock.Advance(30 * time.Second)
	if r := <-done; r.status != http.StatusOK {
		t.Errorf("after the delay: %d", r.status)
	}

	body := chat("stalled", "hi")
	body["stream"] = true
	data, _ := json.Marshal(body)
	res, err := client.Post(url, "application/json", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	events := bufio.NewScanner(res.Body)
	deltas := 0
	for deltas < 2 && events.Scan() {
		if strings.Contains(events.Text(), `"content":"`) && !strings.Contains(events.Text(), `"content":""`) {
			deltas++
		}
	}
	waitFor(t, "the stream to stall", func() bool { return clock.Waiting() == 1 })
	clock.Advance(time.Minute)
	rest, _ := io.ReadAll(res.Body)
	if !bytes.Contains(rest, []byte("data: [DONE]")) {
		t.Errorf("after the stall the stream ended with %q; want data: [DONE]", rest)
	}
	if r := srv.Requests()[1]; r.Window != "stuck" || r.Chunks != chaos.DefaultChunks || r.Aborted {
		t.Errorf("the stalled stream is logged as %+v", r)
	}
}

// A client that gives up on a stalled stream is logged as aborted, after
// the deltas it got; Close ends the answers still waiting and logs them.
func TestAbandonedAndClosedAnswersAreLoggedAborted(t *testing.T) {
	t.Parallel()
	var lines syncBuffer
	srv := start(t, `faults:
  - {name: stuck, kind: slow, model: stalled, stall: 1h}
  - {name: late, kind: slow, model: delayed, delay: 1h}
`, chaos.Options{RequestLog: &lines})
	client := &http.Client{Transport: &http.Transport{}}
	url := srv.OpenAIBaseURL("") + "chat/completions"

	ctx, cancel := context.WithCancel(t.Context())
	body := chat("stalled", "hi")
	body["stream"] = true
	data, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() && !strings.Contains(sc.Text(), `"content":"D`) {
	}
	cancel()
	_ = res.Body.Close()
	waitFor(t, "the abandoned stream to be logged", func() bool { return srv.Requests()[0].Done })
	if r := srv.Requests()[0]; !r.Aborted || r.Chunks != 1 || r.Status != http.StatusOK {
		t.Errorf("the abandoned stream is logged as %+v; want aborted after 1 delta", r)
	}

	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := post(client, url, "sk-a", chat("delayed", "hi")); err == nil {
			t.Error("a request waiting on its delay was answered although the server closed")
		}
	})
	waitFor(t, "the second request to arrive", func() bool { return len(srv.Requests()) == 2 })
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if r := srv.Requests()[1]; !r.Done || !r.Aborted || r.Status != 0 {
		t.Errorf("the request Close cut short is logged as %+v", r)
	}
	if n := strings.Count(lines.String(), "\n"); n != 2 {
		t.Errorf("%d log lines after Close; want 2:\n%s", n, lines.String())
	}
}

// The gateway's empty 400 has no body and no content type, on both APIs.
func TestEmpty400HasNoBody(t *testing.T) {
	t.Parallel()
	srv := start(t, "faults:\n  - {name: gw, kind: empty_400}\n", chaos.Options{})
	client := &http.Client{Transport: &http.Transport{}}
	for _, url := range []string{srv.OpenAIBaseURL("") + "chat/completions", srv.AnthropicBaseURL("") + "/v1/messages"} {
		r, err := post(client, url, "sk-a", message("m", "hi"))
		if err != nil || r.status != http.StatusBadRequest || len(r.body) != 0 || r.header.Get("Content-Type") != "" {
			t.Errorf("%s: %d %q content-type %q, %v; want 400 with nothing", url, r.status, r.body, r.header.Get("Content-Type"), err)
		}
	}
}

// A body that is not a request is a 400 in the API's shape, logged with
// why; an unknown path is a 404.
func TestUnreadableRequests(t *testing.T) {
	t.Parallel()
	srv := start(t, "", chaos.Options{})
	res, err := http.Post(srv.AnthropicBaseURL("")+"/v1/messages", "application/json", strings.NewReader("{not json"))
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	_ = json.NewDecoder(res.Body).Decode(&e)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || e.Type != "error" || e.Error.Type != "invalid_request_error" {
		t.Errorf("bad JSON: %d %+v", res.StatusCode, e)
	}
	if r := srv.Requests()[0]; r.Status != http.StatusBadRequest || !strings.Contains(r.Error, "not a JSON request") {
		t.Errorf("bad JSON logged as %+v", r)
	}
	res, err = http.Post(srv.URL()+"/v2/nothing", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown path: %d", res.StatusCode)
	}
}

// syncBuffer is a bytes.Buffer for a writer and a reader on different
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
