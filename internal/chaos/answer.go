package chaos

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// answer is one request being answered.
type answer struct {
	s     *Server
	w     http.ResponseWriter
	r     *http.Request
	in    incoming
	seq   int
	at    time.Time // arrival, on the server's clock
	fault *Fault

	status  int
	errMsg  string
	chunks  int
	aborted bool
	refused bool
}

// run answers the request as its fault (or none) says, then completes its
// record.
func (a *answer) run() {
	defer a.s.finish(a)
	f := a.fault
	ctx := a.r.Context()
	switch {
	case a.in.bad != "":
		a.apiError(errBadRequest, a.in.bad, nil)
	case f == nil:
		if !a.s.sleep(ctx, a.at, a.s.tl.Answer.Latency) {
			a.abort()
			return
		}
		a.complete(nil, false)
	case f.Kind == KindRefuse || f.Kind == KindReset:
		a.refused = true
		a.settle()
		resetConn(a.w)
	case f.Kind == KindEmpty400:
		// The gateway's empty 400: no body, no content type.
		a.w.Header().Set("Content-Length", "0")
		a.writeHeader(http.StatusBadRequest)
	case f.Kind == KindRefusal:
		if a.in.api == OpenAI && f.Shape == ShapeError {
			a.apiError(errInvalidPrompt, "", nil)
			return
		}
		a.complete(f, true)
	case f.Kind == KindSlow:
		wait := f.Delay
		if !a.in.stream {
			wait += f.Stall // nothing to stall in the middle of
		}
		if !a.s.sleep(ctx, a.at, wait) {
			a.abort()
			return
		}
		a.complete(f, false)
	case f.Kind == KindStreamError:
		a.complete(f, false)
	default:
		a.faultError(f)
	}
}

// abort ends an answer cut short (the client went away, or the server is
// closing) by dropping the connection: nothing more is written, so a
// client still there sees the connection fail, not an answer.
func (a *answer) abort() {
	a.aborted = true
	a.settle()
	resetConn(a.w)
}

// settle completes the request's record before the last of the answer
// leaves: a client that has its whole answer (or its reset) finds the
// request Done in the log. Answers written whole are sent when the handler
// returns, after finish, and need no settle.
func (a *answer) settle() { a.s.update(a) }

// writeHeader sends the status line and headers.
func (a *answer) writeHeader(status int) {
	a.status = status
	a.w.WriteHeader(status)
}

// complete answers 200: the healthy text, or a refusal (no text, the
// refusal stop). f's stall or error event, if any, comes after
// f.AfterChunks deltas.
func (a *answer) complete(f *Fault, refusal bool) {
	ctx := a.r.Context()
	text := a.s.tl.Answer.Text
	parts := split(text, a.s.tl.Answer.Chunks)
	if refusal {
		text, parts = "", nil
	}
	outTokens := estimateTokens(text)
	if !a.in.stream {
		var body any
		if a.in.api == OpenAI {
			body = a.openAICompletion(text, refusal, outTokens)
		} else {
			body = a.anthropicMessage(text, refusal, outTokens)
		}
		a.writeJSON(http.StatusOK, body)
		return
	}
	h := a.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	a.requestID()
	a.writeHeader(http.StatusOK)
	var st streamer = &openAIStream{a: a}
	if a.in.api == Anthropic {
		st = &anthropicStream{a: a}
	}
	if !st.begin() {
		return
	}
	for i := 0; i <= len(parts); i++ {
		if f != nil && i == f.AfterChunks {
			switch f.Kind {
			case KindSlow:
				if !a.s.sleep(ctx, a.s.clock.Now(), f.Stall) {
					a.abort()
					return
				}
			case KindStreamError:
				a.errMsg = a.shape(errStream, "").message
				a.settle()
				st.fail()
				return
			}
		}
		if i == len(parts) {
			break
		}
		if !st.delta(parts[i]) {
			return
		}
		a.chunks++
	}
	a.settle()
	st.end(refusal, outTokens)
}

// split cuts text into at most n pieces of nearly equal length (in runes).
func split(text string, n int) []string {
	r := []rune(text)
	n = min(n, len(r))
	parts := make([]string, 0, n)
	for i := range n {
		parts = append(parts, string(r[i*len(r)/n:(i+1)*len(r)/n]))
	}
	return parts
}

// event writes one server-sent event (name "" for data only) and flushes
// it; false when the client is gone.
func (a *answer) event(name string, data any) bool {
	var b []byte
	if name != "" {
		b = append(b, "event: "+name+"\n"...)
	}
	b = append(b, "data: "...)
	if s, ok := data.(string); ok {
		b = append(b, s...)
	} else {
		j, err := json.Marshal(data)
		if err != nil {
			panic(err) // the server's own maps
		}
		b = append(b, j...)
	}
	b = append(b, "\n\n"...)
	if _, err := a.w.Write(b); err != nil || a.r.Context().Err() != nil {
		a.aborted = true
		return false
	}
	http.NewResponseController(a.w).Flush() //nolint:errcheck // a failed flush shows in the next write
	return true
}

// writeJSON writes a whole JSON answer.
func (a *answer) writeJSON(status int, body any) {
	a.requestID()
	if err := writeJSON(a.w, status, nil, body); err != nil {
		a.aborted = true
	}
	a.status = status
}

// requestID sets the request id header each API sends.
func (a *answer) requestID() {
	if a.in.api == OpenAI {
		a.w.Header().Set("x-request-id", a.id("req_"))
	} else {
		a.w.Header().Set("request-id", a.id("req_"))
	}
}

// id is a stable id for this request.
func (a *answer) id(prefix string) string { return fmt.Sprintf("%schaos%06d", prefix, a.seq) }

func writeJSON(w http.ResponseWriter, status int, h http.Header, body any) error {
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	for k, v := range h {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, err = w.Write(data)
	return err
}

// update completes the record of a's request with what was answered.
func (s *Server) update(a *answer) Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &s.requests[a.seq-1]
	r.Status, r.Error, r.Chunks, r.Refused = a.status, a.errMsg, a.chunks, a.refused
	r.Aborted = a.aborted
	r.Done = true
	r.Duration = s.clock.Now().Sub(a.at)
	return *r
}

// finish completes the record of a's request once its handler is done,
// and writes its log line.
func (s *Server) finish(a *answer) {
	rec := s.update(a)
	s.logger.Debug().Int("seq", rec.Seq).Str("provider", rec.Provider).Str("key", rec.Key).Str("model", rec.Model).
		Bool("stream", rec.Stream).Int("status", rec.Status).Str("window", rec.Window).Bool("refused", rec.Refused).
		Bool("aborted", rec.Aborted).Msg("request")
	s.logLine(rec)
}
