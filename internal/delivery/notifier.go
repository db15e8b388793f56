package delivery

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/jspub"
	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/notify"
	"github.com/failbus/failbus/pkg/redact"
)

// Defaults of Config.
const (
	// DefaultService names the audit subjects (failbus.audit.notifier.*)
	// and prefixes the notifier's own message ids.
	DefaultService = "notifier"
	// DefaultDedupeLifetime is how long a sent dedupe key suppresses the
	// same key: the dedupe bucket's TTL, so the bucket forgets a key when
	// the notifier stops honouring it.
	DefaultDedupeLifetime = topology.DefaultTTLNotifyDedupe
	// defaultClaimLease is how long a claim protects a delivery in
	// progress. A crashed replica's claims are taken over after it.
	defaultClaimLease = 30 * time.Second
	// defaultMaxUnconfirmed is how many sends to non-idempotent sinks one
	// replica may have between "sent" and "recorded as sent": the bound
	// on duplicates one crash of a replica can cause.
	defaultMaxUnconfirmed = 1
)

// Unlimited as Config.DailyBudget turns the budget off. (The policy's
// daily_budget is always a number: 0 there means no non-critical
// notification at all.)
const Unlimited = notification.Unlimited

// DigestKeyPrefix starts the dedupe key of a budget digest; the UTC day
// follows. With the label digestLabel=DigestLabelValue it marks the one
// request per day that bypasses the budget it reports on.
const (
	DigestKeyPrefix  = notification.DigestKeyPrefix
	digestLabel      = notification.DigestLabel
	digestLabelValue = notification.DigestLabelValue
	digestDayLabel   = notification.DigestDayLabel
)

// Config configures a Notifier. Every field documents its default; the
// zero value of an optional field selects it.
type Config struct {
	// JetStream reaches the dedupe and budget buckets and receives audit
	// records and digest requests. Required.
	JetStream jetstream.JetStream
	// Routes are the sinks and what each receives (see Routes). At least
	// one is required.
	Routes []Route
	// DailyBudget caps non-critical (info, normal) notifications per UTC
	// day; critical ones always go out. 0 sends none; Unlimited (-1)
	// turns the cap off. Note the zero value is 0: build it from
	// notification.Config.DailyBudget (default 20).
	DailyBudget int
	// DedupeLifetime is how long after a notification was sent its dedupe
	// key suppresses repeats; after it, the same key notifies again with a
	// new idempotency key. Defaults to DefaultDedupeLifetime (7 days). It
	// cannot usefully exceed the dedupe bucket's TTL (the server forgets
	// the key then); New checks this.
	DedupeLifetime time.Duration
	// ClaimLease is how long a claim is honoured without being renewed.
	// It must exceed every route's Timeout, since a send is never started
	// with less lease left than its timeout. Defaults to
	// defaultClaimLease (30s), or twice the longest route Timeout when
	// that is more. Replicas' clocks must agree to well within it.
	ClaimLease time.Duration
	// MaxUnconfirmed bounds the sends to non-idempotent sinks in flight
	// at once in this replica (see defaultMaxUnconfirmed). Defaults to 1.
	MaxUnconfirmed int
	// Replica names this replica in ledger entries and audit records.
	// Defaults to "<hostname>-<pid>-<random>".
	Replica string
	// Service names the audit subjects and prefixes message ids. Defaults
	// to DefaultService.
	Service string
	// LedgerBucket and BudgetBucket are the KV buckets. Default to
	// topology.BucketNotifyDedupe and topology.BucketNotifyBudget.
	LedgerBucket, BudgetBucket string
	// Now is the clock (UTC day, leases, lifetimes). Defaults to
	// time.Now.
	Now func() time.Time
	// Log receives one line per decision. The zero value logs nothing.
	Log zerolog.Logger
}

// Notifier decides, for each notification request, whether it is sent,
// deduplicated or held back, sends it to its sinks, and records every
// decision. It is safe for concurrent use; several replicas (processes)
// share its state through the KV buckets.
type Notifier struct {
	cfg    Config
	js     jetstream.JetStream
	ledger jetstream.KeyValue
	budget jetstream.KeyValue
	slots  chan struct{}
	names  map[string]bool

	budgetMu    sync.Mutex
	budgetCache *budgetCache
	maxWait     time.Duration // longest route timeout
}

