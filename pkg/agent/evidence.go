package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/failbus/failbus/internal/httpheader"
	"github.com/failbus/failbus/pkg/events"
)

// Evidence is what happened on one attempt of an LLM call, as the bus
// wants it: the raw status, body, headers and transport error, not an
// interpretation (the classifier interprets). Call builds the attempt's
// Outcome from it.
type Evidence struct {
	// OK is true for a call that answered.
	OK bool
	// Status is the HTTP status; 0 when no response arrived.
	Status int
	// Body is the response body as received (an error body, or the part
	// of a stream that carried the error).
	Body string
	// Headers are the response headers with lower-case names
	// (retry-after, retry-after-ms, x-should-retry, …).
	Headers map[string]string
	// TransportError is the error text when no response arrived or the
	// stream broke.
	TransportError string
	// UpstreamCode is a code another library assigned (a hint).
	UpstreamCode string
	// StopReason is why a 200 did not answer (refusal, content_filter).
	StopReason string
	// RefusalScope says what a refusal was of: increment or history.
	RefusalScope string
	// RequestTokens, when not 0, replaces Request.RequestTokens for this
	// attempt (the SDK counted them).
	RequestTokens int
}

// Describer turns an error an SDK returned into Evidence; ok is false for
// an error it does not know. The adapters (net/http here, openai-go and
// anthropic-sdk-go in their own packages) are Describers.
type Describer func(err error) (ev Evidence, ok bool)

// Evidencer is an error that carries its own Evidence (HTTPError does).
type Evidencer interface {
	FailbusEvidence() Evidence
}

// HTTPError is a non-2xx answer of a plain net/http call, as Call wants
// it: return HTTPErrorFrom(resp) from the call function.
type HTTPError struct {
	Status  int
	Body    string
	Headers map[string]string
}

// Error implements error.
func (e *HTTPError) Error() string {
	return "HTTP " + http.StatusText(e.Status) + ": " + truncateText(e.Body, 200)
}

// FailbusEvidence implements Evidencer.
func (e *HTTPError) FailbusEvidence() Evidence {
	return Evidence{Status: e.Status, Body: e.Body, Headers: e.Headers}
}

// maxBody bounds the body an adapter keeps of an error answer.
const maxBody = 64 << 10

// HTTPErrorFrom reads a non-2xx response (its body up to 64 KiB, then
// closed) into an *HTTPError; a 2xx response is nil (the caller reads it).
func HTTPErrorFrom(resp *http.Response) error {
	if resp == nil || resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	_ = resp.Body.Close()
	return &HTTPError{Status: resp.StatusCode, Body: string(body), Headers: httpheader.Map(resp.Header)}
}

// describe is the Evidence of err: a Describer's, an Evidencer's, or the
// error's text as a transport error (a timeout named as one).
func describe(err error, d Describer) Evidence {
	if err == nil {
		return Evidence{OK: true, Status: http.StatusOK}
	}
	if d != nil {
		if ev, ok := d(err); ok {
			return ev
		}
	}
	var e Evidencer
	if errors.As(err, &e) {
		return e.FailbusEvidence()
	}
	text := err.Error()
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		if !strings.Contains(strings.ToLower(text), "timeout") {
			text = "timeout: " + text
		}
	}
	return Evidence{TransportError: text}
}

// outcome is the Outcome of an attempt with ev at target.
func (r *Request) outcome(a *Agent, id string, t Target, ev Evidence) *events.Outcome {
	o := &events.Outcome{
		ID: id, Agent: a.name, Provider: t.Provider, Model: t.Model, Profile: t.Profile,
		Session: r.Session, Segment: r.Segment, Turn: r.Turn, Step: r.Step,
		OK: ev.OK, Status: ev.Status, Body: ev.Body, Headers: ev.Headers, TransportError: ev.TransportError,
		UpstreamCode: ev.UpstreamCode, StopReason: ev.StopReason, RefusalScope: ev.RefusalScope,
		RequestTokens: r.RequestTokens, ContextWindow: r.ContextWindow, MaxOutputTokens: r.MaxOutputTokens,
		Origin: r.Origin,
	}
	if ev.RequestTokens > 0 {
		o.RequestTokens = ev.RequestTokens
	}
	return o
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
