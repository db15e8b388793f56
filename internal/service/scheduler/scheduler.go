// Package scheduler is the durable retry scheduler: an
// adapter around two stages of the decision engine (internal/engine: Observe,
// the fault scope; Decide, the retry chain — the very stages `failbus
// simulate` chains) whose state it keeps where a crash cannot lose it, and
// whose effects it performs on JetStream.
//
// Classifications in (the topology's `scheduler` consumer on
// failbus.classified.>), each observed and decided at the replica's clock,
// the latest outcome `at` it has seen (as far as the bus believes it:
// events.EventTime), as simulate does on its virtual clock. For each one, in this order:
//
//  1. Fault scope: engine.Fold folds the classification into the
//     provider's record, which the provider's lane holds in memory and
//     writes to KV bucket FAILBUS_SCOPE with compare-and-set, so every
//     replica shares one view of each provider (lanes.go). The verdict is
//     known at the fold; the write that stores it comes within
//     Config.ScopeLinger, shared by the folds since the last one, and the
//     input is acknowledged only once it is stored. The health changes
//     and notification requests a fold causes are stored in the same
//     record (an outbox with a message id per transition), written at
//     once, published on failbus.health.<provider> and
//     failbus.notify.<severity>, and cleared; the classification that
//     caused them is decided only then. A process that dies between the
//     write and the publish loses nothing: the provider's next write
//     publishes them again under the same ids. Folding is idempotent per
//     outcome, so a redelivery counts nothing twice. Successes (class ok)
//     and content refusals stop here: refusals are decided by the refusal
//     tiers (internal/service/refusals), never twice.
//  2. engine.Decide reads the budget's ledger back (the last message on
//     events.RetryLedgerSubject(budget token) in FAILBUS_RETRIES, a
//     LedgerEntry) and decides with retry.Decide. The reads of handlers
//     running at the same time go to the server together, one multi_last
//     per batch (streamread.LastReader, counted in
//     failbus_scheduler_ledger_reads_total{how}). On a replicated
//     FAILBUS_RETRIES a decision that appends nothing, which no
//     compare-and-set checks, is made again from the stream leader's
//     reads before it is carried out (current.go).
//  3. A retry is persisted BEFORE it is scheduled: Decide appends the
//     LedgerEntry with compare-and-set on the subject's last sequence
//     (Nats-Expected-Last-Subject-Sequence), so two deliveries or replicas
//     racing on one budget never both spend the same retry.
//  4. The due message is scheduled with JetStream's own message scheduler: a
//     publish on events.RetryScheduleSubject(agent, retry id) with
//     `Nats-Schedule: @at <RFC3339Nano>` (full precision; nats.go's
//     WithScheduleAt drops the fraction of a second), `Nats-Schedule-Target:
//     failbus.retry.due.<agent>` and `Nats-TTL: never`, so the stream's
//     MaxAge can never remove a schedule before it fires. The payload is the
//     events.RetryDue the agent receives.
//  5. The decision goes out on failbus.decision.<agent>, then the input is
//     acknowledged. The schedule and the decision are sent back to back
//     as async publishes and waited for together (one round trip for
//     both); a schedule that failed while its decision was stored is
//     restored by the redelivery's replay, under the same ids.
//
// Every publish carries a Nats-Msg-Id derived from the retry id
// ("scheduler:<retry id>:ledger|schedule|decision") or, for decisions that
// are not retries, from the input ("scheduler:<input id>:decision"), and a
// redelivered classification whose outcome already has a ledger record is
// replayed from that record (same retry id, delay and due time, nothing
// spent again): the schedule is restored only if it is neither pending nor
// already fired nor cancelled, which the scheduler checks on the stream
// itself (a fired message carries `Nats-Scheduler: <schedule subject>`), so
// a crash between any two steps neither loses nor doubles a retry, however
// late the redelivery.
//
// Agents' started and cancel records in (the `scheduler-control` consumer on
// failbus.retry.started.> and failbus.retry.cancel.>, payload
// retrymark.Mark): the first of the two for the budget's latest retry is
// marked in the ledger; a cancel then purges the schedule subject, so no due
// message arrives; a started after a cancel (or a cancel after a start) is
// ignored. A cancelled retry still counts against its budget: its record was
// written before the wait began (persist, then wait), so cancelling cannot refund it.
//
// Policy: two layers. The base is the policy file Config.PolicyFile (the
// --policy file), read at start and polled every PolicyPollInterval for
// changes (mtime, size and identity first, then a content hash, so a touch
// or an identical rewrite reloads nothing; a change counts once two
// consecutive looks agree, so a half-written file is never applied; rename
// a finished file over it to change it), or Config.Policy (the default
// policy when nil) when there is no file. The YAML under key PolicyKVKey of
// KV bucket FAILBUS_POLICY overrides the base while that key exists,
// reloaded whenever it changes (a KV watch); when the key is deleted, the
// file's current content applies again. Each change of either layer is
// recorded on failbus.audit.scheduler.policy (a PolicyAudit). An invalid or
// unreadable file or KV value is logged, counted and audited as rejected,
// and the last good policy stays in force: a bad edit never stops the
// scheduler. A change of any behavioural retry field is a new policy key,
// hence new budgets.
//
// Fault-scope state lives in FAILBUS_SCOPE, one key per provider, shared by
// every replica and kept across restarts. At start, outages that
// FAILBUS_HEALTH left open for providers the bucket does not know are seeded
// into it. The clock is the classifications' `at` (the outcome's time, as in
// simulate): the latest seen by the replica, so a late classification is
// handled at it as simulate handles a late line; never running backwards
// per provider (the record keeps its own); never ahead of the time the
// stream stored the classification (events.EventTime).
//
// What is not guaranteed: a decision that is not a retry, a health record
// and a notification request are deduplicated by the streams' duplicate
// window (10 minutes) only, as for every service; in particular a process
// that dies after publishing a transition's records and before clearing its
// outbox has them published again by the provider's next writer, stored a
// second time if that comes more than the window later. Several scheduler
// replicas are safe for the ledger, the schedules (compare-and-set, and the
// checks above) and the fault scope (compare-and-set on each provider's
// record: a write that finds another replica's is folded again on top of
// it, nothing lost). A replica's verdicts see another's folds of the same
// provider once written, so up to a linger late: a failure that, with
// the other replica's, declares an outage may still be decided as a
// retry, and the write after them declares it. A cancel that races the
// due time may come too late: the due message may already be stored.
package scheduler

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/ops"
	"github.com/failbus/failbus/internal/prom"
	"github.com/failbus/failbus/internal/scopestore"
	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/policy"
)

