package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nuid"

	"github.com/failbus/failbus/pkg/events"
)

// Defaults of a Request.
const (
	// defaultStallAfter ends an attempt that produced nothing (no answer,
	// no streamed chunk) for this long, and reports it as a timeout: a hung
	// stream becomes a decided, retried failure instead of a session
	// frozen for an hour.
	defaultStallAfter = 2 * time.Minute
	// defaultDecisionTimeout bounds the wait for the bus's decision on a
	// failed attempt; past it Call returns ErrNoDecision.
	defaultDecisionTimeout = 30 * time.Second
	// defaultResumeWindow spreads the Calls released by a provider's
	// recovery: each waits a random time up to it before calling again,
	// so a provider that just came back is not hit by every held call in
	// the same second.
	defaultResumeWindow = 10 * time.Second
	// defaultMaxAttempts bounds the attempts of one Call (the bus's retry
	// budget bounds retries; this bounds switches too).
	defaultMaxAttempts = 32
)

// ErrNoDecision: a failed attempt got no decision from the bus within
// Request.DecisionTimeout. No scheduler is running, or it is far behind
// (failbus lag says which).
var ErrNoDecision = errors.New("agent: no decision from the bus")

// ErrTooManyAttempts: a Call reached Request.MaxAttempts.
var ErrTooManyAttempts = errors.New("agent: too many attempts")

// ErrNoProvider: every provider of a segment is excluded by the refusal
// tiers now (each skipped, or frozen until a boundary).
var ErrNoProvider = errors.New("agent: every provider is excluded for this segment")

// errStalled is the cause of an attempt's context that produced nothing
// for StallAfter.
var errStalled = errors.New("stalled")

// Target is where an attempt goes: the provider, model and auth profile
// the call function uses.
type Target struct {
	Provider string
	Model    string
	Profile  string
}

// Request describes one logical LLM call run under the bus. Provider is
// required; the zero value of every other field is sensible.
type Request struct {
	// Provider, Model and Profile are the first attempt's target.
	Provider, Model, Profile string
	// Providers, when the call names Session, are the providers the
	// segment may go to, in order of preference (default: Provider alone):
	// before the first attempt the refusal tiers are asked, and a provider
	// they exclude for this segment is left out; before each later
	// attempt they are asked about its target. When every provider left
	// is excluded for an outage, the Call holds as for wait_provider.
	Providers []string
	// Session and Segment key the context segment (`<session>#<segment>`)
	// for the refusal tiers; Turn and Step key the retry budget. Set them:
	// without Turn and Step the bus counts retries per episode instead.
	Session       string
	Segment       int
	Turn, Step    int
	RequestTokens int
	// ContextWindow and MaxOutputTokens let the classifier check a claimed
	// context overflow against the real sizes.
	ContextWindow, MaxOutputTokens int
	// Origin says what work made the call (chat, cron, subagent, task).
	Origin *events.Origin

	// Describe reads the errors of the SDK the call function uses
	// (openaievidence.Describe, anthropicevidence.Describe); errors it does
	// not know, and *HTTPError, are read by Call itself.
	Describe Describer
	// OnChunk receives every chunk an attempt streams (Attempt.Emit),
	// tagged with its attempt; OnRestart is told before an attempt starts
	// when an earlier one streamed output and then failed: the stream
	// restarts, and Partial is what the failed attempt produced. Chunks of
	// two attempts are never passed on as one stream.
	OnChunk   func(Chunk)
	OnRestart func(Restart)

	// StallAfter ends an attempt silent for this long (no return, no
	// chunk) and reports it as a timeout. Defaults to 2 minutes.
	StallAfter time.Duration
	// DecisionTimeout bounds the wait for a decision. Defaults to
	// 30 seconds.
	DecisionTimeout time.Duration
	// ResumeWindow spreads the resumption after a wait_provider. Defaults
	// to 10 seconds; negative resumes at once.
	ResumeWindow time.Duration
	// MaxAttempts bounds the attempts. Defaults to 32.
	MaxAttempts int
}

// Chunk is one piece of an attempt's streamed output.
type Chunk struct {
	Attempt int
	Text    string
}

// Restart tells the caller that attempt Attempt starts over after Previous
// failed having streamed Partial.
type Restart struct {
	Attempt, Previous int
	Partial           string
	Reason            string
}

// Attempt is one attempt of a Call, handed to the call function.
type Attempt struct {
	Target
	// N is the attempt's number, from 1.
	N int
	// Probe is true for an attempt that answers the bus's probe of a
	// provider in an outage: its result only tells the bus whether the
	// provider is back.
	Probe bool

	req     *Request
	mu      sync.Mutex
	partial strings.Builder
	ev      *Evidence
	touch   chan struct{}
}