// New checks cfg, binds the buckets and returns a Notifier. The buckets
// must exist (topology.Apply creates them).
func New(ctx context.Context, cfg Config) (*Notifier, error) {
	if cfg.JetStream == nil {
		return nil, errors.New("notify: JetStream is required")
	}
	if len(cfg.Routes) == 0 {
		return nil, errors.New("notify: at least one route is required")
	}
	n := &Notifier{names: map[string]bool{}}
	for i, r := range cfg.Routes {
		if r.Sink == nil {
			return nil, fmt.Errorf("notify: route %d has no sink", i)
		}
		name := r.Sink.Name()
		if name == "" || n.names[name] {
			return nil, fmt.Errorf("notify: route %d: sink name %q is empty or used twice", i, name)
		}
		n.names[name] = true
		n.maxWait = max(n.maxWait, r.timeout())
	}
	if cfg.DailyBudget < Unlimited {
		return nil, fmt.Errorf("notify: DailyBudget %d: must be >= 0 or Unlimited", cfg.DailyBudget)
	}
	if cfg.DedupeLifetime < 0 || cfg.ClaimLease < 0 || cfg.MaxUnconfirmed < 0 {
		return nil, errors.New("notify: DedupeLifetime, ClaimLease and MaxUnconfirmed must not be negative")
	}
	if cfg.DedupeLifetime == 0 {
		cfg.DedupeLifetime = DefaultDedupeLifetime
	}
	if cfg.ClaimLease == 0 {
		cfg.ClaimLease = max(defaultClaimLease, 2*n.maxWait)
	}
	if cfg.ClaimLease <= n.maxWait {
		return nil, fmt.Errorf("notify: ClaimLease %v must exceed the longest send timeout %v", cfg.ClaimLease, n.maxWait)
	}
	if cfg.MaxUnconfirmed == 0 {
		cfg.MaxUnconfirmed = defaultMaxUnconfirmed
	}
	if cfg.Replica == "" {
		host, _ := os.Hostname()
		cfg.Replica = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), nuid.Next()[16:])
	}
	if cfg.Service == "" {
		cfg.Service = DefaultService
	}
	if cfg.LedgerBucket == "" {
		cfg.LedgerBucket = topology.BucketNotifyDedupe
	}
	if cfg.BudgetBucket == "" {
		cfg.BudgetBucket = topology.BucketNotifyBudget
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	var err error
	if n.ledger, err = streamread.KeyValue(ctx, cfg.JetStream, cfg.LedgerBucket); err != nil {
		return nil, fmt.Errorf("notify: dedupe bucket %s: %w", cfg.LedgerBucket, err)
	}
	if n.budget, err = streamread.KeyValue(ctx, cfg.JetStream, cfg.BudgetBucket); err != nil {
		return nil, fmt.Errorf("notify: budget bucket %s: %w", cfg.BudgetBucket, err)
	}
	st, err := n.ledger.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("notify: dedupe bucket %s status: %w", cfg.LedgerBucket, err)
	}
	if ttl := st.TTL(); ttl > 0 && cfg.DedupeLifetime > ttl {
		return nil, fmt.Errorf("notify: DedupeLifetime %v exceeds the dedupe bucket's TTL %v: the server would forget keys first; raise the bucket TTL (topology.Options.BucketTTL) or lower the lifetime",
			cfg.DedupeLifetime, ttl)
	}
	n.cfg = cfg
	n.js = cfg.JetStream
	n.slots = make(chan struct{}, cfg.MaxUnconfirmed)
	return n, nil
}

// Replica is this notifier's replica name.
func (n *Notifier) Replica() string { return n.cfg.Replica }

// Request is one notification request as the notifier handles it.
type Request struct {
	// ID is the request message's identity (its Nats-Msg-Id, or
	// stream:sequence); audit record ids derive from it.
	ID string
	// Notification is the decoded request.
	Notification events.Notification
	// LastDelivery is true when JetStream will not deliver the request
	// again: a failure must then dead-letter it, not ask for a retry.
	LastDelivery bool
}

// Action is what should happen to the request message.
type Action int

// Actions of a Result.
const (
	// Ack: done (sent, deduplicated, held back or unrouted).
	Ack Action = iota
	// Retry: deliver the request again after Result.After.
	Retry
	// DeadLetter: send the request to the dead-letter subject with
	// Result.Reason.
	DeadLetter
)