// Names of the service. Name labels metrics and logs, names the
// dead-letter subject failbus.dlq.scheduler and prefixes the Nats-Msg-Id of
// what it publishes; ControlName does the same for started and cancel
// records.
const (
	Name        = "scheduler"
	ControlName = "scheduler-control"
)

// Defaults of Config and of cmd/scheduler.
const (
	// DefaultOpsAddr is where cmd/scheduler serves /metrics and /healthz
	// (the classifier uses 9401).
	DefaultOpsAddr = "127.0.0.1:9402"
	// DefaultConcurrency is how many classifications are handled at once:
	// the runner's workers; one session's classifications of a provider
	// (BudgetLane) one at a time and in order, the others in parallel.
	// Each failure waits on JetStream round trips (the ledger write of a
	// retry, its schedule and decision; the fault-scope write only when
	// its fold changes the provider's health, lanes.go), so the
	// scheduler is bound by latency as much as CPU: `failbus bench` on 2
	// cores measured the whole bus caught up at 2.0k outcomes/s with 4,
	// 2.3k with 8 and 2.9k with 16 before the pipelined runner.
	DefaultConcurrency = 64
	// DefaultMaxInFlight is the classifications' runner's window
	// (consumer.Config.MaxInFlight) unless Config.Runner sets one; the
	// consumer's max_ack_pending (1000 in the topology) bounds it. An
	// input is acknowledged only once the fault-scope write holding its
	// fold is stored, up to ScopeLinger after it is handled, so the
	// window must hold what arrives in a linger: with the runner's
	// default of 256 and a 20ms linger, the scheduler took at most about
	// 256 per 21ms (12k/s) whatever the CPU left it.
	DefaultMaxInFlight = 4096
	// DefaultScopeLinger is Config.ScopeLinger's default: at 2k
	// outcomes/s over 5 providers, about eight classifications to a
	// fault-scope write.
	DefaultScopeLinger = 20 * time.Millisecond
	// MaxScopeLinger bounds Config.ScopeLinger in a deployment
	// (`failbus scheduler` refuses it or more): a classification is
	// acknowledged once the write holding its fold is stored, and the
	// runner hands back an input still waiting consumer.SettleTimeout
	// after its handler returned, so a linger near that would hand back
	// every input it holds. Config itself takes any (tests linger for
	// an hour to mean never).
	MaxScopeLinger = consumer.SettleTimeout / 2
	// PolicyKVKey is the key of the active policy (YAML, the --policy file
	// format) in KV bucket FAILBUS_POLICY.
	PolicyKVKey = "active"
	// DefaultMaxProviders is Config.MaxProviders' default: far more
	// providers than a deployment uses, far fewer than a buggy or hostile
	// agent can name.
	DefaultMaxProviders = prom.DefaultMaxLabelValues
	// DefaultPolicyPollInterval is how often Config.PolicyFile is checked
	// for changes: a stat each time, a read only when the stat changed (or
	// the file was written so recently that a same-size rewrite could share
	// its modification time). A change is acted on when two consecutive
	// looks agree, so it is in force within two intervals (4s).
	DefaultPolicyPollInterval = 2 * time.Second
)

