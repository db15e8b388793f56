package drill

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/failbus/failbus/internal/chaos"
)

// What a call is for; the figures are counted by it.
const (
	kindStep  = "step"  // a step of a task
	kindCron  = "cron"  // a cron run, or its memory write redone
	kindProbe = "probe" // a probe of a provider in an outage
)

// intent is what the fleet meant a request for: the ledger maps each
// prompt the provider received back to it.
type intent struct {
	Kind  string
	Agent string
	Task  string // kindStep
	Step  int    // kindStep
	// Began is when the attempt began: the SDK call (its own retries
	// included), or Call's attempt (after the route said where it may go).
	Began time.Time
}

type intentKey struct{}

func withIntent(ctx context.Context, in intent) context.Context {
	return context.WithValue(ctx, intentKey{}, in)
}

// ledger records, from the client's side, every request the fleet sent:
// its prompt's fingerprint (computed as the chaos server computes it, so
// the server's log maps back to what the request was for) and, for a
// provider that keeps no log (Config.Real), the request itself.
type ledger struct {
	start time.Time
	scale float64

	mu      sync.Mutex
	intents map[string]intent // fingerprint -> intent
	log     []sent            // the client's own log
}

// sent is one request as the client sent it.
type sent struct {
	chaos.Request
	intent intent
}

func newLedger(start time.Time, scale float64) *ledger {
	return &ledger{start: start, scale: scale, intents: map[string]intent{}}
}

// intent is what the request with prompt fingerprint fp was for.
func (l *ledger) intent(fp string) (intent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	in, ok := l.intents[fp]
	return in, ok
}

// clientLog is the requests as the client saw them.
func (l *ledger) clientLog() chaos.Log {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(chaos.Log, len(l.log))
	for i, s := range l.log {
		out[i] = s.Request
	}
	return out
}

// sent is every request the client sent, with what it was for.
func (l *ledger) sent() []sent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.log)
}

// count is how many requests the client sent.
func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.log)
}

// middleware records each HTTP attempt an SDK makes (its own retries
// included) to provider: the prompt's fingerprint with the intent in the
// request's context, and the attempt in the client's log.
func (l *ledger) middleware(provider string) func(*http.Request, func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	return func(r *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
		var body []byte
		if r.Body != nil {
			body, _ = io.ReadAll(r.Body)
			_ = r.Body.Close()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		prompt := promptText(body)
		fp := fingerprint(prompt)
		in, _ := r.Context().Value(intentKey{}).(intent)
		now := time.Now()
		rec := chaos.Request{
			At: now, Offset: time.Duration(float64(now.Sub(l.start)) / l.scale), Provider: provider,
			Key: requestKey(r), Fingerprint: fp, Tokens: (len(prompt) + 3) / 4, SDKRetry: -1,
		}
		if n, err := strconv.Atoi(r.Header.Get("X-Stainless-Retry-Count")); err == nil {
			rec.SDKRetry = n
		}
		l.mu.Lock()
		if in.Kind != "" {
			k := in
			k.Began = time.Time{}
			l.intents[fp] = k
		}
		rec.Seq = len(l.log) + 1
		l.log = append(l.log, sent{Request: rec, intent: in})
		l.mu.Unlock()
		res, err := next(r)
		l.mu.Lock()
		e := &l.log[rec.Seq-1].Request
		e.Done = true
		if res != nil {
			e.Status = res.StatusCode
		}
		if err != nil {
			e.Error, e.Refused = err.Error(), res == nil
		}
		l.mu.Unlock()
		return res, err
	}
}

// requestKey is the API key a request carries, as the chaos server reads
// it.
func requestKey(r *http.Request) string {
	if k := r.Header.Get("x-api-key"); k != "" {
		return k
	}
	if k, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(k)
	}
	return ""
}

// promptText is the prompt text of a request body the way the chaos
// provider reads it, so fingerprint matches its log.
func promptText(body []byte) string {
	var req struct {
		System   any `json:"system"`
		Messages any `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return ""
	}
	return chaos.PromptText(req.System, req.Messages)
}

// fingerprint identifies a prompt text as the chaos provider's log does.
func fingerprint(text string) string {
	sum := sha256.Sum256([]byte(text))
	return hex.EncodeToString(sum[:8])
}