// Result is the outcome of Process.
type Result struct {
	Action Action
	// After is the redelivery delay for Retry.
	After time.Duration
	// Reason explains Retry and DeadLetter; for a dead letter it carries
	// each failing sink's last answer.
	Reason string
	// Kind is the main audit kind of the decision (sent, deduped,
	// held_by_budget, failed, unrouted) or "" for an internal retry.
	Kind string
}

// Process handles one request. A nil error comes with a Result saying what
// to do with the request message; an error means the bus itself could not
// be reached (KV or audit publish), and the request should be retried with
// backoff.
//
// The exactly-once protocol, per dedupe key (see the package doc):
//  1. claim the key with a create-only write (or take over a stale claim by
//     compare-and-set); a key already sent within its lifetime, or claimed
//     by another live request, is deduplicated;
//  2. non-critical: take a slot of today's budget, or hold the request back;
//  3. send to each routed sink not yet sent, recording each success before
//     the next step; a failure releases the key for the request's
//     redelivery.
func (n *Notifier) Process(ctx context.Context, req Request) (Result, error) {
	if req.ID == "" {
		return Result{}, errors.New("notify: request without an ID")
	}
	p := &proc{n: n, req: req, now: n.cfg.Now()}
	p.day = utcDay(p.now)
	p.note = n.redacted(req.Notification, p.now)
	p.key = ledgerKey(req.Notification.DedupeKey)
	p.digest = isDigest(&req.Notification)
	p.budgeted = notification.Budgeted(n.limits(), req.Notification)
	for _, r := range n.cfg.Routes {
		if r.Matches(&req.Notification) {
			p.routes = append(p.routes, r)
		}
	}
	if len(p.routes) == 0 {
		return p.finish(Result{Action: Ack, Kind: AuditUnrouted}, p.audit(AuditUnrouted, "", 0, "",
			fmt.Sprintf("no sink takes severity %s with labels %v", req.Notification.Severity, req.Notification.Labels)))
	}
	return p.run(ctx)
}

// isDigest reports whether n is the notifier's own budget digest, which the
// budget does not apply to.
func isDigest(n *events.Notification) bool { return notification.IsDigest(*n) }

// limits are the admission limits (notification.Admit) this notifier runs.
func (n *Notifier) limits() notification.Limits {
	return notification.Limits{DailyBudget: n.cfg.DailyBudget, DedupeLifetime: n.cfg.DedupeLifetime}
}

// redacted is the copy of a request that leaves the process: secrets
// masked in every human-readable field, At set.
func (n *Notifier) redacted(in events.Notification, now time.Time) events.Notification {
	out := notification.Redacted(in)
	if out.At.IsZero() {
		out.At = events.At(now)
	}
	return out
}

// proc is the state of one Process call.
type proc struct {
	n        *Notifier
	req      Request
	note     events.Notification // redacted
	routes   []Route
	now      time.Time
	day      string
	key      string
	digest   bool
	budgeted bool

	entry *ledgerEntry
	rev   uint64
	// resumed: the key comes from an earlier delivery of this request, or
	// from a claim whose owner died; sinks already sent may lack their
	// "sent" audit record, which is repeated (same id, stored once).
	resumed   bool
	budgetRec *BudgetRecord // the day's budget after this request took its slot
}

// maxCAS bounds compare-and-set loops; losing this many races in a row
// means heavy contention, and the request is retried later.
const maxCAS = 32

// errLostClaim: another request took the key over while this one held it
// (its lease ran out); the request is re-evaluated.
var errLostClaim = errors.New("lost the claim on the dedupe key")

func (p *proc) run(ctx context.Context) (Result, error) {
	res, done, err := p.acquire(ctx)
	if err != nil || done {
		return res, err
	}
	if p.req.Notification.At.IsZero() && !p.entry.Created.IsZero() {
		// A request without a time gets the time its key was first
		// claimed, so every attempt of this lifetime sends the same
		// bytes (and the same signature).
		p.note.At = events.At(p.entry.Created)
	}
	if p.budgeted && p.entry.BudgetDay == "" {
		res, done, err := p.takeBudgetSlot(ctx)
		if err != nil || done {
			return p.lost(res, err)
		}
	}
	if p.digest {
		p.n.renderDigest(ctx, &p.note)
	}
	return p.lost(p.deliver(ctx))
}

// lost turns errLostClaim into a short retry.
func (p *proc) lost(res Result, err error) (Result, error) {
	if errors.Is(err, errLostClaim) {
		return Result{Action: Retry, After: 100 * time.Millisecond, Reason: err.Error()}, nil
	}
	return res, err
}