// Crash points: where Config.CrashAt is called, between the durable steps
// of a retry (tests kill the process there).
const (
	// CrashAfterScope: the provider's fault scope is stored with the
	// records its change produced in its outbox; none is published.
	CrashAfterScope = "after-scope"
	// CrashAfterLedger: the ledger entry is stored, the schedule is not.
	CrashAfterLedger = "after-ledger"
	// CrashAfterSchedule: the schedule is stored, the decision is not.
	CrashAfterSchedule = "after-schedule"
	// CrashAfterDecision: the decision is stored, the input not
	// acknowledged.
	CrashAfterDecision = "after-decision"
	// CrashAfterCancelMark: a cancel is marked in the ledger, the schedule
	// not purged yet.
	CrashAfterCancelMark = "after-cancel-mark"
)

// maxLedgerAttempts bounds compare-and-set retries on one budget within one
// delivery; beyond it the input is redelivered with the runner's backoff.
const maxLedgerAttempts = 32

// Config configure the scheduler. The zero value runs the default policy,
// without watching KV or a file.
type Config struct {
	// Policy is the policy used while KV holds none and there is no
	// PolicyFile (or, with one, until the file is first read: see
	// PolicyFile). Defaults to policy.Default().
	Policy *policy.Policy

	// PolicyFile is the path of the policy file (the --policy flag), "" for
	// none. Run reads it before consuming and then polls it every
	// PolicyPollInterval: its current valid content is the policy used
	// while KV holds none, replacing Policy. When it cannot be read or is
	// not a valid policy, the last good policy stays in force (at start:
	// Policy, which must then be set, else Run fails), and the problem is
	// logged, counted (failbus_scheduler_policy_reloads_total{source="file",
	// result="rejected"}, failbus_scheduler_policy_file_valid 0) and
	// audited.
	PolicyFile string

	// PolicyPollInterval is how often PolicyFile is checked for changes.
	// Defaults to DefaultPolicyPollInterval (2s); must not be negative.
	PolicyPollInterval time.Duration

	// WatchPolicy makes the policy under PolicyKVKey in KV bucket
	// FAILBUS_POLICY override the base policy (PolicyFile's current
	// content, else Policy) while it exists, reloaded on every change.
	// Defaults to false.
	WatchPolicy bool

	// Now is the clock of policy audit records and of agents' started and
	// cancel marks that carry no time. Decisions and due times are at the
	// outcome's time (events.EventTime), as in simulate. Defaults to
	// time.Now.
	Now func() time.Time

	// MaxProviders bounds the providers whose
	// failbus_scheduler_provider_outage series is on /metrics: agents name
	// providers, so past it the least recently seen provider's series is
	// deleted, counted in failbus_metric_label_values_evicted_total. It
	// bounds the providers' records the lanes keep in memory between
	// writes too (past it, an idle provider's is read again when next
	// needed). The fault scope itself is in FAILBUS_SCOPE: a provider's
	// record expires with the bucket's TTL, 30 days after its last
	// outcome. Defaults to DefaultMaxProviders.
	MaxProviders int

	// CrashAt, when set, is called with a Crash* point between the durable
	// steps of a retry. It is a fault-injection hook for tests (which kill
	// the process in it); production leaves it nil.
	CrashAt func(point string)

	// ScopeLinger is how long a provider's lane waits for more
	// classifications before it writes the provider's fault scope when no
	// handler waits on the write (lanes.go): each classification is
	// folded and decided at once, and acknowledged once the write that
	// stores its fold is. A fold that changes the provider's health (or
	// asks for a notification) writes at once, and its decision waits for
	// the health record. Longer folds more classifications into one write
	// and acknowledges them later. Defaults to DefaultScopeLinger;
	// negative: no wait (what is folded while a write is in flight still
	// shares the next one). Under MaxScopeLinger in a deployment.
	ScopeLinger time.Duration

	// Runner holds the consumer runner settings shared by the two runners:
	// Logger, Registerer, Concurrency (defaults to DefaultConcurrency for
	// classifications; started/cancel records always run one at a time),
	// MaxInFlight (defaults to DefaultMaxInFlight for classifications),
	// FetchBatch, Middleware, FetchWait, DrainTimeout, Backoff, MaxDeliver.
	// Service, Stream, Consumer, ConsumerConfig and Decode are set here and
	// must be left empty.
	Runner consumer.Config
}

