package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/redact"
)

// userAgent is sent by every HTTP sink, so receivers can tell failbus apart
// in their logs.
const userAgent = "failbus-notifier/1"

// defaultHTTPClient has no overall timeout: every Send carries a context
// deadline instead (the notifier's send timeout), which also covers reading the
// answer.
var defaultHTTPClient = &http.Client{}

// httpRequest is one HTTP call a sink makes.
type httpRequest struct {
	sink    string
	client  *http.Client
	method  string
	url     string
	header  http.Header
	body    []byte
	success func(status int) bool // nil: any 2xx
}

// do sends r and turns anything but success into a *SinkError with the
// receiver's answer. 408, 425, 429 and 5xx are temporary (they change with
// time); every other status is permanent (the request itself was refused).
// A transport error is temporary.
func (r httpRequest) do(ctx context.Context) error {
	method := r.method
	if method == "" {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(ctx, method, r.url, bytes.NewReader(r.body))
	if err != nil {
		// A URL that does not parse is a configuration error.
		return &SinkError{Sink: r.sink, Answer: clip(redact.String(err.Error())), Permanent: true}
	}
	for k, vs := range r.header {
		req.Header[k] = vs
	}
	req.Header.Set("User-Agent", userAgent)
	client := r.client
	if client == nil {
		client = defaultHTTPClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return &SinkError{Sink: r.sink, Answer: clip(redact.String(transportText(ctx, err)))}
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4*maxAnswer))
	// Drain a little more so the connection can be reused.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	ok := r.success
	if ok == nil {
		ok = func(s int) bool { return s >= 200 && s < 300 }
	}
	if ok(resp.StatusCode) {
		return nil
	}
	text := strings.TrimSpace(string(answer))
	if text == "" {
		text = resp.Status
	}
	return &SinkError{
		Sink:       r.sink,
		Status:     resp.StatusCode,
		Answer:     clip(redact.String(text)),
		Permanent:  !temporaryStatus(resp.StatusCode),
		RetryAfter: retryAfter(resp.Header.Get("Retry-After"), time.Now()),
	}
}

// transportText describes a failed round trip; a context that ended says so
// plainly instead of the client's long URL-laden message.
func transportText(ctx context.Context, err error) string {
	if ctx.Err() != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "no answer before the send timeout: " + err.Error()
		}
		return "send cancelled: " + err.Error()
	}
	return err.Error()
}

// temporaryStatus reports whether an HTTP status says "try again later".
func temporaryStatus(status int) bool {
	switch {
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return true
	case status >= 500:
		return true
	}
	return false
}

// retryAfter parses a Retry-After header: delay seconds or an HTTP date. 0
// when absent or unusable.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n <= 0 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// requireURL checks that a sink's URL is an absolute http(s) URL, so a typo
// fails at start-up instead of at the first notification.
func requireURL(kind, name, raw string) error {
	if raw == "" {
		return fmt.Errorf("%s sink %q: url is required", kind, name)
	}
	req, err := http.NewRequest(http.MethodPost, raw, nil)
	if err != nil {
		return fmt.Errorf("%s sink %q: url: %w", kind, name, err)
	}
	if s := req.URL.Scheme; s != "http" && s != "https" {
		return fmt.Errorf("%s sink %q: url %q: scheme must be http or https", kind, name, redact.String(raw))
	}
	return nil
}