// acquire makes this request the owner of the key, or decides the request
// is done (deduplicated, held) or must wait.
func (p *proc) acquire(ctx context.Context) (Result, bool, error) {
	n := p.n
	// Most keys are new: try the create-only claim first, and read the
	// entry only when the key exists.
	tryCreate := true
	for range maxCAS {
		if tryCreate {
			e := p.fresh()
			rev, err := n.ledger.Create(ctx, p.key, encodeEntry(e))
			if err == nil {
				p.entry, p.rev = e, rev
				return Result{}, false, nil
			}
			if !errors.Is(err, jetstream.ErrKeyExists) {
				return Result{}, false, fmt.Errorf("notify: claim %s: %w", p.key, err)
			}
		}
		kve, err := n.ledger.Get(ctx, p.key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			tryCreate = true // gone meanwhile (deleted or expired)
			continue
		}
		if err != nil {
			return Result{}, false, fmt.Errorf("notify: read ledger %s: %w", p.key, err)
		}
		tryCreate = false
		e, derr := decodeEntry(kve.Value())
		if derr != nil {
			n.cfg.Log.Warn().Err(derr).Str("key", p.key).Msg("unreadable ledger entry replaced")
			e = p.fresh()
		} else if res, done, err := p.judge(ctx, e); done || err != nil {
			return res, true, err
		}
		rev, err := n.ledger.Update(ctx, p.key, encodeEntry(e), kve.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return Result{}, false, fmt.Errorf("notify: take over %s: %w", p.key, err)
		}
		p.entry, p.rev = e, rev
		return Result{}, false, nil
	}
	return Result{Action: Retry, After: time.Second, Reason: "dedupe key contended"}, true, nil
}

// fresh is a new entry claimed by this request: a new lifetime of the key.
func (p *proc) fresh() *ledgerEntry {
	return &ledgerEntry{
		DedupeKey:  p.req.Notification.DedupeKey,
		State:      ledgerClaimed,
		Generation: nuid.Next(),
		Request:    p.req.ID,
		Owner:      p.n.cfg.Replica,
		Until:      p.now.Add(p.n.cfg.ClaimLease),
		Created:    p.now,
	}
}

// judge looks at an existing entry. It either decides the request (done),
// or rewrites e into a claim by this request for acquire to store.
func (p *proc) judge(ctx context.Context, e *ledgerEntry) (Result, bool, error) {
	n, now, mine := p.n, p.now, e.Request == p.req.ID
	claim := func() (Result, bool, error) {
		p.resumed = mine || e.State == ledgerClaimed
		e.State, e.Request, e.Owner, e.Until = ledgerClaimed, p.req.ID, n.cfg.Replica, now.Add(n.cfg.ClaimLease)
		return Result{}, false, nil
	}
	switch e.State {
	case ledgerSent:
		a := notification.AdmitKey(n.limits(), p.req.Notification, notification.KeyState{SentAt: e.SentAt}, now)
		if a.NewLifetime {
			*e = *p.fresh() // lifetime over: notify again, new idempotency key
			return Result{}, false, nil
		}
		if mine {
			// This request sent it and was redelivered before its ack
			// landed: repeat its audit records (same ids, stored once).
			var errs []error
			for _, r := range p.routes {
				if st := e.Sinks[r.Sink.Name()]; st != nil && st.Sent {
					errs = append(errs, p.audit(AuditSent, r.Sink.Name(), st.Attempts, "", "", withGeneration(e.Generation)))
				}
			}
			res, err := p.finish(Result{Action: Ack, Kind: AuditSent}, errors.Join(errs...))
			return res, true, err
		}
		return p.dedupe(a.Reason+" by request "+e.Request, e)
	case ledgerClaimed:
		if now.Before(e.Until) {
			if mine {
				// An earlier delivery of this very request holds the
				// claim: it may still be sending. Wait for its lease.
				return Result{Action: Retry, After: e.Until.Sub(now) + 50*time.Millisecond,
					Reason: "an earlier delivery of this request holds the claim (replica " + e.Owner + ")"}, true, nil
			}
			return p.dedupe("being delivered by request "+e.Request+" on replica "+e.Owner, e)
		}
		return claim() // the owner's lease ran out: it crashed or stalled
	case ledgerPending:
		if !mine && now.Before(e.Until) {
			return p.dedupe("being retried by request "+e.Request, e)
		}
		return claim()
	case ledgerHeld:
		if a := notification.AdmitKey(n.limits(), p.req.Notification, notification.KeyState{HeldDay: e.HeldDay}, now); a.HeldAgain {
			res, err := p.heldAgain(ctx, e)
			return res, true, err
		}
		e.HeldDay = ""
		return claim()
	case ledgerFailed:
		if mine {
			// Dead-lettered already and redelivered (the ack was lost):
			// the dead letter is stored once under the same id.
			return Result{Action: DeadLetter, Reason: e.FailReason, Kind: AuditFailed}, true, nil
		}
		for _, st := range e.Sinks {
			if !st.Sent {
				st.Attempts = 0 // a new request gets a new retry budget
			}
		}
		e.FailReason = ""
		return claim()
	}
	return claim()
}