// Service is the scheduler service: two consumer runners (classifications;
// started and cancel records), the policy watch and the fault scope. Create
// it with New and start it with Run; it satisfies the in-process service
// interface of `failbus dev` (Run, Healthy).
type Service struct {
	js      jetstream.JetStream
	watch   bool
	file    *policyFile // nil without Config.PolicyFile
	now     func() time.Time
	crashAt func(string)
	// scopeLinger is Config.ScopeLinger, defaulted (lanes.go).
	scopeLinger time.Duration
	log         zerolog.Logger
	reg         prometheus.Registerer
	m           *metrics

	// active is the policy in force: layers.kv while the KV key holds a
	// valid policy, else layers.base. layers and the store into active
	// change together under layersMu, so the KV watch and the file poll
	// never undo each other's precedence.
	active   atomic.Pointer[activePolicy]
	layersMu sync.Mutex
	layers   policyLayers

	// eng runs the fault-scope and retry stages on providers (KV
	// FAILBUS_SCOPE, shared by replicas) and the ledger (FAILBUS_RETRIES).
	eng       *engine.Engine
	providers lateProviders
	lanes     lanes // one per provider: see lanes.go

	clockMu sync.Mutex
	clock   time.Time // the latest classification time seen (clockAt)

	classified *consumer.Runner
	control    *consumer.Runner

	retries jetstream.Stream // FAILBUS_RETRIES, set by Run before consuming
	health  jetstream.Stream // FAILBUS_HEALTH, set by Run before consuming
	// ledgerReads reads budgets' last ledger entries, folding the reads
	// of concurrent handlers into batches; set by Run with retries.
	ledgerReads *streamread.LastReader
	// leaderReads reads them from FAILBUS_RETRIES's leader, for reads
	// that must be current (current.go); set by Run.
	leaderReads *streamread.LastReader
	// replicated: FAILBUS_RETRIES has replicas, whose direct gets may lag
	// its leader (current.go); set by Run.
	replicated bool
	// index remembers the ledger entries this replica has read or
	// written, per budget (ledgerindex.go).
	index ledgerIndex

	mu       sync.Mutex
	state    error
	watchErr error
}

// errNotStarted is Healthy's answer before Run has started consuming.
var errNotStarted = errors.New("not running")

