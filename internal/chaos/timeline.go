package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"
)

// Kind is what a fault window does to the requests it catches.
type Kind string

// The fault kinds. Each answers as the real provider does (docs/CHAOS.md
// lists the exact status, headers and body of each, per API).
const (
	// KindRefuse closes the listening socket for the window: a new
	// connection is refused by the kernel (ECONNREFUSED), connections
	// already open are closed, and a request that still arrives on one is
	// reset. The server never sees a refused connection, so those calls
	// are not in the log; use KindReset when they must be counted. It
	// takes no filters and no probability: a socket is refused for all.
	KindRefuse Kind = "refuse"
	// KindReset accepts the connection, reads the request (so it is
	// logged), and resets the TCP connection without an answer: the
	// client sees "connection reset by peer".
	KindReset Kind = "reset"
	// KindUnavailable answers 503 in the API's error shape.
	KindUnavailable Kind = "unavailable"
	// KindOverloaded answers Anthropic's 529 overloaded_error on the
	// messages API, and OpenAI's 503 "The server is overloaded or not
	// ready yet." on chat completions.
	KindOverloaded Kind = "overloaded"
	// KindRateLimit answers 429 (rate_limit_exceeded / rate_limit_error),
	// with retry-after when RetryAfter is set.
	KindRateLimit Kind = "rate_limit"
	// KindQuota caps each API key: once a key had AfterRequests
	// successful answers (or used AfterTokens tokens) in the window, it
	// gets OpenAI's 429 insufficient_quota or Anthropic's 402
	// billing_error until the window ends.
	KindQuota Kind = "quota"
	// KindEmpty400 is the gateway's empty 400: status 400, no body.
	KindEmpty400 Kind = "empty_400"
	// KindRefusal refuses requests whose prompt holds one of Markers.
	KindRefusal Kind = "refusal"
	// KindOverflow answers the provider's context-overflow error to a
	// prompt estimated above AboveTokens tokens.
	KindOverflow Kind = "overflow"
	// KindSlow waits Delay before the headers, and in a stream stalls
	// for Stall after AfterChunks deltas; then answers normally.
	KindSlow Kind = "slow"
	// KindStreamError ends a stream with an error event after
	// AfterChunks deltas. It catches only streamed requests.
	KindStreamError Kind = "stream_error"
)

var kinds = []Kind{KindRefuse, KindReset, KindUnavailable, KindOverloaded, KindRateLimit, KindQuota,
	KindEmpty400, KindRefusal, KindOverflow, KindSlow, KindStreamError}

// Forever is the To of a window that lasts until the server stops.
const Forever = time.Duration(math.MaxInt64)

// Refusal shapes of the OpenAI API (the messages API has one: a 200 with
// stop_reason "refusal").
const (
	// ShapeStop is a 200 whose choice ends with finish_reason
	// "content_filter" and no content (OpenAI's and Azure's filtered
	// completion). The default.
	ShapeStop = "stop"
	// ShapeError is a 400 invalid_request_error with code
	// "invalid_prompt" (OpenAI's answer to a flagged prompt).
	ShapeError = "error"
)

// Defaults of a timeline's fields.
const (
	// DefaultAnswerText is what a healthy call answers.
	DefaultAnswerText = "Done: the chaos provider answered."
	// DefaultChunks is how many deltas a healthy stream carries.
	DefaultChunks = 4
	// DefaultAfterChunks is how many deltas a stream carries before a
	// stall or a mid-stream error.
	DefaultAfterChunks = 1
)

// Timeline is a chaos provider's script: what a healthy call answers, and
// the fault windows, at times relative to the server's start.
type Timeline struct {
	// Seed drives every probability draw; the same seed and the same
	// arrival order give the same answers. Options.Seed overrides it.
	Seed uint64
	// Scale multiplies every time of the timeline (windows, delays,
	// retry-after) on the server's clock: 0.01 runs a five-minute
	// timeline in three seconds. Options.Scale overrides it; 0 means 1.
	Scale float64
	// Answer is what a request no fault catches gets.
	Answer Answer
	// Faults are the windows, in file order: the first that catches a
	// request answers it.
	Faults []Fault
}

