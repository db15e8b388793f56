package status

import (
	"context"
	_ "embed"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failbus/failbus/internal/ops"
)

// DefaultInterval is how often the page is refreshed.
const DefaultInterval = 2 * time.Second

// Path is where the page is served; Path+".json" serves one snapshot,
// Path+"/events" a snapshot every interval as server-sent events.
const Path = "/status"

//go:embed page.html
var pageHTML string

// Server serves the page from a Collector. Snapshots are shared: however
// many pages watch, the bus is read at most once per interval.
type Server struct {
	interval time.Duration
	// done ends every event stream (the process is stopping).
	done <-chan struct{}
	page []byte

	collector atomic.Pointer[Collector]
	// notReady is the problem shown before a collector is set.
	notReady string

	mu     sync.Mutex
	last   *Snapshot
	lastAt time.Time
}

// NewServer serves c's snapshots every interval (DefaultInterval when 0)
// until ctx ends. c may be nil and set later (SetCollector): until then
// the page says notReady.
func NewServer(ctx context.Context, c *Collector, interval time.Duration, notReady string) *Server {
	if interval <= 0 {
		interval = DefaultInterval
	}
	s := &Server{interval: interval, done: ctx.Done(), notReady: notReady,
		page: []byte(strings.Replace(pageHTML, "{{INTERVAL_MS}}", strconv.FormatInt(interval.Milliseconds(), 10), 1))}
	if c != nil {
		s.collector.Store(c)
	}
	return s
}

// SetCollector sets (or replaces) where snapshots are read.
func (s *Server) SetCollector(c *Collector) { s.collector.Store(c) }

// Routes are the page's endpoints, for ops.Serve.
func (s *Server) Routes() []ops.Endpoint {
	return []ops.Endpoint{
		{Pattern: "GET " + Path, Handler: http.HandlerFunc(s.servePage)},
		{Pattern: "GET " + Path + "/{$}", Handler: http.HandlerFunc(s.servePage)},
		{Pattern: "GET " + Path + ".json", Handler: http.HandlerFunc(s.serveJSON)},
		{Pattern: "GET " + Path + "/events", Handler: http.HandlerFunc(s.serveEvents)},
	}
}

// Handler is a mux with Routes, and / redirecting to the page (`failbus
// status`).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, r := range s.Routes() {
		mux.Handle(r.Pattern, r.Handler)
	}
	mux.Handle("GET /{$}", http.RedirectHandler(Path, http.StatusFound))
	return mux
}

// snapshot returns the latest snapshot, read again when it is older than
// half the interval.
func (s *Server) snapshot(ctx context.Context) *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != nil && time.Since(s.lastAt) < s.interval/2 {
		return s.last
	}
	c := s.collector.Load()
	if c == nil {
		return &Snapshot{At: time.Now().UTC(), WindowSeconds: int(Window / time.Second), Providers: []Provider{}, Consumers: []Consumer{},
			DeadLetters: DeadLetters{ByReason: []ReasonCount{}}, Notifications: Notifications{Requested: map[string]int{}},
			Problems: []string{s.notReady}}
	}
	snap, err := c.Collect(ctx)
	if err != nil {
		snap.Problems = append(snap.Problems, "reading the bus: "+err.Error())
	}
	s.last, s.lastAt = snap, time.Now()
	return snap
}

func noStore(w http.ResponseWriter, contentType string) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Cache-Control", "no-store")
	// Read-only and self-contained: nothing from elsewhere, no framing.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
}

func (s *Server) servePage(w http.ResponseWriter, _ *http.Request) {
	noStore(w, "text/html; charset=utf-8")
	_, _ = w.Write(s.page)
}

func (s *Server) serveJSON(w http.ResponseWriter, r *http.Request) {
	noStore(w, "application/json")
	_ = json.NewEncoder(w).Encode(s.snapshot(r.Context()))
}

// serveEvents sends a snapshot at once and then every interval, until the
// client goes or the server stops.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	noStore(w, "text/event-stream")
	w.WriteHeader(http.StatusOK)
	tick := time.NewTicker(s.interval)
	defer tick.Stop()
	for {
		b, err := json.Marshal(s.snapshot(r.Context()))
		if err != nil {
			return
		}
		// "retry" tells the browser how soon to reconnect after a break.
		if _, err := w.Write([]byte("retry: " + strconv.FormatInt(s.interval.Milliseconds(), 10) + "\ndata: ")); err != nil {
			return
		}
		if _, err := w.Write(b); err != nil {
			return
		}
		if _, err := w.Write([]byte("\n\n")); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-tick.C:
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		}
	}
}