func (p *proc) dedupe(reason string, e *ledgerEntry) (Result, bool, error) {
	res, err := p.finish(Result{Action: Ack, Kind: AuditDeduped}, p.audit(AuditDeduped, "", 0, "", reason, withGeneration(e.Generation)))
	return res, true, err
}

// heldAgain: the key was already held back today (a repeat, or a
// redelivery). It is not counted again; the digest is made sure of.
func (p *proc) heldAgain(ctx context.Context, e *ledgerEntry) (Result, error) {
	b, err := p.n.readBudget(ctx, p.day)
	if err != nil {
		return Result{}, err
	}
	if err := p.ensureDigest(ctx, b); err != nil {
		return Result{}, err
	}
	return p.finish(Result{Action: Ack, Kind: AuditHeld}, p.audit(AuditHeld, "", 0, "",
		"already held back today", withGeneration(e.Generation), withBudget(b)))
}

// takeBudgetSlot takes one of today's slots, or holds the request back.
func (p *proc) takeBudgetSlot(ctx context.Context) (Result, bool, error) {
	n := p.n
	ok, b, err := n.reserve(ctx, p.day, notification.Admission{Verdict: notification.Send, Budgeted: true})
	if err != nil {
		return Result{}, true, err
	}
	if ok {
		// The slot is recorded in the entry with its next write (the
		// first recorded send, or the failure), after which no retry or
		// takeover takes another. A crash before that write costs the
		// day one slot: the budget errs on the side of fewer pushes.
		p.entry.BudgetDay, p.budgetRec = p.day, b
		return Result{}, false, nil
	}
	p.entry.State, p.entry.HeldDay, p.entry.Owner, p.entry.Until = ledgerHeld, p.day, "", time.Time{}
	if err := p.store(ctx); err != nil {
		return Result{}, true, err
	}
	b, err = n.countHeld(ctx, p.day, p.note.At.Time)
	if err != nil {
		return Result{}, true, err
	}
	if err := p.ensureDigest(ctx, b); err != nil {
		return Result{}, true, err
	}
	res, err := p.finish(Result{Action: Ack, Kind: AuditHeld}, p.audit(AuditHeld, "", 0, "",
		fmt.Sprintf("daily budget of %d non-critical notifications for %s (UTC) is used up", b.Limit, p.day),
		withGeneration(p.entry.Generation), withBudget(b)))
	return res, true, err
}

// ensureDigest puts the day's digest request on the bus once.
func (p *proc) ensureDigest(ctx context.Context, b *BudgetRecord) error {
	if b.DigestRequested {
		return nil
	}
	if err := p.n.publishDigest(ctx, b); err != nil {
		return err
	}
	return p.n.markDigest(ctx, b.Day)
}

// store writes the entry with compare-and-set; errLostClaim when someone
// else changed it.
func (p *proc) store(ctx context.Context) error {
	rev, err := p.n.ledger.Update(ctx, p.key, encodeEntry(p.entry), p.rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return errLostClaim
	}
	if err != nil {
		return fmt.Errorf("notify: write ledger %s: %w", p.key, err)
	}
	p.rev = rev
	return nil
}

type failure struct {
	route Route
	err   *notify.SinkError
	st    *SinkState
}

