package demo

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// demoRetryPolicy keeps the default rules but shrinks the numbers so the
// whole scenario takes seconds: a budget of 3 retries backing off from
// 400ms, an outage after 3 network failures, a recovery after 3 successes
// spanning 2s (the defaults: 10 retries from 1s; 3 failures; 3 successes
// over 2 minutes).
func demoRetryPolicy() *policy.Policy {
	p := policy.Default()
	p.Retry.MaxRetries = 3
	p.Retry.InitialDelay = 400 * time.Millisecond
	p.Retry.MaxDelay = 10 * time.Second
	p.Scope.OutageMinFailures = 3
	p.Scope.RecoveryMinSuccesses = 3
	p.Scope.RecoveryMinTime = 2 * time.Second
	return p
}

// retryScenario is retries and fault scope in `failbus demo`: a 429 retried exactly when the provider
// said, a 503 backing off until its budget is spent, and a provider outage
// that holds agents (wait_provider) until sustained successes recover it.
// It runs on a bus of its own with demoRetryPolicy, so it does not depend
// on the demo bus's policy.
var retryScenario = demoScenario{
	title: "Retries on the clock, and an outage that no retry can fix",
	about: "Causes that change with time are retried on the clock: as the provider said, else with backoff, within a\n" +
		"budget written down before each wait. A provider whose every credential fails at the network layer is\n" +
		"down: agents hold instead of burning retries or switching models, until it has recovered for a while.",
	run: func(ctx context.Context, d *demo) error { return runRetryScenario(ctx, d.printf) },
}

// Names in the retry scenario.
const (
	demoRetryAgent = "retry-agent"
	demoDownLLM    = "deepseek"
)

