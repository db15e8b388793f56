package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// DefaultAddr is where the server listens unless told otherwise: a free
// port on the loopback interface.
const DefaultAddr = "127.0.0.1:0"

// RequestsPath is the server's own endpoint that lists the requests it
// received (GET, JSON array of Request; ?since=SEQ for those after SEQ).
const RequestsPath = "/_chaos/requests"

// Options configure a Server. The zero value is usable.
type Options struct {
	// Addr is the address to listen on (DefaultAddr).
	Addr string
	// Clock is the server's time (the machine's clock).
	Clock Clock
	// Scale overrides the timeline's scale when not 0.
	Scale float64
	// Seed overrides the timeline's seed when not 0.
	Seed uint64
	// Logger gets window openings and closings (info) and every request
	// (debug); the zero logger is silent.
	Logger zerolog.Logger
	// RequestLog, when set, gets one JSON line per request (a Request)
	// when its answer ends, those Close cuts short included; the lines of
	// requests answered at the same time may be out of Seq order.
	RequestLog io.Writer
}

// Server is a chaos provider: an HTTP server that speaks the OpenAI chat
// completions and Anthropic messages APIs and fails as its timeline says.
// Create it with New, then Start; it is safe for concurrent use.
type Server struct {
	tl     *Timeline
	addr   string
	clock  Clock
	scale  float64
	logger zerolog.Logger
	jsonl  io.Writer

	jsonlMu sync.Mutex

	mu       sync.Mutex
	rng      *rand.Rand
	start    time.Time
	started  bool
	closed   bool
	requests []Request
	usage    map[quotaKey]*usage
	refusing string // the refuse window open now, "" when none
	ln       net.Listener
	held     *reservation // the port, held during a refuse window
	conns    map[net.Conn]struct{}

	gate      *gate
	srv       *http.Server
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
	inflight  sync.WaitGroup
	bg        sync.WaitGroup
}

type quotaKey struct {
	fault int
	key   string
}

type usage struct{ requests, tokens int }

// New returns a server for tl (nil: no faults); Start makes it listen.
// It checks tl as ParseTimeline checks a file; in a timeline built in Go,
// a zero Answer.Text or Answer.Chunks, and a zero To or Probability of a
// fault, take their defaults. tl is not modified and may be shared.
func New(tl *Timeline, opts Options) (*Server, error) {
	if tl == nil {
		tl = &Timeline{}
	}
	tl, err := tl.normalized()
	if err != nil {
		return nil, err
	}
	s := &Server{
		tl: tl, addr: opts.Addr, clock: opts.Clock, scale: tl.Scale, logger: opts.Logger, jsonl: opts.RequestLog,
		usage: map[quotaKey]*usage{}, conns: map[net.Conn]struct{}{}, done: make(chan struct{}),
	}
	if s.addr == "" {
		s.addr = DefaultAddr
	}
	if s.clock == nil {
		s.clock = realClock{}
	}
	if opts.Scale != 0 {
		s.scale = opts.Scale
	}
	if s.scale == 0 {
		s.scale = 1
	}
	if s.scale < 0 || math.IsNaN(s.scale) || math.IsInf(s.scale, 0) {
		return nil, fmt.Errorf("chaos: scale %v: must be positive", s.scale)
	}
	seed := tl.Seed
	if opts.Seed != 0 {
		seed = opts.Seed
	}
	s.rng = rand.New(rand.NewPCG(seed, 0x636861_6f73)) // "chaos"
	mux := http.NewServeMux()
	for _, p := range []struct {
		api  API
		path string
	}{{OpenAI, "/v1/chat/completions"}, {Anthropic, "/v1/messages"}} {
		mux.HandleFunc("POST "+p.path, s.provider(p.api, string(p.api)))
		mux.HandleFunc("POST /{provider}"+p.path, s.provider(p.api, ""))
	}
	mux.HandleFunc("GET "+RequestsPath, s.serveRequests)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, nil, map[string]any{"error": map[string]any{
			"message": "chaos provider: no route " + r.Method + " " + r.URL.Path + " (it serves POST /v1/chat/completions and POST /v1/messages, each also under /<provider>/)",
			"type":    "invalid_request_error", "param": nil, "code": "unknown_url"}})
	})
	s.srv = &http.Server{Handler: mux, ConnState: s.connState, ReadHeaderTimeout: time.Minute}
	return s, nil
}