// deliver sends to every routed sink not yet sent and settles the entry.
func (p *proc) deliver(ctx context.Context) (Result, error) {
	var failures []failure
	pendingSinks := 0
	for _, r := range p.routes {
		if st := p.entry.Sinks[r.Sink.Name()]; st == nil || !st.Sent {
			pendingSinks++
		}
	}
	for _, r := range p.routes {
		name := r.Sink.Name()
		st := p.entry.sink(name)
		if st.Sent {
			if p.resumed {
				// Sent by an earlier delivery of this request, or by a
				// replica that died before its audit record: repeat it
				// (the id is per generation and sink, so it is stored once).
				if err := p.audit(AuditSent, name, st.Attempts, "", "", withGeneration(p.entry.Generation)); err != nil {
					return Result{}, err
				}
			}
			continue
		}
		err := p.sendOne(ctx, r, st, pendingSinks == 1 && len(failures) == 0)
		if err == nil {
			pendingSinks--
			continue
		}
		var se *notify.SinkError
		if !errors.As(err, &se) {
			return Result{}, err // the bus, not the sink
		}
		pendingSinks--
		failures = append(failures, failure{route: r, err: se, st: st})
	}
	if len(failures) == 0 {
		if p.entry.State != ledgerSent { // every sink was already sent
			p.markSent()
			if err := p.store(ctx); err != nil {
				return Result{}, err
			}
		}
		return Result{Action: Ack, Kind: AuditSent}, nil
	}
	return p.settleFailures(ctx, failures)
}

func (p *proc) markSent() {
	p.entry.State, p.entry.SentAt, p.entry.Owner, p.entry.Until = ledgerSent, p.now, "", time.Time{}
}

// sendOne sends to one sink. A send to a sink that cannot deduplicate
// takes one of the replica's unconfirmed slots from before the send until
// its success is recorded in the ledger, which bounds what a crash can
// duplicate. A success at an idempotent sink is recorded with the entry's
// next write instead (a crash before it only causes a re-send the receiver
// absorbs). last marks the final sink, whose success settles the entry.
func (p *proc) sendOne(ctx context.Context, r Route, st *SinkState, last bool) error {
	n := p.n
	name := r.Sink.Name()
	idem := idempotent(r.Sink)
	holding := false
	release := func() {
		if holding {
			holding = false
			<-n.slots
		}
	}
	defer release()
	if !idem {
		select {
		case n.slots <- struct{}{}:
			holding = true
		case <-ctx.Done():
			return fmt.Errorf("notify: wait for a send slot: %w", ctx.Err())
		}
	}
	timeout := r.timeout()
	if p.entry.Until.Sub(n.cfg.Now()) < timeout+n.cfg.ClaimLease/4 {
		p.entry.Until = n.cfg.Now().Add(n.cfg.ClaimLease)
		if err := p.store(ctx); err != nil {
			return err
		}
	}
	st.Attempts++
	sctx, cancel := context.WithTimeout(ctx, timeout)
	err := r.Sink.Send(sctx, notify.Delivery{Notification: p.note, IdempotencyKey: p.entry.Generation, Attempt: st.Attempts})
	cancel()
	if err != nil {
		se := notify.AsSinkError(name, err)
		st.LastAnswer = se.Answer
		return se
	}
	st.Sent, st.SentAt, st.LastAnswer = true, n.cfg.Now(), ""
	if last {
		p.markSent()
	}
	if !idem || last {
		if err := p.store(ctx); err != nil {
			return err
		}
	}
	release()
	if err := p.audit(AuditSent, name, st.Attempts, "", "", withGeneration(p.entry.Generation), withBudget(p.budgetRec)); err != nil {
		return err
	}
	n.cfg.Log.Info().Str("sink", name).Str("dedupe_key", p.note.DedupeKey).Str("severity", p.note.Severity).
		Str("title", p.note.Title).Int("attempt", st.Attempts).Msg("notification sent")
	return nil
}