// Answer is a healthy answer.
type Answer struct {
	// Text is the assistant's text (DefaultAnswerText).
	Text string
	// Chunks is how many deltas a stream splits Text into
	// (DefaultChunks; fewer when Text is shorter).
	Chunks int
	// Latency is waited (timeline time) before the headers of a healthy
	// answer; 0 answers at once.
	Latency time.Duration
}

// Fault is one fault window: from From (inclusive) to To (exclusive),
// timeline time since the server started, it catches the requests that
// pass its filters (and its Probability draw) and answers them as Kind
// says.
type Fault struct {
	// Name names the window in the log (Request.Window); unique.
	Name string
	// Kind is what it does.
	Kind Kind
	// From and To bound the window; To is Forever when not given.
	From, To time.Duration

	// Providers, APIs, Models and Keys filter the requests caught (empty:
	// all). A provider is the name in the URL path (/NAME/v1/...), or
	// "openai" and "anthropic" for the bare paths; an API is "openai" or
	// "anthropic"; a key is the API key as sent.
	Providers, APIs, Models, Keys []string
	// Probability is the chance that a request that passes the filters
	// is caught (drawn from the seed); 1 when not given.
	Probability float64

	// RetryAfter is sent as retry-after, in seconds (rate_limit,
	// unavailable, overloaded). Scaled like every time, so it may carry a
	// fraction under a scale below 1; 0 sends none.
	RetryAfter time.Duration
	// RetryAfterMs sends RetryAfter as retry-after-ms too.
	RetryAfterMs bool
	// AfterRequests and AfterTokens cap each key (quota): a key is capped
	// once it had that many successful answers, or used that many tokens
	// (prompt and answer estimates), in the window; 0 does not cap on
	// that measure.
	AfterRequests, AfterTokens int
	// Markers are the strings whose presence in the prompt gets it
	// refused (refusal).
	Markers []string
	// Shape is the OpenAI refusal: ShapeStop (default) or ShapeError.
	Shape string
	// AboveTokens is the context window (overflow): a prompt estimated
	// above it gets the overflow error.
	AboveTokens int
	// Delay is waited before the headers (slow).
	Delay time.Duration
	// Stall is how long a stream stops after AfterChunks deltas (slow);
	// a request that is not streamed waits it before its headers too.
	Stall time.Duration
	// AfterChunks is how many deltas a stream carries before a stall or
	// an error event (DefaultAfterChunks).
	AfterChunks int
}

// Load reads and checks a timeline file.
func Load(path string) (*Timeline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("chaos timeline: %w", err)
	}
	tl, err := ParseTimeline(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return tl, nil
}

// stringList is a YAML scalar or sequence of strings.
type stringList []string

func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*l = stringList{n.Value}
		return nil
	}
	var s []string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*l = s
	return nil
}

type fileTimeline struct {
	Seed   uint64  `yaml:"seed"`
	Scale  float64 `yaml:"scale"`
	Answer struct {
		Text    *string       `yaml:"text"`
		Chunks  int           `yaml:"chunks"`
		Latency time.Duration `yaml:"latency"`
	} `yaml:"answer"`
	Faults []fileFault `yaml:"faults"`
}

type fileFault struct {
	Name          string         `yaml:"name"`
	Kind          Kind           `yaml:"kind"`
	From          time.Duration  `yaml:"from"`
	To            *time.Duration `yaml:"to"`
	Provider      stringList     `yaml:"provider"`
	API           stringList     `yaml:"api"`
	Model         stringList     `yaml:"model"`
	Key           stringList     `yaml:"key"`
	Probability   *float64       `yaml:"probability"`
	RetryAfter    time.Duration  `yaml:"retry_after"`
	RetryAfterMs  bool           `yaml:"retry_after_ms"`
	AfterRequests int            `yaml:"after_requests"`
	AfterTokens   int            `yaml:"after_tokens"`
	Marker        stringList     `yaml:"marker"`
	Shape         string         `yaml:"shape"`
	AboveTokens   int            `yaml:"above_tokens"`
	Delay         time.Duration  `yaml:"delay"`
	Stall         time.Duration  `yaml:"stall"`
	AfterChunks   *int           `yaml:"after_chunks"`
}