// Start listens and serves until ctx ends or Close is called; the
// timeline's clock starts now. It returns once the port is open.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.started || s.closed {
		s.mu.Unlock()
		return errors.New("chaos: Start called twice, or after Close")
	}
	s.started = true
	ln, err := listen(s.addr)
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("chaos: listen: %w", err)
	}
	s.addr = ln.Addr().String()
	s.gate = &gate{conns: make(chan net.Conn), done: make(chan struct{}), addr: ln.Addr()}
	s.serveOn(ln)
	s.start = s.clock.Now()
	s.mu.Unlock()

	s.bg.Add(2)
	go func() {
		defer s.bg.Done()
		if err := s.srv.Serve(s.gate); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error().Err(err).Msg("chaos provider stopped serving")
		}
	}()
	go func() { defer s.bg.Done(); s.control() }()
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Close()
		case <-s.done:
		}
	}()
	s.logger.Info().Str("url", s.URL()).Float64("scale", s.scale).Int("faults", len(s.tl.Faults)).Msg("chaos provider listening")
	return nil
}

// URL is the server's root, http://HOST:PORT (after Start).
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "http://" + s.addr
}

// OpenAIBaseURL is the base URL an OpenAI SDK takes to reach the server as
// provider ("" for the bare path, logged as provider "openai").
func (s *Server) OpenAIBaseURL(provider string) string {
	if provider == "" {
		return s.URL() + "/v1/"
	}
	return s.URL() + "/" + provider + "/v1/"
}

// AnthropicBaseURL is the base URL an Anthropic SDK takes to reach the
// server as provider ("" for the bare path, logged as provider
// "anthropic").
func (s *Server) AnthropicBaseURL(provider string) string {
	if provider == "" {
		return s.URL()
	}
	return s.URL() + "/" + provider
}

// Elapsed is the timeline time since Start: the server's clock since then
// divided by the scale.
func (s *Server) Elapsed() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.offsetAt(s.clock.Now())
}

// Requests returns a copy of every request received so far, in arrival
// order; those still being answered are not Done.
func (s *Server) Requests() Log {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(Log(s.requests))
}

// Close stops the server: it closes the port and every connection, ends
// the answers in progress (Aborted), writes their log lines, and returns
// once every handler has returned. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		if s.ln != nil {
			_ = s.ln.Close()
			s.ln = nil
		}
		if s.held != nil {
			_ = s.held.Close()
			s.held = nil
		}
		started := s.started
		s.mu.Unlock()
		close(s.done)
		if !started {
			return
		}
		_ = s.gate.Close()
		s.closeErr = s.srv.Close()
		s.inflight.Wait()
		s.bg.Wait()
		s.logger.Info().Int("requests", len(s.Requests())).Msg("chaos provider closed")
	})
	return s.closeErr
}

// offsetAt converts a time on the server's clock to timeline time. It
// needs s.mu (for s.start).
func (s *Server) offsetAt(t time.Time) time.Duration {
	return time.Duration(float64(t.Sub(s.start)) / s.scale)
}

// wall converts timeline time to the server's clock, rounding up so a
// wait never ends before the timeline time it stands for.
func (s *Server) wall(d time.Duration) time.Duration {
	return time.Duration(math.Ceil(float64(d) * s.scale))
}

// sleep waits d of timeline time from from (a time on the server's
// clock); false when the client went away or the server closed first.
func (s *Server) sleep(ctx context.Context, from time.Time, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	select {
	case <-s.clock.At(from.Add(s.wall(d))):
		return true
	case <-ctx.Done():
		return false
	case <-s.done:
		return false
	}
}