// Emit hands one chunk of streamed output to the caller (Request.OnChunk)
// and tells the stall watchdog the attempt is alive.
func (at *Attempt) Emit(text string) {
	at.mu.Lock()
	at.partial.WriteString(text)
	at.mu.Unlock()
	at.Touch()
	if at.req.OnChunk != nil {
		at.req.OnChunk(Chunk{Attempt: at.N, Text: text})
	}
}

// Touch tells the stall watchdog the attempt is alive without output (a
// keep-alive, a tool call in progress).
func (at *Attempt) Touch() {
	select {
	case at.touch <- struct{}{}:
	default:
	}
}

// Observe sets the attempt's evidence explicitly, for a call that returned
// no error but did not answer (a 200 whose stop reason is a refusal): the
// outcome is built from ev instead of from the returned error.
func (at *Attempt) Observe(ev Evidence) {
	at.mu.Lock()
	at.ev = &ev
	at.mu.Unlock()
}

func (at *Attempt) streamed() string {
	at.mu.Lock()
	defer at.mu.Unlock()
	return at.partial.String()
}

// Step is one attempt in a Call's trail: where it went, what the bus was
// told, and what it decided (nil for a success, or when no decision was
// waited for).
type Step struct {
	Target   Target
	Outcome  events.Outcome
	Decision *events.Decision
}

// Trail is every attempt of a Call, in order.
type Trail []Step

// DecisionError is a decision only the caller can carry out: rerender
// (quarantine or re-render the refused increment), skip_provider (the
// segment may not go to this provider now), compact, give_up. It carries
// the decision (class, rule, reason) and the outcome it is about.
type DecisionError struct {
	Decision events.Decision
	Outcome  events.Outcome
}

// Error implements error.
func (e *DecisionError) Error() string {
	d := e.Decision
	return fmt.Sprintf("failbus decided %s for outcome %s (%s, rule %s): %s", d.Action, d.OutcomeID, d.Class, d.Rule, d.Reason)
}

// Action is the decision's action.
func (e *DecisionError) Action() string { return e.Decision.Action }

// Call runs one logical LLM call to completion under the bus, as CONTRACT.md
// "What an agent does with each action" says: fn makes the real request at
// the attempt's target with whatever SDK, Call reports each attempt's
// outcome and carries out the bus's decision — retry when the bus's due
// retry arrives (a durable scheduled message, not a local timer), switch
// profile, model or provider, hold while the provider is down (answering
// the bus's probe with one real attempt, resuming spread over
// ResumeWindow), and return a *DecisionError for what only the caller can
// do. It returns fn's result and the trail of attempts. Every wait ends
// with ctx.
//
// fn must honour its context: Call cancels it when the attempt is silent
// for StallAfter, and returns without waiting for an fn that ignores it.
func Call[T any](ctx context.Context, a *Agent, req Request, fn func(context.Context, *Attempt) (T, error)) (_ T, trail Trail, callErr error) {
	var zero T
	if req.Provider == "" {
		return zero, nil, errors.New("agent: Call needs a provider")
	}
	req.defaults()
	ctx, span := a.startCall(ctx, &req) // one trace for the call (trace.go)
	defer func() { endCall(span, len(trail), callErr) }()
	if err := a.router.start(context.Background()); err != nil {
		return zero, nil, err
	}
	probe := func(ctx context.Context, t Target) Evidence {
		at := &Attempt{Target: t, Probe: true, req: &Request{}, touch: make(chan struct{}, 1)}
		_, ev, _ := runAttempt(ctx, at, fn, req.StallAfter, req.Describe)
		return ev
	}
	var (
		target     = Target{Provider: req.Provider, Model: req.Model, Profile: req.Profile}
		candidates = req.Providers
		last       *Attempt
		restart    string
	)
	for n := 1; ; n++ {
		if n > req.MaxAttempts {
			return zero, trail, fmt.Errorf("%w: %d (Request.MaxAttempts)", ErrTooManyAttempts, req.MaxAttempts)
		}
		// Before every attempt, not only the first: a retry that came
		// due after its provider went down must not reach it.
		if n > 1 {
			candidates = []string{target.Provider}
		}
		var err error
		if target, err = a.route(ctx, &req, target, candidates, probe); err != nil {
			return zero, trail, err
		}
		if last != nil && req.OnRestart != nil {
			if p := last.streamed(); p != "" {
				req.OnRestart(Restart{Attempt: n, Previous: last.N, Partial: p, Reason: restart})
			}
		}
		at := &Attempt{Target: target, N: n, req: &req, touch: make(chan struct{}, 1)}
		actx, aspan := startAttempt(ctx, at)
		res, ev, _ := runAttempt(actx, at, fn, req.StallAfter, req.Describe)
		if ctx.Err() != nil {
			aspan.End()
			return zero, trail, ctx.Err()
		}
		o := req.outcome(a, nuid.Next(), target, ev)
		endAttempt(aspan, o)
		if ev.OK {
			if err := a.Report(actx, o); err != nil {
				return res, trail, err
			}
			return res, append(trail, Step{Target: target, Outcome: *o}), nil
		}
		d, err := a.decide(actx, &req, o)
		decided(span, d)
		trail = append(trail, Step{Target: target, Outcome: *o, Decision: d})
		if err != nil {
			return zero, trail, err
		}
		last, restart = at, d.Action+": "+d.Reason
		switch d.Action {
		case events.ActionRetry:
			if err := a.awaitRetry(ctx, d); err != nil {
				return zero, trail, err
			}
			// A retry scheduled before its provider's outage was declared
			// comes due into it: hold instead of sending it there.
			if down, err := a.router.inOutage(ctx, target.Provider); err != nil {
				return zero, trail, err
			} else if down {
				if err := a.hold(ctx, &req, target, probe); err != nil {
					return zero, trail, err
				}
			}
		case events.ActionSwitchProfile:
			target.Profile = d.Profile
		case events.ActionSwitchModel:
			target.Model = d.Model
		case events.ActionSwitchProvider:
			target = Target{Provider: d.Provider, Model: d.Model, Profile: d.Profile}
		case events.ActionWaitProvider:
			if err := a.hold(ctx, &req, target, probe); err != nil {
				return zero, trail, err
			}
		default:
			return zero, trail, &DecisionError{Decision: *d, Outcome: *o}
		}
	}
}