var windowName = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// ParseTimeline decodes and checks a timeline (YAML; docs/CHAOS.md). An
// unknown key, a field the fault's kind does not use, a window that ends
// before it starts, or two windows of one name are errors.
func ParseTimeline(data []byte) (*Timeline, error) {
	var f fileTimeline
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("chaos timeline: %w", err)
	}
	tl := &Timeline{Seed: f.Seed, Scale: f.Scale, Answer: Answer{Text: DefaultAnswerText, Chunks: f.Answer.Chunks, Latency: f.Answer.Latency}}
	if f.Answer.Text != nil {
		tl.Answer.Text = *f.Answer.Text
	}
	if tl.Answer.Chunks == 0 {
		tl.Answer.Chunks = DefaultChunks
	}
	for i, ff := range f.Faults {
		fault, err := ff.fault()
		if err != nil {
			name := ff.Name
			if name == "" {
				name = fmt.Sprintf("#%d", i+1)
			}
			return nil, fmt.Errorf("chaos timeline: fault %s: %w", name, err)
		}
		tl.Faults = append(tl.Faults, fault)
	}
	if _, err := tl.normalized(); err != nil {
		return nil, err
	}
	return tl, nil
}

// fault checks one window and fills in its defaults.
func (ff fileFault) fault() (Fault, error) {
	f := Fault{
		Name: ff.Name, Kind: ff.Kind, From: ff.From, To: Forever,
		Providers: ff.Provider, APIs: ff.API, Models: ff.Model, Keys: ff.Key, Probability: 1,
		RetryAfter: ff.RetryAfter, RetryAfterMs: ff.RetryAfterMs,
		AfterRequests: ff.AfterRequests, AfterTokens: ff.AfterTokens,
		Markers: ff.Marker, Shape: ff.Shape, AboveTokens: ff.AboveTokens,
		Delay: ff.Delay, Stall: ff.Stall, AfterChunks: DefaultAfterChunks,
	}
	if ff.To != nil {
		f.To = *ff.To
	}
	if ff.Probability != nil {
		f.Probability = *ff.Probability
	}
	if ff.AfterChunks != nil {
		f.AfterChunks = *ff.AfterChunks
	}
	// Each kind-specific field belongs to the kinds that use it: one on
	// another kind is a mistake in the file, not a no-op.
	uses := map[string]bool{
		"retry_after":    ff.RetryAfter != 0,
		"retry_after_ms": ff.RetryAfterMs,
		"after_requests": ff.AfterRequests != 0,
		"after_tokens":   ff.AfterTokens != 0,
		"marker":         len(ff.Marker) > 0,
		"shape":          ff.Shape != "",
		"above_tokens":   ff.AboveTokens != 0,
		"delay":          ff.Delay != 0,
		"stall":          ff.Stall != 0,
		"after_chunks":   ff.AfterChunks != nil,
	}
	allowed := map[Kind][]string{
		KindRateLimit:   {"retry_after", "retry_after_ms"},
		KindUnavailable: {"retry_after", "retry_after_ms"},
		KindOverloaded:  {"retry_after", "retry_after_ms"},
		KindQuota:       {"after_requests", "after_tokens"},
		KindRefusal:     {"marker", "shape"},
		KindOverflow:    {"above_tokens"},
		KindSlow:        {"delay", "stall", "after_chunks"},
		KindStreamError: {"after_chunks"},
	}
	for field, used := range uses {
		if used && !slices.Contains(allowed[f.Kind], field) && slices.Contains(kinds, f.Kind) {
			return f, fmt.Errorf("%s: not a field of kind %s", field, f.Kind)
		}
	}
	if f.Kind == KindRefusal && f.Shape == "" {
		f.Shape = ShapeStop
	}
	if f.Kind == KindRefuse && ff.Probability != nil {
		return f, errors.New("refuse closes the port for every request: it takes no probability (use reset for a filtered outage)")
	}
	return f, f.check()
}