// settleFailures decides between a retry and a dead letter after failed
// sends, and releases the key for the retry.
func (p *proc) settleFailures(ctx context.Context, failures []failure) (Result, error) {
	n := p.n
	final := p.req.LastDelivery
	var after time.Duration
	reasons := make([]string, 0, len(failures))
	for _, f := range failures {
		if f.err.Permanent || f.st.Attempts >= f.route.Retry.withDefaults().MaxAttempts {
			final = true
		}
		after = max(after, f.route.Retry.Delay(f.st.Attempts), f.err.RetryAfter)
		reasons = append(reasons, fmt.Sprintf("sink %s after %d attempt(s): %s", f.route.Sink.Name(), f.st.Attempts, describe(f.err)))
	}
	after = min(after, topology.MaxRedeliveryDelay)
	reason := strings.Join(reasons, "; ")
	if final {
		p.entry.State, p.entry.FailReason, p.entry.Owner, p.entry.Until = ledgerFailed, reason, "", time.Time{}
	} else {
		// The request comes back after `after`; until then (with a
		// lease's grace) repeats of the key defer to it.
		p.entry.State, p.entry.Owner, p.entry.Until = ledgerPending, "", p.now.Add(after+n.cfg.ClaimLease)
	}
	if err := p.store(ctx); err != nil {
		return Result{}, err
	}
	var errs []error
	for _, f := range failures {
		errs = append(errs, p.audit(AuditFailed, f.route.Sink.Name(), f.st.Attempts, f.err.Answer, describe(f.err),
			withGeneration(p.entry.Generation), withFinal(final)))
		n.cfg.Log.Warn().Str("sink", f.route.Sink.Name()).Str("dedupe_key", p.note.DedupeKey).
			Int("attempt", f.st.Attempts).Bool("final", final).Str("answer", f.err.Answer).Msg("notification failed")
	}
	if err := errors.Join(errs...); err != nil {
		return Result{}, err
	}
	if final {
		return Result{Action: DeadLetter, Reason: reason, Kind: AuditFailed}, nil
	}
	return Result{Action: Retry, After: after, Reason: reason, Kind: AuditFailed}, nil
}

// describe is a failure in words: status and answer, and whether it is
// permanent.
func describe(e *notify.SinkError) string {
	s := e.Answer
	if e.Status != 0 {
		s = strconv.Itoa(e.Status) + " " + s
	}
	if e.Permanent {
		s += " (permanent: fix the sink's configuration, then replay the dead letter)"
	}
	return s
}

// finish returns res unless err (a failed audit publish) says otherwise.
func (p *proc) finish(res Result, err error) (Result, error) {
	if err != nil {
		return Result{}, err
	}
	if res.Kind == AuditDeduped || res.Kind == AuditHeld || res.Kind == AuditUnrouted {
		p.n.cfg.Log.Debug().Str("dedupe_key", p.note.DedupeKey).Str("decision", res.Kind).Msg("notification not sent")
	}
	return res, nil
}

type auditOpt func(*Audit)

func withGeneration(g string) auditOpt { return func(a *Audit) { a.Generation = g } }
func withFinal(f bool) auditOpt        { return func(a *Audit) { a.Final = f } }
func withBudget(b *BudgetRecord) auditOpt {
	return func(a *Audit) {
		if b != nil {
			a.Budget = &AuditBudget{Day: b.Day, Limit: b.Limit, Sent: b.Sent, Held: b.Held}
		}
	}
}

// audit publishes one audit record on failbus.audit.<service>.<kind>. Its
// Nats-Msg-Id derives from the request, kind, sink and attempt, so a
// redelivered request repeating a decision stores it once. A "sent"
// record's id derives from the generation and the sink instead: a send
// happens once per lifetime of a key and sink, whichever request repeats
// the record after a crash.
func (p *proc) audit(kind, sink string, attempt int, answer, reason string, opts ...auditOpt) error {
	n := p.n
	a := &Audit{
		At: events.At(n.cfg.Now()), Kind: kind, DedupeKey: p.note.DedupeKey, Severity: p.note.Severity,
		Title: p.note.Title, Sink: sink, Attempt: attempt, Answer: answer, Reason: redact.String(reason),
		Request: p.req.ID, Replica: n.cfg.Replica,
	}
	for _, o := range opts {
		o(a)
	}
	id := n.cfg.Service + ":audit:" + p.req.ID + ":" + kind + ":" + sink + ":" + strconv.Itoa(attempt)
	if kind == AuditSent && a.Generation != "" {
		id = n.cfg.Service + ":audit:sent:" + a.Generation + ":" + sink
	}
	return n.publish(context.Background(), events.AuditSubject(n.cfg.Service, kind), a, id)
}

// publish stores m on subject with Nats-Msg-Id id (jspub.Publish) and
// waits for JetStream.
func (n *Notifier) publish(ctx context.Context, subject string, m events.Message, id string) error {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := jspub.Publish(pctx, n.js, subject, m, id, nil); err != nil {
		return fmt.Errorf("notify: %w", err)
	}
	return nil
}

// idempotent reports whether s declares that its receiver deduplicates
// (notify.Idempotent).
func idempotent(s notify.Sink) bool {
	i, ok := s.(notify.Idempotent)
	return ok && i.Idempotent()
}