func (r *Request) defaults() {
	if r.StallAfter <= 0 {
		r.StallAfter = defaultStallAfter
	}
	if r.DecisionTimeout <= 0 {
		r.DecisionTimeout = defaultDecisionTimeout
	}
	if r.ResumeWindow == 0 {
		r.ResumeWindow = defaultResumeWindow
	}
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = defaultMaxAttempts
	}
}

// runAttempt runs fn under the stall watchdog and reads its evidence.
func runAttempt[T any](ctx context.Context, at *Attempt, fn func(context.Context, *Attempt) (T, error), stall time.Duration, d Describer) (T, Evidence, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := fn(actx, at)
		done <- result{v, err}
	}()
	timer := time.NewTimer(stall)
	defer timer.Stop()
	var res result
wait:
	for {
		select {
		case res = <-done:
			break wait
		case <-at.touch:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(stall)
		case <-timer.C:
			cancel(errStalled)
			// fn should return at once; one that ignores its context is
			// left behind, its attempt reported as stalled.
			select {
			case res = <-done:
			case <-time.After(time.Second):
			}
			ev := Evidence{TransportError: fmt.Sprintf("timeout: no output for %v (stall_after); the attempt was ended", stall)}
			if p := at.streamed(); p != "" {
				// The provider answered and streamed: the stream stalled,
				// not the network path to it.
				ev.Status = http.StatusOK
				ev.TransportError = fmt.Sprintf("timeout: the stream stopped for %v after %d bytes (stall_after); the attempt was ended", stall, len(p))
			}
			return res.v, ev, nil
		case <-ctx.Done():
			return res.v, Evidence{}, ctx.Err()
		}
	}
	at.mu.Lock()
	ev := at.ev
	at.mu.Unlock()
	if ev != nil {
		return res.v, *ev, res.err
	}
	out := describe(res.err, d)
	if !out.OK && out.Status == 0 && at.streamed() != "" {
		out.Status = http.StatusOK // chunks flowed: the provider answered, then the stream broke
	}
	return res.v, out, res.err
}

// decide reports o and waits for the bus's decision on it.
func (a *Agent) decide(ctx context.Context, req *Request, o *events.Outcome) (*events.Decision, error) {
	ch := a.router.awaitDecision(o.ID)
	if err := a.Report(ctx, o); err != nil {
		a.router.forget(o.ID, "")
		return nil, err
	}
	t := time.NewTimer(req.DecisionTimeout)
	defer t.Stop()
	select {
	case d := <-ch:
		return &d, nil
	case <-t.C:
		a.router.forget(o.ID, "")
		return nil, fmt.Errorf("%w for outcome %s within %v: is a scheduler running, and caught up? (failbus lag)", ErrNoDecision, o.ID, req.DecisionTimeout)
	case <-ctx.Done():
		// The decision may be on its way: a retry decided now would stay
		// scheduled, so it is waited for a moment and cancelled.
		go a.cancelLate(ch, o.ID)
		return nil, ctx.Err()
	}
}