// New checks opts and prepares the scheduler; it does no I/O. Apply the
// topology before Run.
func New(js jetstream.JetStream, opts Config) (*Service, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: scheduler: nil JetStream", consumer.ErrInvalidConfig)
	}
	rc := opts.Runner
	if rc.Service != "" || rc.Stream != "" || rc.Consumer != "" || rc.ConsumerConfig != nil || rc.Decode {
		return nil, fmt.Errorf("%w: scheduler sets Service, Stream, Consumer, ConsumerConfig and Decode itself", consumer.ErrInvalidConfig)
	}
	base := opts.Policy
	if base == nil {
		base = policy.Default()
	} else if err := base.Validate(); err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	if opts.PolicyPollInterval < 0 {
		return nil, fmt.Errorf("%w: scheduler: PolicyPollInterval %v is negative", consumer.ErrInvalidConfig, opts.PolicyPollInterval)
	}
	maxProviders := opts.MaxProviders
	switch {
	case maxProviders < 0:
		return nil, fmt.Errorf("%w: scheduler: MaxProviders %d is negative (0 selects %d)", consumer.ErrInvalidConfig, maxProviders, DefaultMaxProviders)
	case maxProviders == 0:
		maxProviders = DefaultMaxProviders
	}
	if rc.Registerer == nil {
		rc.Registerer = prometheus.NewRegistry()
	}
	s := &Service{
		js:          js,
		watch:       opts.WatchPolicy,
		now:         opts.Now,
		crashAt:     opts.CrashAt,
		scopeLinger: max(0, cmp.Or(opts.ScopeLinger, DefaultScopeLinger)),
		log:         rc.Logger.With().Str("service", Name).Logger(),
		reg:         rc.Registerer,
		state:       errNotStarted,
	}
	if s.now == nil {
		s.now = time.Now
	}
	if opts.PolicyFile != "" {
		interval := opts.PolicyPollInterval
		if interval == 0 {
			interval = DefaultPolicyPollInterval
		}
		s.file = &policyFile{path: opts.PolicyFile, interval: interval, fallback: opts.Policy != nil}
	}
	s.layers.base = &activePolicy{p: base, source: "options"}
	s.active.Store(s.layers.base)
	m, err := newMetrics(rc.Registerer, maxProviders)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.eng, err = engine.New(engine.Config{
		Policy: base,
		Stores: engine.Stores{Providers: &s.providers, Ledger: ledgerStore{s}},
	})
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	s.lanes.s, s.lanes.maxIdle = s, maxProviders

	cc := rc
	cc.Service, cc.Consumer = Name, topology.ConsumerScheduler
	if cc.Concurrency == 0 {
		cc.Concurrency = DefaultConcurrency
	}
	if cc.MaxInFlight == 0 {
		cc.MaxInFlight = DefaultMaxInFlight
	}
	cc.Key = BudgetLane
	if s.classified, err = consumer.New(js, cc, s.handleClassified); err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	ctl := rc
	ctl.Service, ctl.Consumer = ControlName, topology.ConsumerSchedulerControl
	ctl.Concurrency, ctl.FetchBatch = 1, 0
	if s.control, err = consumer.New(js, ctl, s.handleControl); err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	return s, nil
}

// Policy is the policy the scheduler decides with now.
func (s *Service) Policy() *policy.Policy { return s.active.Load().p }

// Gatherer returns the registry of the service's metrics when it is a
// prometheus.Gatherer (the default one is), for ops.Serve.
func (s *Service) Gatherer() prometheus.Gatherer {
	g, _ := s.reg.(prometheus.Gatherer)
	return g
}