// control opens and closes the windows as the timeline's clock reaches
// them: it logs each, and closes the port for a refuse window.
func (s *Server) control() {
	var bounds []time.Duration
	for _, f := range s.tl.Faults {
		bounds = append(bounds, f.From)
		if f.To != Forever {
			bounds = append(bounds, f.To)
		}
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	open := make([]bool, len(s.tl.Faults))
	for {
		now := s.Elapsed()
		refuse := ""
		for i := range s.tl.Faults {
			f := &s.tl.Faults[i]
			active := f.active(now)
			if active && f.Kind == KindRefuse && refuse == "" {
				refuse = f.Name
			}
			if active != open[i] {
				open[i] = active
				verb := "fault window opens"
				if !active {
					verb = "fault window closes"
				}
				s.logger.Info().Str("window", f.Name).Str("kind", string(f.Kind)).Str("at", now.Round(time.Millisecond).String()).Msg(verb)
			}
		}
		s.setRefusing(refuse)
		i, _ := slices.BinarySearch(bounds, now+1)
		if i == len(bounds) {
			return
		}
		select {
		case <-s.clock.At(s.start.Add(s.wall(bounds[i]))):
		case <-s.done:
			return
		}
	}
}

// setRefusing closes the port when a refuse window opens (and every open
// connection: a client must not get through on one it pooled before), and
// opens it again when the window closes. The port stays the server's
// meanwhile: a socket bound to it without listening (reserve) refuses the
// connections and keeps any other listener off it.
func (s *Server) setRefusing(window string) {
	s.mu.Lock()
	was := s.refusing
	s.refusing = window
	if window != "" && was == "" && s.ln != nil {
		held, err := reserve(s.addr)
		if err != nil {
			s.logger.Warn().Err(err).Str("addr", s.addr).Msg("chaos provider: cannot hold the port during the refuse window; it is free until the window ends")
		}
		s.held = held
		_ = s.ln.Close()
		s.ln = nil
		for c := range s.conns {
			_ = c.Close()
		}
	}
	if window != "" || was == "" || s.closed {
		s.mu.Unlock()
		return
	}
	if s.held != nil {
		ln, err := s.held.listen()
		s.held = nil
		if err == nil {
			s.serveOn(ln)
			s.mu.Unlock()
			return
		}
		s.logger.Warn().Err(err).Str("addr", s.addr).Msg("chaos provider: cannot listen on the held port")
	}
	s.mu.Unlock()
	// Listen again on a port that was let go. If something took it
	// meanwhile, try again until it is free or the server closes.
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		ln, err := listen(s.addr)
		if err == nil {
			s.mu.Lock()
			if s.closed || s.refusing != "" {
				s.mu.Unlock()
				_ = ln.Close()
				return
			}
			s.serveOn(ln)
			s.mu.Unlock()
			return
		}
		s.logger.Warn().Err(err).Str("addr", s.addr).Msg("chaos provider: cannot listen again after a refuse window; retrying")
		select {
		case <-time.After(delay):
		case <-s.done:
			return
		}
	}
}

// serveOn makes ln the listener whose connections the server takes. It
// needs s.mu.
func (s *Server) serveOn(ln net.Listener) {
	s.ln = ln
	s.bg.Add(1)
	go func() { defer s.bg.Done(); s.gate.feed(ln) }()
}

func (s *Server) connState(c net.Conn, st http.ConnState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st {
	case http.StateNew:
		if s.refusing != "" {
			// Accepted just before the port closed.
			_ = c.Close()
			return
		}
		s.conns[c] = struct{}{}
	case http.StateHijacked, http.StateClosed:
		delete(s.conns, c)
	}
}

// serveRequests is GET /_chaos/requests[?since=SEQ].
func (s *Server) serveRequests(w http.ResponseWriter, r *http.Request) {
	since := 0
	if v := r.URL.Query().Get("since"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			http.Error(w, "since: not a sequence number", http.StatusBadRequest)
			return
		}
		since = n
	}
	log := s.Requests().Where(func(r Request) bool { return r.Seq > since })
	if log == nil {
		log = Log{}
	}
	writeJSON(w, http.StatusOK, nil, log)
}

// logLine writes r to the request log.
func (s *Server) logLine(r Request) {
	if s.jsonl == nil {
		return
	}
	data, err := json.Marshal(r)
	if err != nil {
		return
	}
	s.jsonlMu.Lock()
	defer s.jsonlMu.Unlock()
	if _, err := s.jsonl.Write(append(data, '\n')); err != nil {
		s.logger.Error().Err(err).Msg("chaos provider: writing the request log")
	}
}

// gate is the listener the HTTP server serves: it outlives the real
// listening sockets, which a refuse window closes and reopens.
type gate struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	addr  net.Addr
}

func (g *gate) Accept() (net.Conn, error) {
	select {
	case c := <-g.conns:
		return c, nil
	case <-g.done:
		return nil, net.ErrClosed
	}
}

func (g *gate) Close() error {
	g.once.Do(func() { close(g.done) })
	return nil
}

func (g *gate) Addr() net.Addr { return g.addr }

// feed hands ln's connections to the gate until ln closes.
func (g *gate) feed(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: wait and go on, as net/http does.
			select {
			case <-time.After(10 * time.Millisecond):
				continue
			case <-g.done:
				return
			}
		}
		select {
		case g.conns <- c:
		case <-g.done:
			_ = c.Close()
			return
		}
	}
}
