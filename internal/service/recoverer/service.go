// Package recoverer is the recovery service (docs/CONTRACT.md §
// "Recovery"): the pure core of internal/policy/recovery on the bus. Its
// consumers feed the core, a driver advances it:
//
//   - `recovery` reads FAILBUS_HEALTH: outages and recoveries open and close
//     a provider's episodes (one at a time, in order).
//   - `recovery-heartbeats` (FAILBUS_LIVENESS) and `recovery-reports`
//     (FAILBUS_REPORTS: cron specs, cron runs, writes) keep what the
//     checklist reads. Who uses and holds on a provider (the probe
//     targets) is read from FAILBUS_OUTCOMES and FAILBUS_DECISIONS when a
//     probe is due (usage.go).
//   - `recovery-tasks` reads FAILBUS_TASKS one task at a time (max ack
//     pending 1, across replicas), dispatching it at once or holding it;
//     held tasks stay in the stream.
//   - The driver watches the provider records in KV FAILBUS_RECOVERY and
//     calls Core.Advance when one is due: probes while down, the checklist
//     and the release once recovered. A lease in the record keeps one
//     replica driving a provider; the others take over when it lapses.
//
// Every message it sends carries a deterministic Nats-Msg-Id and a ledger
// entry (see internal/policy/recovery): replicas, redeliveries and SIGKILL at any
// point repeat nothing and skip nothing. Input it cannot use goes to
// failbus.dlq.<consumer name> with the reason.
package recoverer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/limitstore"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/internal/policy/limits"
	"github.com/failbus/failbus/internal/policy/recovery"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// Names of the service and its runners: each labels metrics and logs and
// names its dead-letter subject (failbus.dlq.<name>).
const (
	Name          = topology.ConsumerRecovery
	HeartbeatName = topology.ConsumerRecoveryHeartbeats
	ReportName    = topology.ConsumerRecoveryReports
	TaskName      = topology.ConsumerRecoveryTasks
)

// Defaults of Options and of cmd/recovery.
const (
	// DefaultOpsAddr is where cmd/recovery serves /metrics and /healthz.
	DefaultOpsAddr = "127.0.0.1:9406"
	// DefaultMaxFutureSkew bounds how far an agent's `at` may lie ahead of
	// the time the bus stored its record before the bus's time is used:
	// a fast clock must not make a dead subagent look alive.
	DefaultMaxFutureSkew = time.Minute
	// DefaultResync is how often the driver looks at every provider even
	// when no record changed (a lapsed lease of a dead replica).
	DefaultResync = 2 * time.Second
	// DefaultPublishTimeout bounds one publish.
	DefaultPublishTimeout = 10 * time.Second
)

// Options configure the service.
type Options struct {
	// Policy is the `recovery:` policy section. Zero fields take their
	// defaults.
	Policy recovery.Config

	// Limits is the `limits:` policy section: each agent's share of the
	// providers, subagents, crons and tasks recovery keeps state for. Zero
	// fields take their defaults.
	Limits limits.Config

	// Runner holds the consumer runner settings shared by the four
	// runners: Logger, Registerer, FetchWait, DrainTimeout, Backoff,
	// MaxDeliver. Service, Stream, Consumer, ConsumerConfig, Decode and
	// Concurrency are set here and must be left empty.
	Runner consumer.Config

	// Owner names this replica in the provider records' lease. Defaults to
	// a new unique id.
	Owner string
	// LeaseTTL is how long this replica keeps driving a provider after its
	// last step; a replica that died is replaced after it. Defaults to 5s.
	LeaseTTL time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// MaxFutureSkew: see DefaultMaxFutureSkew (the default).
	MaxFutureSkew time.Duration
	// HTTPClient runs the policy's HTTP probes. Defaults to a client
	// without timeout (each probe has its own).
	HTTPClient *http.Client
	// Getenv reads the environment variables HTTP probe headers name.
	// Defaults to os.Getenv.
	Getenv func(string) string
	// CrashAt, when set, is called at the core's crash points (see
	// recovery.Options.Hook). A fault-injection hook for tests, which kill
	// the process there; production leaves it nil.
	CrashAt func(point, what string)
}