// lateDecisionWait is how long a Call cancelled while waiting for its
// decision still listens for it, to cancel a retry decided meanwhile.
const lateDecisionWait = 5 * time.Second

// cancelLate cancels the retry a decision that arrives on ch after its
// Call was cancelled scheduled.
func (a *Agent) cancelLate(ch <-chan events.Decision, outcomeID string) {
	t := time.NewTimer(lateDecisionWait)
	defer t.Stop()
	select {
	case d := <-ch:
		if d.Action == events.ActionRetry && d.RetryID != "" {
			ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
			defer cancel()
			if err := a.Cancel(ctx, d.RetryID); err != nil {
				a.opts.onError(fmt.Errorf("agent %s: cancel retry %s of a cancelled call: %w", a.name, d.RetryID, err))
			}
		}
	case <-t.C:
		a.router.forget(outcomeID, "")
	}
}

// awaitRetry waits for the due retry of d from the bus and marks it
// started. A cancelled wait cancels the retry (no started record).
func (a *Agent) awaitRetry(ctx context.Context, d *events.Decision) error {
	ch := a.router.awaitDue(d.RetryID)
	select {
	case <-ch:
	case <-ctx.Done():
		a.router.forget("", d.RetryID)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
		defer cancel()
		if err := a.Cancel(cctx, d.RetryID); err != nil {
			// The retry will still come due; the caller has gone.
			a.opts.onError(fmt.Errorf("agent %s: cancel retry %s of a cancelled call: %w", a.name, d.RetryID, err))
		}
		return ctx.Err()
	}
	return a.Started(ctx, d.RetryID)
}

// hold waits until target's provider is healthy again, answering the
// bus's probes of it with one real attempt each, then waits a random part
// of ResumeWindow.
func (a *Agent) hold(ctx context.Context, req *Request, target Target, probe func(context.Context, Target) Evidence) error {
	probes, release := a.router.hold(target.Provider)
	defer release()
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	healthy := make(chan error, 1)
	go func() {
		_, err := a.router.waitHealthy(hctx, target.Provider)
		healthy <- err
	}()
	for {
		select {
		case err := <-healthy:
			if err != nil {
				return err
			}
			return sleep(ctx, spread(req.ResumeWindow))
		case c := <-probes:
			o := req.outcome(a, "probe-"+nuid.Next(), target, probe(ctx, target))
			o.Origin = &events.Origin{Kind: "probe", Name: c.RecoveryID}
			if err := a.Report(ctx, o); err != nil {
				a.opts.onError(fmt.Errorf("agent %s: report the probe of %s: %w", a.name, target.Provider, err))
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func spread(window time.Duration) time.Duration {
	if window <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(window)))
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// route asks the refusal tiers which of candidates may receive the
// request's segment now and returns target on the first allowed one; a
// request without a session is not routed. When the only providers left
// are excluded for an outage (not for a refusal), it holds on the first
// of them as for wait_provider — answering the bus's probes with probe,
// nothing else reaching it — and asks again once it recovered.
func (a *Agent) route(ctx context.Context, req *Request, target Target, candidates []string, probe func(context.Context, Target) Evidence) (Target, error) {
	if req.Session == "" {
		return target, nil
	}
	if len(candidates) == 0 {
		candidates = []string{target.Provider}
	}
	for {
		res, err := a.Route(ctx, req.Session, req.Segment, candidates)
		if err != nil {
			return target, err
		}
		if len(res.Allowed) > 0 {
			if res.Allowed[0] != target.Provider {
				target = Target{Provider: res.Allowed[0]}
			}
			return target, nil
		}
		down := ""
		for _, s := range res.Skipped {
			// A refusal's skip says when the provider may be tried again
			// or that it is frozen; an outage's says neither.
			if s.NextProbeAt == nil && !s.Frozen {
				down = s.Provider
				break
			}
		}
		if down == "" {
			return target, fmt.Errorf("%w: %s of %s: %v", ErrNoProvider, events.SegmentKey(req.Session, req.Segment), a.name, res.Skipped)
		}
		held := target
		if down != target.Provider {
			held = Target{Provider: down}
		}
		began := time.Now()
		if err := a.hold(ctx, req, held, probe); err != nil {
			return target, err
		}
		// The health said recovered before the refusal tiers' view of the
		// provider did: ask again after a moment, not in a loop.
		if wait := minRouteAgain - time.Since(began); wait > 0 {
			if err := sleep(ctx, wait); err != nil {
				return target, err
			}
		}
	}
}

// minRouteAgain is the least time between two route requests of a Call
// that holds on a provider the refusal tiers still see down.
const minRouteAgain = 250 * time.Millisecond