// Run opens FAILBUS_RETRIES, reads the policy file (when set) and loads the
// KV policy (when watched), rebuilds the fault scope, and consumes
// classifications and started/cancel records until ctx ends, following
// policy changes meanwhile; then it drains both consumers (in-flight
// messages finish) and returns nil. It returns an error when something
// cannot start (the policy file included, when unusable and Config.Policy
// is nil) or a consumer stops on its own. A Service runs once.
func (s *Service) Run(ctx context.Context) (err error) {
	defer func() {
		s.mu.Lock()
		s.state = consumer.ErrStopped
		s.mu.Unlock()
	}()
	retries, err := s.js.Stream(ctx, topology.StreamRetries)
	if err != nil {
		return fmt.Errorf("scheduler: open %s (apply the topology first): %w", topology.StreamRetries, err)
	}
	s.retries = retries
	s.replicated = streamread.Replicated(retries)
	onReads := func(how string, n int) { s.m.ledgerReads.WithLabelValues(how).Add(float64(n)) }
	reads := streamread.NewLastReader(s.js, retries, streamread.LastReaderOptions{OnReads: onReads, OnBatch: s.m.ledgerBatches.Inc})
	defer reads.Close()
	s.ledgerReads = reads
	s.leaderReads = streamread.NewLastReader(s.js, retries, streamread.LastReaderOptions{OnReads: onReads, Leader: true})
	defer s.leaderReads.Close()
	health, err := s.js.Stream(ctx, topology.StreamHealth)
	if err != nil {
		return fmt.Errorf("scheduler: open %s (apply the topology first): %w", topology.StreamHealth, err)
	}
	s.health = health
	scope, err := scopestore.Open(ctx, s.js, scopestore.Options{
		Conflicts: s.m.scopeConflicts, Stale: s.m.scopeStale, Unreadable: s.m.scopeUnreadable, Log: s.log,
		Missing: s.rebuild,
	})
	if err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	s.providers.Store = scope

	var wg sync.WaitGroup
	defer wg.Wait() // after cancel, below: the policy watch ends with rctx
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.file != nil {
		if err := s.startPolicyFile(rctx); err != nil {
			return err
		}
		wg.Go(func() { s.pollPolicyFile(rctx) })
	}
	if s.watch {
		updates, err := s.startPolicyWatch(rctx)
		if err != nil {
			return err
		}
		wg.Go(func() { s.followPolicy(rctx, updates) })
	}
	if _, err := s.seedOutages(ctx); err != nil {
		return err
	}
	p := s.active.Load()
	s.log.Info().Str("policy", p.source).Str("policy_key", p.p.RetryFor("").Key()).Msg("scheduler started")
	s.mu.Lock()
	s.state = nil
	s.mu.Unlock()

	// Once stopping, successes waiting in a provider's lane are written
	// at once: the drain waits for their acknowledgements.
	s.lanes.start()
	defer context.AfterFunc(rctx, s.lanes.stop)()
	err = ops.RunAll(rctx, s.classified, s.control)
	cancel() // ends the policy watches
	return err
}

// Healthy reports nil while both consumers run and the policy watch (when
// on) works; otherwise what is wrong. It is the /healthz check.
func (s *Service) Healthy() error {
	s.mu.Lock()
	state, werr := s.state, s.watchErr
	s.mu.Unlock()
	if state != nil {
		return fmt.Errorf("%s: %w", Name, state)
	}
	errs := []error{s.classified.Healthy(), s.control.Healthy()}
	if werr != nil {
		errs = append(errs, fmt.Errorf("%s: policy watch: %w", Name, werr))
	}
	return errors.Join(errs...)
}

// Run runs the scheduler on nc until ctx ends: the entry point of a process
// that runs it alone (apply the topology first). It is New and
// Service.Run.
func Run(ctx context.Context, nc *nats.Conn, opts Config) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("scheduler: jetstream: %w", err)
	}
	s, err := New(js, opts)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// crash calls the fault-injection hook.
func (s *Service) crash(point string) {
	if s.crashAt != nil {
		s.crashAt(point)
	}
}