// runRetryScenario starts a bus with demoRetryPolicy, then drives one agent through
// the three stories, printing with printf. It fails when the bus decides
// anything but the rules say.
func runRetryScenario(ctx context.Context, printf func(string, ...any)) (err error) {
	pol := demoRetryPolicy()
	b, err := devbus.Start(devbus.Options{Server: embedded.Options{ServerName: "failbus-demo-retries"}, Policy: pol, Log: zerolog.Nop()})
	if err != nil {
		return err
	}
	defer func() {
		if serr := b.Stop(); serr != nil && err == nil {
			err = serr
		}
	}()
	nc, err := b.Srv.Connect(nats.Name("failbus demo retry agent"))
	if err != nil {
		return err
	}
	defer nc.Close()
	s := &retryDemo{printf: printf, pol: pol}
	if s.ag, err = agent.New(nc, demoRetryAgent); err != nil {
		return err
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.decisions, err = s.ag.Decisions(dctx); err != nil {
		return err
	}
	if s.due, err = s.ag.DueRetries(dctx); err != nil {
		return err
	}
	if s.health, err = startLog(dctx, b.JS, topology.StreamHealth, events.HealthPrefix+".>"); err != nil {
		return err
	}
	defer s.health.Stop()
	if s.notes, err = startLog(dctx, b.JS, topology.StreamNotify, events.NotifyPrefix+".>"); err != nil {
		return err
	}
	defer s.notes.Stop()
	r := pol.Retry
	printf("on a bus of its own whose policy has retry.max_retries %d, initial_delay %s, max_delay %s; an outage after",
		r.MaxRetries, r.InitialDelay, r.MaxDelay)
	printf("%d network failures on every profile, recovered after %d successes spanning %s.",
		pol.Scope.OutageMinFailures, pol.Scope.RecoveryMinSuccesses, pol.Scope.RecoveryMinTime)
	for _, part := range []func(context.Context) error{s.retryAfter, s.budget, s.outage} {
		if err := part(ctx); err != nil {
			return err
		}
	}
	return nil
}

// retryDemo is the state of one run of the scenario.
type retryDemo struct {
	printf    func(string, ...any)
	pol       *policy.Policy
	ag        *agent.Agent
	decisions <-chan events.Decision
	due       <-chan events.RetryDue
	health    *watch.Log[events.Message]
	notes     *watch.Log[events.Message]
	seenNotes int
	seq       int
}

// report sends one outcome and returns the bus's decision about it (none,
// for a success).
func (s *retryDemo) report(ctx context.Context, o *events.Outcome) (*events.Decision, error) {
	s.seq++
	o.ID = fmt.Sprintf("demo-retry-%02d", s.seq)
	if err := s.ag.Report(ctx, o); err != nil {
		return nil, err
	}
	s.printf("agent  turn %d step %d: %s", o.Turn, o.Step, describeOutcome(o))
	if o.OK {
		return nil, nil
	}
	wctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	for {
		select {
		case d, ok := <-s.decisions:
			if !ok {
				return nil, errors.New("the decisions channel closed")
			}
			if d.OutcomeID == o.ID {
				return &d, nil
			}
		case <-wctx.Done():
			return nil, fmt.Errorf("no decision about %s within %v", o.ID, demoWait)
		}
	}
}

// awaitDue waits for retryID to come due, prints it and reports it started.
func (s *retryDemo) awaitDue(ctx context.Context, d *events.Decision) error {
	wctx, cancel := context.WithTimeout(ctx, demoWait)
	defer cancel()
	for {
		select {
		case r, ok := <-s.due:
			if !ok {
				return errors.New("the due-retries channel closed")
			}
			if r.RetryID != d.RetryID {
				return fmt.Errorf("retry %s came due while waiting for %s", r.RetryID, d.RetryID)
			}
			now := time.Now()
			if now.Before(r.DueAt.Time) {
				return fmt.Errorf("retry %s arrived %v before its due time", r.RetryID, r.DueAt.Sub(now))
			}
			s.printf("due    retry %d arrived %s after the decision (due time + %s, JetStream's scheduler)",
				r.Retry, roundMS(now.Sub(d.At.Time)), roundMS(now.Sub(r.DueAt.Time)))
			if err := s.ag.Started(ctx, r.RetryID); err != nil {
				return err
			}
			return nil
		case <-wctx.Done():
			return fmt.Errorf("retry %s did not come due within %v", d.RetryID, demoWait)
		}
	}
}

func (s *retryDemo) printDecision(d *events.Decision) {
	switch d.Action {
	case events.ActionRetry:
		s.printf("bus    retry %d in %s, due %s; retry id %s (in the ledger before the wait)",
			d.Retry, time.Duration(d.DelayMS)*time.Millisecond, d.DueAt.Format("15:04:05.000"), d.RetryID)
		s.printf("       %s", d.Reason)
	default:
		s.printf("bus    %s: %s", d.Action, d.Reason)
	}
}

// retryAfter: a 429 whose Retry-After is taken exactly, without jitter.
func (s *retryDemo) retryAfter(ctx context.Context) error {
	s.printf("")
	s.printf("a) rate limited, and the provider says when: retry after exactly that, no jitter")
	o := &events.Outcome{
		Provider: "openai", Model: "gpt-4.1", Profile: "key-a", Turn: 1, Step: 1, Status: 429,
		Headers: map[string]string{"retry-after": "2"},
		Body:    `{"error":{"message":"Rate limit reached for gpt-4.1 on requests per min","type":"requests","code":"rate_limit_exceeded"}}`,
	}
	d, err := s.report(ctx, o)
	if err != nil {
		return err
	}
	s.printDecision(d)
	if d.Action != events.ActionRetry || d.DelayMS != 2000 {
		return fmt.Errorf("expected a retry after exactly 2s, got %s after %dms", d.Action, d.DelayMS)
	}
	if err := s.awaitDue(ctx, d); err != nil {
		return err
	}
	_, err = s.report(ctx, &events.Outcome{Provider: "openai", Model: "gpt-4.1", Profile: "key-a", Turn: 1, Step: 1, OK: true, Status: 200, Body: `{"choices":[{"message":{"content":"Done."}}]}`})
	return err
}

// budget: a 503 backs off exponentially, with jitter, until the budget of
// the step is spent.
func (s *retryDemo) budget(ctx context.Context) error {
	s.printf("")
	s.printf("b) the provider keeps failing (503): capped exponential backoff with symmetric jitter, until the step's")
	s.printf("   budget is spent; the count is read back from the ledger, so a crash neither refunds nor overspends it")
	var delays []string
	for attempt := 1; ; attempt++ {
		o := &events.Outcome{
			Provider: "anthropic", Model: "claude-sonnet-4", Profile: "key-b", Turn: 2, Step: 1, Status: 503,
			Body: `<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>`,
		}
		d, err := s.report(ctx, o)
		if err != nil {
			return err
		}
		s.printDecision(d)
		if d.Action == events.ActionGiveUp {
			if attempt != s.pol.Retry.MaxRetries+1 || !strings.Contains(d.Reason, "budget exhausted") {
				return fmt.Errorf("expected give_up for the exhausted budget after %d retries, got it after %d", s.pol.Retry.MaxRetries, attempt-1)
			}
			s.printf("       backoff %s, then the step gave up", strings.Join(delays, ", "))
			return nil
		}
		if d.Action != events.ActionRetry || d.Retry != attempt {
			return fmt.Errorf("expected retry %d, got %s %d", attempt, d.Action, d.Retry)
		}
		delays = append(delays, (time.Duration(d.DelayMS) * time.Millisecond).String())
		if err := s.awaitDue(ctx, d); err != nil {
			return err
		}
	}
}

// outage: every profile of a provider fails at the network layer.
func (s *retryDemo) outage(ctx context.Context) error {
	s.printf("")
	s.printf("c) %s stops answering on every credential: an outage, not a model or credential problem", demoDownLLM)
	netFail := func(turn int, model, profile string) *events.Outcome {
		return &events.Outcome{Provider: demoDownLLM, Model: model, Profile: profile, Turn: turn, Step: 1,
			TransportError: "dial tcp 104.18.26.90:443: connect: connection refused (ECONNREFUSED)"}
	}
	for i, profile := range []string{"key-1", "key-2", "key-1"} {
		d, err := s.report(ctx, netFail(10+i, "deepseek-chat", profile))
		if err != nil {
			return err
		}
		s.printDecision(d)
		if i < 2 && d.Action != events.ActionRetry {
			return fmt.Errorf("failure %d: expected retry, got %s", i+1, d.Action)
		}
		if i == 2 && d.Action != events.ActionWaitProvider {
			return fmt.Errorf("third network failure with every profile down: expected wait_provider, got %s", d.Action)
		}
	}
	if err := s.expectHealth(ctx, events.HealthOutage); err != nil {
		return err
	}
	if err := s.printNotes(ctx, 1); err != nil {
		return err
	}
	d, err := s.report(ctx, netFail(13, "deepseek-reasoner", "key-2"))
	if err != nil {
		return err
	}
	s.printDecision(d)
	if d.Action != events.ActionWaitProvider || d.RetryID != "" {
		return fmt.Errorf("another model during the outage: expected wait_provider and no retry, got %s", d.Action)
	}
	s.printf("       (another model, the same dead network path: no model switch, no retry scheduled, no budget spent)")

	// Recovery: never on one lucky call.
	step := s.pol.Scope.RecoveryMinTime / time.Duration(s.pol.Scope.RecoveryMinSuccesses-1)
	for i := range s.pol.Scope.RecoveryMinSuccesses {
		if i > 0 {
			if err := pause(ctx, step); err != nil {
				return err
			}
		}
		if _, err := s.report(ctx, &events.Outcome{Provider: demoDownLLM, Model: "deepseek-chat", Profile: "key-1", Turn: 20 + i, Step: 1,
			OK: true, Status: 200, Body: `{"choices":[{"message":{"content":"pong"}}]}`}); err != nil {
			return err
		}
		want := events.HealthDegraded
		if i == s.pol.Scope.RecoveryMinSuccesses-1 {
			want = events.HealthRecovered
		}
		if i == 0 || i == s.pol.Scope.RecoveryMinSuccesses-1 {
			if err := s.expectHealth(ctx, want); err != nil {
				return err
			}
		}
	}
	if err := s.printNotes(ctx, 1); err != nil {
		return err
	}
	d, err = s.report(ctx, netFail(30, "deepseek-chat", "key-2"))
	if err != nil {
		return err
	}
	s.printDecision(d)
	if d.Action != events.ActionRetry {
		return fmt.Errorf("a failure after the recovery: expected retry, got %s", d.Action)
	}
	return nil
}

// expectHealth waits for the provider's next health record and checks its
// state.
func (s *retryDemo) expectHealth(ctx context.Context, state string) error {
	m, _, err := await(ctx, s.health, 0, func(m events.Message) bool {
		h, ok := m.(*events.Health)
		return ok && h.Provider == demoDownLLM && h.State == state
	})
	if err != nil {
		return fmt.Errorf("no %s health record for %s: %w", state, demoDownLLM, err)
	}
	h := m.(*events.Health)
	s.printf("health %s %s: %s", events.HealthSubject(h.Provider), h.State, h.Reason)
	return nil
}

// printNotes waits for n more notification requests and prints them.
func (s *retryDemo) printNotes(ctx context.Context, n int) error {
	for range n {
		m, i, err := await(ctx, s.notes, s.seenNotes, func(events.Message) bool { return true })
		if err != nil {
			return fmt.Errorf("no notification request: %w", err)
		}
		s.seenNotes = i + 1
		note := m.(*events.Notification)
		s.printf("notify %s  %s", note.Severity, note.DedupeKey)
		s.printf("       %s", note.Title)
	}
	return nil
}