// Service is the recovery service: four consumer runners and the driver.
// Create it with New, start it with Run.
type Service struct {
	js      jetstream.JetStream
	core    *recovery.Core
	store   *Store
	opts    Options
	log     zerolog.Logger
	m       *metrics
	prober  *httpProber
	runners []*consumer.Runner

	// providers, taskLimits and notify keep each agent within its share
	// (policy limits); the store keeps subagents and crons within theirs.
	providers  *limitstore.Providers
	taskLimits *limitstore.Tasks
	notify     *limitstore.Notifier

	wake chan struct{}

	mu       sync.Mutex
	due      map[string]time.Time // provider → when Advance is next due
	state    error
	driveErr error
}

var errNotStarted = errors.New("recovery: not running")

// New binds the buckets and streams and prepares the service; apply the
// topology first.
func New(ctx context.Context, js jetstream.JetStream, opts Options) (*Service, error) {
	rc := opts.Runner
	if rc.Service != "" || rc.Stream != "" || rc.Consumer != "" || rc.ConsumerConfig != nil || rc.Decode || rc.Concurrency != 0 {
		return nil, fmt.Errorf("%w: recovery sets Service, Stream, Consumer, ConsumerConfig, Decode and Concurrency itself", consumer.ErrInvalidConfig)
	}
	if opts.Owner == "" {
		opts.Owner = nuid.Next()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxFutureSkew <= 0 {
		opts.MaxFutureSkew = DefaultMaxFutureSkew
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{}
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if rc.Registerer == nil {
		rc.Registerer = prometheus.NewRegistry()
		opts.Runner.Registerer = rc.Registerer
	}
	m, err := newMetrics(rc.Registerer)
	if err != nil {
		return nil, err
	}
	st, err := OpenStore(ctx, js)
	if err != nil {
		return nil, err
	}
	lim := opts.Limits.WithDefaults()
	st.limit(lim)
	s := &Service{
		js: js, store: st, opts: opts, m: m,
		providers:  limitstore.NewProviders(js, lim, nil),
		taskLimits: limitstore.NewTasks(js, lim, 0),
		notify:     limitstore.NewNotifier(js, Name, nil),
		log:        rc.Logger.With().Str("service", Name).Logger(),
		wake:       make(chan struct{}, 1),
		due:        map[string]time.Time{},
		state:      errNotStarted,
	}
	cfg := opts.Policy.WithDefaults()
	pub := &publisher{js: js, timeout: DefaultPublishTimeout}
	pub.sent = s.sent
	if len(cfg.Probes) > 0 {
		s.prober = &httpProber{
			probes: cfg.Probes, client: opts.HTTPClient, getenv: opts.Getenv, now: opts.Now, log: s.log,
			publish: s.publishOutcome, result: m.httpProbe,
		}
		pub.probe = s.prober
	}
	dup := topology.DefaultDuplicateWindow
	if info, err := js.Stream(ctx, topology.StreamDispatch); err == nil {
		dup = info.CachedInfo().Config.Duplicates
	}
	s.core, err = recovery.New(cfg, st, pub, recovery.Options{
		Owner: opts.Owner, LeaseTTL: opts.LeaseTTL, DedupeWindow: dup, Hook: opts.CrashAt,
		UsageError: func(provider string, err error) {
			m.usageErrors.Inc()
			s.log.Warn().Err(err).Str("provider", provider).Msg("probe targets unreadable: probing an agent that reported itself, or none")
		},
	})
	if err != nil {
		return nil, err
	}
	for _, r := range []struct {
		name        string
		concurrency int
		handle      consumer.Handler
	}{
		{Name, 1, s.handleHealth},
		{HeartbeatName, 4, s.handleHeartbeat},
		{ReportName, 1, s.handleReport},
		{TaskName, 1, s.handleTask},
	} {
		c := rc
		c.Service, c.Consumer, c.Concurrency = r.name, r.name, r.concurrency
		run, err := consumer.New(js, c, r.handle)
		if err != nil {
			return nil, err
		}
		s.runners = append(s.runners, run)
	}
	return s, nil
}

// sent counts and logs a message the core got stored: one line per step
// record and command at info, per dispatch at debug.
func (s *Service) sent(msg events.Message, duplicate bool) {
	kind := kindOf(msg)
	s.m.sentTotal.WithLabelValues(kind, fmt.Sprint(duplicate)).Inc()
	if duplicate {
		return
	}
	switch v := msg.(type) {
	case *events.Recovery:
		if v.Done {
			s.m.runs.WithLabelValues(s.m.providers.Use(v.Provider)).Inc()
		}
		s.log.Info().Str("provider", v.Provider).Str("recovery_id", v.RecoveryID).Str("step", v.Step).Bool("done", v.Done).
			Int("subagents", len(v.Subagents)).Int("killed", len(v.Killed)).Int("crons_rerun", len(v.CronsRerun)).
			Int("crons_missed", len(v.CronsMissed)).Int("writes", len(v.Writes)).Int("redispatched", len(v.Redispatched)).
			Int("released", v.Released).Msg("checklist step recorded")
	case *events.Control:
		s.log.Info().Str("agent", v.Agent).Str("action", v.Action).Str("recovery_id", v.RecoveryID).
			Str("subagent", v.Subagent).Str("cron", v.Cron).Str("key", v.Key).Str("provider", v.Provider).Msg("control sent")
	case *events.Dispatch:
		s.log.Debug().Str("agent", v.Agent).Str("task_id", v.TaskID).Int("attempt", v.Attempt).Msg("task dispatched")
	case *events.Notification:
		s.log.Info().Str("dedupe_key", v.DedupeKey).Msg("recovery notification requested")
	}
}

// Core is the decision core the service runs (tests, tools).
func (s *Service) Core() *recovery.Core { return s.core }

// Store is the bus store the core runs on (tests, tools).
func (s *Service) Store() *Store { return s.store }

// Healthy reports nil while every runner consumes and the driver works.
func (s *Service) Healthy() error {
	s.mu.Lock()
	state, derr := s.state, s.driveErr
	s.mu.Unlock()
	if state != nil {
		return state
	}
	checks := []func() error{}
	for _, r := range s.runners {
		checks = append(checks, r.Healthy)
	}
	if err := ops.AllHealthy(checks...)(); err != nil {
		return err
	}
	if derr != nil {
		return fmt.Errorf("recovery driver: %w", derr)
	}
	return nil
}

// Run consumes and drives until ctx ends, then drains and returns nil.
func (s *Service) Run(ctx context.Context) error {
	s.mu.Lock()
	s.state = nil
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.state = consumer.ErrStopped
		s.mu.Unlock()
	}()
	parts := make([]ops.Runnable, 0, len(s.runners)+1)
	for _, r := range s.runners {
		parts = append(parts, r)
	}
	parts = append(parts, runnable{name: "recovery-driver", run: s.drive})
	err := ops.RunAll(ctx, parts...)
	if s.prober != nil {
		s.prober.wait()
	}
	return err
}

type runnable struct {
	name string
	run  func(context.Context) error
}

func (r runnable) Run(ctx context.Context) error { return r.run(ctx) }
func (r runnable) Service() string               { return r.name }

// nudge wakes the driver.
func (s *Service) nudge() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// invalidOrErr turns the core's verdict on an input into the runner's: a
// record the core refuses, or one past its agent's limits, is a dead
// letter (the latter with one notification a day).
func (s *Service) invalidOrErr(ctx context.Context, err error) error {
	var ex *limits.Exceeded
	switch {
	case errors.As(err, &ex):
		s.m.refused.WithLabelValues(Name, ex.Limit).Inc()
		if nerr := s.notify.Tell(ctx, ex); nerr != nil {
			s.log.Warn().Err(nerr).Msg("limit notification not requested; asked again at the next refusal")
		}
		return consumer.DeadLetter(err.Error())
	case errors.Is(err, recovery.ErrInvalid):
		return consumer.DeadLetter(err.Error())
	}
	return err
}

// admit checks a record's provider against its agent's share.
func (s *Service) admit(ctx context.Context, agent, provider string) error {
	return s.invalidOrErr(ctx, s.providers.Admit(ctx, agent, provider))
}

// at bounds an agent's time by when the bus stored the record.
func (s *Service) at(t events.Time, stored time.Time) events.Time {
	if t.IsZero() || (!stored.IsZero() && t.After(stored.Add(s.opts.MaxFutureSkew))) {
		return events.At(stored)
	}
	return t
}

func (s *Service) handleHealth(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
	h, err := events.DecodeAs[*events.Health](m.Subject, m.Header, m.Data)
	if err != nil {
		return consumer.DeadLetter("decode: " + err.Error())
	}
	if h.At.IsZero() {
		h.At = events.At(m.Timestamp)
	}
	if err := s.core.Step(ctx, recovery.Input{Health: h}, s.opts.Now()); err != nil {
		return s.invalidOrErr(ctx, err)
	}
	s.log.Info().Str("provider", h.Provider).Str("state", h.State).Time("at", h.At.Time).Msg("provider health")
	s.nudge()
	return nil
}

func (s *Service) handleHeartbeat(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
	h, err := events.DecodeAs[*events.Heartbeat](m.Subject, m.Header, m.Data)
	if err != nil {
		return consumer.DeadLetter("decode: " + err.Error())
	}
	h.At = s.at(h.At, m.Timestamp)
	if err := s.admit(ctx, h.Agent, h.Provider); err != nil {
		return err
	}
	return s.invalidOrErr(ctx, s.core.Step(ctx, recovery.Input{Heartbeat: h}, s.opts.Now()))
}

func (s *Service) handleReport(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
	var (
		in       recovery.Input
		rec      events.Message
		provider string
	)
	switch {
	case strings.HasPrefix(m.Subject, events.CronSpecPrefix+"."):
		c, err := events.DecodeAs[*events.CronSpec](m.Subject, m.Header, m.Data)
		if err != nil {
			return consumer.DeadLetter("decode: " + err.Error())
		}
		c.At = s.at(c.At, m.Timestamp)
		in.CronSpec, rec, provider = c, c, c.Provider
	case strings.HasPrefix(m.Subject, events.CronRunPrefix+"."):
		r, err := events.DecodeAs[*events.CronRun](m.Subject, m.Header, m.Data)
		if err != nil {
			return consumer.DeadLetter("decode: " + err.Error())
		}
		r.At = s.at(r.At, m.Timestamp)
		in.CronRun, rec, provider = r, r, r.Provider
	case strings.HasPrefix(m.Subject, events.WritePrefix+"."):
		w, err := events.DecodeAs[*events.Write](m.Subject, m.Header, m.Data)
		if err != nil {
			return consumer.DeadLetter("decode: " + err.Error())
		}
		w.At = s.at(w.At, m.Timestamp)
		in.Write, rec, provider = w, w, w.Provider
	default:
		return consumer.DeadLetterf("subject %s carries no recovery record (want failbus.cron.spec|run.<agent> or failbus.write.<agent>)", m.Subject)
	}
	if a, ok := rec.(events.AgentRecord); ok {
		if err := s.admit(ctx, a.RecordAgent(), provider); err != nil {
			return err
		}
	}
	return s.invalidOrErr(ctx, s.core.Step(ctx, in, s.opts.Now()))
}

func (s *Service) handleTask(ctx context.Context, m *consumer.Msg, _ *consumer.Outputs) error {
	t, err := TaskFromMsg(m.Subject, m.Header, m.Data)
	if err != nil {
		return consumer.DeadLetter("decode: " + err.Error())
	}
	t.At = s.at(t.At, m.Timestamp)
	err = s.providers.Admit(ctx, t.Agent, t.Provider)
	if err == nil {
		err = s.taskLimits.Admit(ctx, t.Agent, t.ID, m.Seq, len(m.Data), m.Timestamp)
	}
	if err != nil {
		return s.refuseTask(ctx, m, err)
	}
	if err := s.core.Step(ctx, recovery.Input{Task: t, TaskSeq: m.Seq, TaskStoredAt: m.Timestamp}, s.opts.Now()); err != nil {
		return s.invalidOrErr(ctx, err)
	}
	s.nudge()
	return nil
}

// refuseTask answers a task past its agent's limits: dead-lettered first
// (consumer.Quarantine, under the id the runner gives this input's dead
// letter, so the runner's own finds it stored), then removed from
// FAILBUS_TASKS, whose bytes are the share it was refused; the runner then
// acknowledges it. Any other error is the runner's to retry.
func (s *Service) refuseTask(ctx context.Context, m *consumer.Msg, err error) error {
	var ex *limits.Exceeded
	if !errors.As(err, &ex) {
		return err
	}
	if qerr := consumer.Quarantine(ctx, s.js, TaskName, m, err.Error()); qerr != nil {
		return qerr
	}
	if derr := s.store.tasks.DeleteMsg(ctx, m.Seq); derr != nil && !errors.Is(derr, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("remove refused task %d from %s: %w", m.Seq, m.Stream, derr)
	}
	return s.invalidOrErr(ctx, err)
}

// publishOutcome publishes a built-in probe's outcome like an agent does.
func (s *Service) publishOutcome(ctx context.Context, o *events.Outcome) error {
	data, hdr, err := events.Encode(o)
	if err != nil {
		return err
	}
	hdr.Set(events.HeaderMsgID, o.ID)
	pctx, cancel := context.WithTimeout(ctx, DefaultPublishTimeout)
	defer cancel()
	_, err = s.js.PublishMsg(pctx, natsMsg(events.OutcomeSubject(o.Provider, o.Agent), hdr, data))
	return err
}
