package chaos

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// maxBody bounds a request body the server reads.
const maxBody = 32 << 20

// incoming is what the server reads from a request before it decides.
type incoming struct {
	api          API
	provider     string
	key          string
	model        string
	stream       bool
	includeUsage bool
	prompt       string
	tokens       int
	sdkRetry     int
	bad          string // why the body could not be read; "" when it could
}

// provider returns the handler of one API; name is the provider's name,
// or "" to take it from the path.
func (s *Server) provider(api API, name string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			resetConn(w)
			return
		}
		s.inflight.Add(1)
		s.mu.Unlock()
		defer s.inflight.Done()

		in := read(r, api, name)
		seq, at, fault := s.admit(in)
		a := &answer{s: s, w: w, r: r, in: in, seq: seq, at: at, fault: fault}
		a.run()
	}
}

// read parses what the server needs of a request; a body it cannot read
// is noted in bad and answered 400.
func read(r *http.Request, api API, name string) incoming {
	in := incoming{api: api, provider: name, sdkRetry: -1}
	if in.provider == "" {
		in.provider = r.PathValue("provider")
	}
	in.key = r.Header.Get("x-api-key")
	if in.key == "" {
		auth := r.Header.Get("Authorization")
		if k, ok := strings.CutPrefix(auth, "Bearer "); ok {
			in.key = strings.TrimSpace(k)
		} else {
			in.key = auth
		}
	}
	if v := r.Header.Get("X-Stainless-Retry-Count"); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			in.sdkRetry = n
		}
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		in.bad = "could not read the request body: " + err.Error()
		return in
	}
	if len(data) > maxBody {
		in.bad = "request body above 32 MiB"
		return in
	}
	var body struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		System   any `json:"system"`
		Messages any `json:"messages"`
	}
	if err := json.Unmarshal(data, &body); err != nil {
		in.bad = "the body is not a JSON request: " + err.Error()
		return in
	}
	in.model, in.stream = body.Model, body.Stream
	in.includeUsage = body.StreamOptions != nil && body.StreamOptions.IncludeUsage
	in.prompt = PromptText(body.System, body.Messages)
	in.tokens = estimateTokens(in.prompt)
	return in
}

// textKeys are the JSON keys whose string values are prompt text, in both
// APIs (message content, content blocks, the system prompt, tool call
// arguments).
var textKeys = map[string]bool{"content": true, "text": true, "system": true, "arguments": true}

// PromptText is a request's prompt text as the provider reads it: the
// system prompt's and the messages' text, one string a line, map keys in
// sorted order. The fleet drill fingerprints its requests with it, so its
// ledger matches this provider's log.
func PromptText(system, messages any) string {
	var b strings.Builder
	collectText(&b, "system", system)
	collectText(&b, "", messages)
	return b.String()
}

// collectText appends the prompt text under v, in a stable order, one
// string per line.
func collectText(b *strings.Builder, key string, v any) {
	switch v := v.(type) {
	case string:
		if textKeys[key] {
			b.WriteString(v)
			b.WriteByte('\n')
		}
	case []any:
		for _, e := range v {
			collectText(b, key, e)
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			collectText(b, k, v[k])
		}
	}
}

// estimateTokens is the usual rough estimate: a token is four bytes of
// text.
func estimateTokens(text string) int { return (len(text) + 3) / 4 }

// fingerprint identifies a prompt text.
func fingerprint(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:8])
}

// admit records the request and decides who answers it: the refuse window
// open now, the first fault window that catches it, or nobody (a healthy
// answer, which counts toward the quota windows).
func (s *Server) admit(in incoming) (int, time.Time, *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	rec := Request{
		Seq: len(s.requests) + 1, At: now, Offset: s.offsetAt(now),
		Provider: in.provider, API: in.api, Key: in.key, Model: in.model, Stream: in.stream,
		Fingerprint: fingerprint(in.prompt), Tokens: in.tokens, SDKRetry: in.sdkRetry,
	}
	var chosen *Fault
	switch {
	case in.bad != "":
	case s.refusing != "":
		f, _ := s.tl.Fault(s.refusing)
		chosen = &f
	default:
		for i := range s.tl.Faults {
			f := &s.tl.Faults[i]
			if f.Kind == KindRefuse || !f.active(rec.Offset) || !f.passes(in) || !s.catches(i, f, in) {
				continue
			}
			if f.Probability < 1 && s.rng.Float64() >= f.Probability {
				continue
			}
			chosen = f
			break
		}
		if chosen == nil || chosen.Kind == KindSlow {
			s.spend(rec.Offset, in)
		}
	}
	if chosen != nil {
		rec.Fault, rec.Window = chosen.Kind, chosen.Name
	}
	s.requests = append(s.requests, rec)
	return rec.Seq, now, chosen
}

// passes reports whether in passes f's filters.
func (f *Fault) passes(in incoming) bool {
	in1 := func(list []string, v string) bool { return len(list) == 0 || slices.Contains(list, v) }
	return in1(f.Providers, in.provider) && in1(f.APIs, string(in.api)) && in1(f.Models, in.model) && in1(f.Keys, in.key)
}

// catches applies the kind's own condition. It needs s.mu.
func (s *Server) catches(i int, f *Fault, in incoming) bool {
	switch f.Kind {
	case KindQuota:
		u := s.usage[quotaKey{i, in.key}]
		return u != nil && (f.AfterRequests > 0 && u.requests >= f.AfterRequests || f.AfterTokens > 0 && u.tokens >= f.AfterTokens)
	case KindRefusal:
		for _, m := range f.Markers {
			if strings.Contains(in.prompt, m) {
				return true
			}
		}
		return false
	case KindOverflow:
		return in.tokens > f.AboveTokens
	case KindStreamError:
		return in.stream
	}
	return true
}

// spend counts a successful answer against every quota window open for
// its key. It needs s.mu.
func (s *Server) spend(at time.Duration, in incoming) {
	for i := range s.tl.Faults {
		f := &s.tl.Faults[i]
		if f.Kind != KindQuota || !f.active(at) || !f.passes(in) {
			continue
		}
		k := quotaKey{i, in.key}
		u := s.usage[k]
		if u == nil {
			u = &usage{}
			s.usage[k] = u
		}
		u.requests++
		u.tokens += in.tokens + estimateTokens(s.tl.Answer.Text)
	}
}

// resetConn drops the request's connection with a TCP reset: no status,
// no body.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return
	}
	c, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