// metrics are the service's own series beside the runners'.
type metrics struct {
	decisions *prometheus.CounterVec
	conflicts prometheus.Counter
	replays   prometheus.Counter
	// ledgerReads and ledgerBatches count the ledger's LastReader.
	ledgerReads   *prometheus.CounterVec
	ledgerBatches prometheus.Counter
	guesses       *prometheus.CounterVec
	restored      prometheus.Counter
	controls      *prometheus.CounterVec
	reloads       *prometheus.CounterVec
	fileValid     prometheus.Gauge
	seeded        prometheus.Counter
	outage        *prometheus.GaugeVec
	// providers caps the provider label of outage.
	providers *prom.LabelCap
	evictions *prometheus.CounterVec

	scopeConflicts  prometheus.Counter
	scopeStale      prometheus.Counter
	scopeUnreadable prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, maxProviders int) (*metrics, error) {
	var (
		m   metrics
		err error
	)
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		if err != nil {
			return nil
		}
		c, e := prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
		err = e
		return c
	}
	counter := func(name, help string) prometheus.Counter {
		if err != nil {
			return nil
		}
		c, e := prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
		err = e
		return c
	}
	m.decisions = counterVec("failbus_scheduler_decisions_total", "Decisions stored, by action: one without a retry once, when its store is confirmed (a redelivery that finds it stored does not count it again); a retry decision also when a replay after a crash publishes it again.", "action")
	m.conflicts = counter("failbus_scheduler_ledger_conflicts_total", "Ledger writes that lost a compare-and-set race and were decided again.")
	m.guesses = counterVec("failbus_scheduler_ledger_guesses_total", "Decisions made first on the ledger index's word instead of a read, by result: confirmed by the append's compare-and-set (a read saved), wrong (the append failed; decided again from reads), unchecked (nothing appended; decided again from reads).", "result")
	m.ledgerReads = counterVec("failbus_scheduler_ledger_reads_total", "Reads of a budget's last ledger entry, by how they went to the server: batched (in a multi_last request with other budgets' reads, which failbus_scheduler_ledger_read_batches_total counts), alone (one request for one budget: no other budget's read was waiting), fallback (a request of their own because a batch read was unavailable: a stream without direct gets, a server before 2.11, a connection not allowed the batch request; batches are tried again after a minute), leader (the stream leader's, one request each: FAILBUS_RETRIES is replicated and the read decides something no compare-and-set checks, such as a decision that appends nothing, which a replica's direct get lagging the writes acknowledged before it must not answer).", "how")
	if m.ledgerReads != nil {
		for _, how := range []string{streamread.ReadBatched, streamread.ReadAlone, streamread.ReadFallback, streamread.ReadLeader} {
			m.ledgerReads.WithLabelValues(how) // every series from the start, at 0
		}
	}
	m.ledgerBatches = counter("failbus_scheduler_ledger_read_batches_total", "multi_last requests sent, each reading the last ledger entry of several budgets at once.")
	m.replays = counter("failbus_scheduler_replays_total", "Classifications whose outcome already had a ledger record: replayed, nothing spent again.")
	m.restored = counter("failbus_scheduler_schedules_restored_total", "Replays that found the schedule neither pending, fired nor cancelled and published it.")
	m.controls = counterVec("failbus_scheduler_controls_total", "Started and cancel records, by kind and result (marked, ignored).", "kind", "result")
	m.reloads = counterVec("failbus_scheduler_policy_reloads_total", "Policy changes seen, by source (kv, file) and result (applied, shadowed, removed, rejected).", "source", "result")
	m.seeded = counter("failbus_scheduler_scope_seeded_total", "Outages left open in FAILBUS_HEALTH carried into FAILBUS_SCOPE at start for providers it did not know, or when a provider's record was found missing (FAILBUS_SCOPE lost).")
	m.scopeConflicts = counter("failbus_scheduler_scope_conflicts_total", "Fault-scope writes made right after reading the provider's key that lost a compare-and-set race to another replica: read again and folded again.")
	m.scopeStale = counter("failbus_scheduler_scope_stale_total", "Fault-scope writes of the record this replica holds that found another replica had written since: read again and folded again; the provider's key is then read before each write for 10s.")
	m.scopeUnreadable = counter("failbus_scheduler_scope_unreadable_total", "Fault-scope records that could not be decoded; the provider started over.")
	m.evictions = counterVec("failbus_scheduler_scope_evictions_total", "Fault-scope entries forgotten to stay within their caps, by kind: entry (a profile or model past scope.max_profiles / max_models).", "kind")
	if err == nil {
		m.fileValid, err = prom.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "failbus_scheduler_policy_file_valid",
			Help: "1 while the policy file's current content is the policy loaded from it, 0 while it is unreadable or invalid (the last good policy is kept); 1 without a policy file.",
		}))
	}
	if err == nil {
		m.fileValid.Set(1)
		m.outage, err = prom.Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "failbus_scheduler_provider_outage",
			Help: "1 while the fault scope holds the provider in an outage (as this replica last saw it), else 0. At most Config.MaxProviders providers have a series (least recently seen evicted).",
		}, []string{"provider"}))
	}
	if err == nil {
		m.providers, err = prom.NewLabelCap(reg, "provider", maxProviders)
	}
	if err == nil {
		m.providers.Track(m.outage.MetricVec)
	}
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	return &m, nil
}
