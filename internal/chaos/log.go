package chaos

import (
	"sort"
	"time"
)

// API is the wire dialect a request spoke.
type API string

// The APIs the server speaks.
const (
	// OpenAI is the chat completions API (POST /v1/chat/completions).
	OpenAI API = "openai"
	// Anthropic is the messages API (POST /v1/messages).
	Anthropic API = "anthropic"
)

// Request is one request the server received, as the provider saw it: the
// drill counts calls from this side, not from the client's. JSON field
// names are those of the --log file and of GET /_chaos/requests.
type Request struct {
	// Seq is the arrival order, from 1.
	Seq int `json:"seq"`
	// At is when it arrived, on the server's clock.
	At time.Time `json:"at"`
	// Offset is when it arrived on the timeline (server clock since
	// start, divided by the scale): compare it with a window's From/To.
	Offset time.Duration `json:"offset_ns"`
	// Provider is the provider name of the path (/NAME/v1/...), or
	// "openai" / "anthropic" for the bare paths.
	Provider string `json:"provider"`
	// API is the dialect.
	API API `json:"api"`
	// Key is the API key as given (Authorization: Bearer, or x-api-key);
	// "" when none.
	Key string `json:"key"`
	// Model is the request's model.
	Model string `json:"model"`
	// Stream is true for a streamed request.
	Stream bool `json:"stream"`
	// Fingerprint identifies the prompt text (system and messages): the
	// same prompt re-sent has the same fingerprint.
	Fingerprint string `json:"fingerprint"`
	// Tokens estimates the prompt's tokens (its text's bytes / 4).
	Tokens int `json:"tokens"`
	// SDKRetry is the client's own retry number from the
	// X-Stainless-Retry-Count header the official SDKs send (0 for a
	// first attempt); -1 when the header is absent.
	SDKRetry int `json:"sdk_retry"`

	// Status is the HTTP status answered; 0 when the connection was
	// reset without an answer, or the server closed before answering.
	Status int `json:"status"`
	// Fault is the kind of the window that answered; "" for a healthy
	// answer (or a request the server could not read: Error says why).
	Fault Kind `json:"fault,omitempty"`
	// Window is that window's name.
	Window string `json:"window,omitempty"`
	// Refused is true when the connection was reset without an answer (a
	// reset window, or a request that reached a refused port on a
	// connection opened before the window).
	Refused bool `json:"refused,omitempty"`
	// Error is the error message answered, if any.
	Error string `json:"error,omitempty"`

	// Done is true once the answer ended (completed, or cut short:
	// Aborted). A request still being answered is not Done.
	Done bool `json:"done"`
	// Aborted is true when the answer was cut short: the client went
	// away (a timeout over a stall, say) or the server closed first.
	Aborted bool `json:"aborted,omitempty"`
	// Chunks is how many deltas a stream carried.
	Chunks int `json:"chunks,omitempty"`
	// Duration is how long the answer took on the server's clock.
	Duration time.Duration `json:"duration_ns"`
}

// Log is requests in arrival order, with the questions a drill asks of it.
type Log []Request

// Where returns the requests keep accepts.
func (l Log) Where(keep func(Request) bool) Log {
	var out Log
	for _, r := range l {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// Between returns the requests that arrived in [from, to) of the timeline:
// Between(w.From, w.To) is every call made while window w was open,
// caught by it or not; Between(w.To, w.To+time.Second) is the second
// after it closed.
func (l Log) Between(from, to time.Duration) Log {
	return l.Where(func(r Request) bool { return r.Offset >= from && r.Offset < to })
}

// Window returns the requests window name answered.
func (l Log) Window(name string) Log {
	return l.Where(func(r Request) bool { return r.Window == name })
}

// PerWindow counts the requests each window answered; healthy answers are
// counted under "".
func (l Log) PerWindow() map[string]int {
	out := map[string]int{}
	for _, r := range l {
		out[r.Window]++
	}
	return out
}

// Peak is the largest number of requests that arrived within span of one
// another, over arrivals in [from, to) of the timeline, and the offset
// where that busiest span starts: the burst against a provider after it
// came back is Peak(time.Second, w.To, w.To+time.Minute).
func (l Log) Peak(span, from, to time.Duration) (n int, at time.Duration) {
	offsets := make([]time.Duration, 0, len(l))
	for _, r := range l {
		if r.Offset >= from && r.Offset < to {
			offsets = append(offsets, r.Offset)
		}
	}
	sort.Slice(offsets, func(i, j int) bool { return offsets[i] < offsets[j] })
	j := 0
	for i, start := range offsets {
		for j < len(offsets) && offsets[j] < start+span {
			j++
		}
		if j-i > n {
			n, at = j-i, start
		}
	}
	return n, at
}
