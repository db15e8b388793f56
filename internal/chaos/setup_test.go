package chaos_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/chaos"
)

// epoch is where a test's manual clock starts.
var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// start runs a chaos provider on timeline (YAML) for the test and closes it
// at the end.
func start(t testing.TB, timeline string, opts chaos.Options) *chaos.Server {
	t.Helper()
	tl, err := chaos.ParseTimeline([]byte(timeline))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := chaos.New(tl, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// waitFor polls cond every 5ms until it holds, failing the test after 10s.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// reply is an answer read whole.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// post sends a JSON request with key as a bearer token (OpenAI) or
// x-api-key (a path ending in /messages) through client.
func post(client *http.Client, url, key string, body any) (reply, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return reply{}, err
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if bytes.HasSuffix([]byte(url), []byte("/messages")) {
		req.Header.Set("x-api-key", key)
	} else {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return reply{status: res.StatusCode, header: res.Header, body: b}, err
}

// chat is a small chat completions body.
func chat(model, prompt string) map[string]any {
	return map[string]any{"model": model, "messages": []any{map[string]any{"role": "user", "content": prompt}}}
}

// message is a small messages body.
func message(model, prompt string) map[string]any {
	return map[string]any{"model": model, "max_tokens": 64, "messages": []any{map[string]any{"role": "user", "content": prompt}}}
}