// check reports what makes a window unusable.
func (f *Fault) check() error {
	if !windowName.MatchString(f.Name) {
		return fmt.Errorf("name %q: give each window a name of letters, digits, '_', '-' or '.'", f.Name)
	}
	if !slices.Contains(kinds, f.Kind) {
		return fmt.Errorf("kind %q: not one of %v", f.Kind, kinds)
	}
	switch {
	case f.From < 0:
		return fmt.Errorf("from %v: must not be negative", f.From)
	case f.To <= f.From:
		return fmt.Errorf("to %v: must be after from %v", f.To, f.From)
	case !(f.Probability > 0 && f.Probability <= 1):
		return fmt.Errorf("probability %v: must be in (0, 1]", f.Probability)
	case f.RetryAfter < 0 || f.Delay < 0 || f.Stall < 0 || f.AfterRequests < 0 || f.AfterTokens < 0 || f.AboveTokens < 0 || f.AfterChunks < 0:
		return errors.New("durations and counts must not be negative")
	}
	for _, a := range f.APIs {
		if API(a) != OpenAI && API(a) != Anthropic {
			return fmt.Errorf("api %q: not %q or %q", a, OpenAI, Anthropic)
		}
	}
	switch f.Kind {
	case KindRefuse:
		if len(f.Providers)+len(f.APIs)+len(f.Models)+len(f.Keys) > 0 || f.Probability != 1 {
			return errors.New("refuse closes the port for every request: it takes no provider, api, model, key or probability (use reset for a filtered outage)")
		}
	case KindQuota:
		if f.AfterRequests == 0 && f.AfterTokens == 0 {
			return errors.New("quota needs after_requests or after_tokens")
		}
	case KindRefusal:
		if len(f.Markers) == 0 {
			return errors.New("refusal needs a marker")
		}
		if slices.Contains(f.Markers, "") {
			return errors.New("marker: an empty marker would refuse every prompt")
		}
		if f.Shape != "" && f.Shape != ShapeStop && f.Shape != ShapeError {
			return fmt.Errorf("shape %q: not %q or %q", f.Shape, ShapeStop, ShapeError)
		}
	case KindOverflow:
		if f.AboveTokens == 0 {
			return errors.New("overflow needs above_tokens")
		}
	case KindSlow:
		if f.Delay == 0 && f.Stall == 0 {
			return errors.New("slow needs a delay or a stall")
		}
	}
	return nil
}

// normalized returns a copy of tl with the defaults of a timeline built in
// Go filled in (a zero Answer.Text or Chunks, a zero To or Probability of a
// fault), checked as ParseTimeline checks a file.
func (tl *Timeline) normalized() (*Timeline, error) {
	out := *tl
	if out.Answer.Text == "" {
		out.Answer.Text = DefaultAnswerText
	}
	if out.Answer.Chunks == 0 {
		out.Answer.Chunks = DefaultChunks
	}
	switch {
	case out.Scale < 0 || math.IsNaN(out.Scale) || math.IsInf(out.Scale, 0):
		return nil, fmt.Errorf("chaos timeline: scale %v: must be positive", out.Scale)
	case out.Answer.Chunks < 1:
		return nil, fmt.Errorf("chaos timeline: answer.chunks %d: must be at least 1", out.Answer.Chunks)
	case out.Answer.Latency < 0:
		return nil, fmt.Errorf("chaos timeline: answer.latency %v: must not be negative", out.Answer.Latency)
	}
	out.Faults = slices.Clone(tl.Faults)
	seen := map[string]bool{}
	for i := range out.Faults {
		f := &out.Faults[i]
		if f.To == 0 {
			f.To = Forever
		}
		if f.Probability == 0 {
			f.Probability = 1
		}
		if err := f.check(); err != nil {
			return nil, fmt.Errorf("chaos timeline: fault %s: %w", f.Name, err)
		}
		if seen[f.Name] {
			return nil, fmt.Errorf("chaos timeline: fault %s: the name is used twice", f.Name)
		}
		seen[f.Name] = true
	}
	return &out, nil
}

// active reports whether the window is open at timeline time at.
func (f *Fault) active(at time.Duration) bool { return at >= f.From && at < f.To }

// Fault returns the window called name.
func (tl *Timeline) Fault(name string) (Fault, bool) {
	for _, f := range tl.Faults {
		if f.Name == name {
			return f, true
		}
	}
	return Fault{}, false
}

// End is when the last window that ends closes (or the last one opens, if
// later): how long a run must last to go through the whole timeline. It is
// 0 for a timeline without windows.
func (tl *Timeline) End() time.Duration {
	var end time.Duration
	for _, f := range tl.Faults {
		end = max(end, f.From)
		if f.To != Forever {
			end = max(end, f.To)
		}
	}
	return end
}
