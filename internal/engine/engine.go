// Package engine is failbus's one decision pipeline: the stages that turn
// an agent's outcome into a classification, provider health, a decision, a
// retry to schedule, a refusal-state change and notifications, each written
// once and run by every consumer of the rules:
//
//   - the services are adapters: each feeds the stages it owns and performs
//     their effects on JetStream (classifier: Classify; scheduler: Observe,
//     Settle, Decide; refusal tiers: Refuse, Boundary, Route; the notifier
//     admits with the same rules, notification.Admit; recovery runs the
//     core of internal/policy/recovery, which is the Recover stage here, on its
//     own bus stores);
//   - `failbus simulate` (internal/engine/sim) is the same Engine with in-memory
//     stores (Memory) and a virtual clock, chaining the stages with Step;
//   - shadow replays run Step twice over history, once per
//     policy, each on its own Memory.
//
// The stages are pure functions of the input, `now` and the state behind
// the store interfaces (Stores): they read no clock, start no goroutines
// and do no I/O of their own, so a stage decides the same on the bus and
// offline. `now` is the record's time: the outcome's `at` on the bus, the
// virtual clock in simulate.
//
// # Extension points
//
//   - A new input record type: a field in Input, a case in Step, and the
//     stage method it calls (as recovery's heartbeats, cron specs and runs,
//     writes and tasks call Recover).
//   - A new kind of state: an interface in Stores, its in-memory
//     implementation in Memory, the bus implementation in its service.
//   - A new output: a field in Effects, filled by the stage that makes it;
//     simulate writes it as a record, the service publishes it.
//   - Throughput: Providers.Update folds a batch of one
//     provider's classifications in one compare-and-set (ObserveBatch);
//     a writer that holds a provider's record in memory folds each one
//     as it comes (Fold) and writes the record behind them (the
//     scheduler's lanes).
package engine

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/recovery/simulate"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/pkg/policy"
)

// Config configures an Engine.
type Config struct {
	// Policy is the policy to run. Defaults to policy.Default(). Swap it
	// later with SetPolicy.
	Policy *policy.Policy
	// Stores hold the state. A nil store disables the stages that need
	// it; use NewMemory for simulate and tests.
	Stores Stores
	// Seed varies the backoff jitter's draw: each failure's jitter is
	// retry.JitterU of its outcome id and Seed, so the same outcome gets
	// the same delay on the bus, in simulate and in shadow. 0 (the
	// default) is the bus's draw.
	Seed uint64
}

// Engine runs the stages. It is safe for concurrent use when its stores
// are.
type Engine struct {
	cur    atomic.Pointer[compiled]
	stores Stores
	seed   uint64

	// clock is the recovery stage's virtual clock (RecoverDue).
	clockMu sync.Mutex
	clock   simulate.Clock
}

// compiled is a policy with its classifier built once, and its retry
// policy resolved once per provider (retryFor).
type compiled struct {
	pol *policy.Policy
	cl  *classify.Classifier
	// rec is the recovery stage's core; nil without a Recovery store.
	rec *recovery.Core

	retryMu sync.RWMutex
	retry   map[string]*retry.Policy // provider → pol.RetryFor(provider)
}

// maxResolvedProviders bounds compiled.retry: agents name providers, so
// past it a provider's retry policy is resolved at each use instead.
const maxResolvedProviders = 1024

// retryFor is pol.RetryFor(provider), resolved once per provider: every
// classification and decision needs it, and resolving builds the
// effective retryable set each time. The result is shared, read only.
func (c *compiled) retryFor(provider string) *retry.Policy {
	c.retryMu.RLock()
	rp, ok := c.retry[provider]
	c.retryMu.RUnlock()
	if ok {
		return rp
	}
	rp = c.pol.RetryFor(provider)
	c.retryMu.Lock()
	if c.retry == nil {
		c.retry = map[string]*retry.Policy{}
	}
	if len(c.retry) < maxResolvedProviders {
		c.retry[provider] = rp
	}
	c.retryMu.Unlock()
	return rp
}

// New builds an engine running cfg.Policy on cfg.Stores.
func New(cfg Config) (*Engine, error) {
	e := &Engine{stores: cfg.Stores, seed: cfg.Seed}
	p := cfg.Policy
	if p == nil {
		p = policy.Default()
	}
	if err := e.SetPolicy(p); err != nil {
		return nil, err
	}
	return e, nil
}

// SetPolicy makes p the policy of every stage that starts from now on,
// compiling its classification rules first; on an error the old policy
// stays. The state in the stores is kept: a reload neither forgets an
// outage nor a budget (budgets are per policy key, so a changed retry
// policy starts new ones).
func (e *Engine) SetPolicy(p *policy.Policy) error {
	cl, err := classify.New(p.Classify)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	c := &compiled{pol: p, cl: cl}
	if e.stores.Recovery != nil {
		if c.rec, err = recovery.New(p.Recovery, e.stores.Recovery, simulate.Collector{}, recovery.Options{}); err != nil {
			return fmt.Errorf("engine: %w", err)
		}
	}
	e.cur.Store(c)
	return nil
}

// Policy is the policy in force.
func (e *Engine) Policy() *policy.Policy { return e.cur.Load().pol }

// Stores returns the engine's stores.
func (e *Engine) Stores() Stores { return e.stores }
