package recovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Options configure a Core beyond the policy.
type Options struct {
	// Owner names this driver for the record lease (a service replica id).
	// Empty: no lease (simulate, tests): every Advance drives the record.
	Owner string
	// LeaseTTL is how long a driver keeps a provider after its last
	// Advance; another replica takes over after it. Defaults to 5s.
	LeaseTTL time.Duration
	// DedupeWindow is the duplicate window of the streams commands go to.
	// A planned command not yet in the ledger whose plan is older than half
	// of it is looked for in the stream before it is published again (see
	// Publisher). 0: never (simulate).
	DedupeWindow time.Duration
	// Hook, when set, is called at the core's crash points with the point
	// and what it concerns: HookPlanned and HookStepped with a step name,
	// HookPublished (stored, not yet in the ledger) and HookMarked (in the
	// ledger) with a command id. A fault-injection hook for tests, which
	// kill the process there; production leaves it nil.
	Hook func(point, what string)
	// ReportWindow is how far before an outage's start the checklist reads
	// cron runs and writes back (clock skew between agents and the bus).
	// Defaults to 5 minutes.
	ReportWindow time.Duration
	// UsageError, when set, is told when the probe targets could not be
	// read (Usage) within a quarter of LeaseTTL (at least 500 ms): the
	// probe then goes to an agent that reported itself, or to none, and
	// the HTTP probe runs all the same — an outage must never stop being
	// probed because a read failed. The service logs and counts it.
	UsageError func(provider string, err error)
}

// Crash points of Options.Hook.
const (
	HookPlanned   = "planned"   // a step's plan is saved, nothing of it sent
	HookPublished = "published" // a command is stored, its ledger entry not written
	HookMarked    = "marked"    // a command's ledger entry is written
	HookStepped   = "stepped"   // a step is done and the next one not planned
)

// DefaultLeaseTTL and DefaultReportWindow are defaults of Options.
const (
	DefaultLeaseTTL     = 5 * time.Second
	DefaultReportWindow = 5 * time.Minute
)

// maxCAS bounds compare-and-set retries of one change.
const maxCAS = 64

// Core is the recovery checklist, the held-task queue and the outage probes
// (CONTRACT.md § "Recovery"; see the package doc). Its decisions depend only
// on its inputs, `now` and the store, so `failbus simulate` (memstore) and
// the recovery service (KV and streams) run the same code. It keeps no
// state of its own and is safe for concurrent use when its store and
// publisher are.
type Core struct {
	cfg  Config
	st   Store
	pub  Publisher
	opts Options

	// notes remembers, per (provider, agent), the user note this core
	// wrote or found needless, so the frequent inputs (heartbeats) do not
	// read the provider's record each time only to change nothing. It only
	// skips what noteUser would skip after reading.
	notesMu sync.Mutex
	notes   map[[2]string]time.Time
}

// maxNotes bounds Core.notes; it is cleared when full.
const maxNotes = 10000

// New returns a Core running cfg (which must pass Validate) on st, sending
// with pub.
func New(cfg Config, st Store, pub Publisher, opts Options) (*Core, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("recovery: %w", err)
	}
	if st == nil || pub == nil {
		return nil, errors.New("recovery: nil store or publisher")
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.ReportWindow <= 0 {
		opts.ReportWindow = DefaultReportWindow
	}
	return &Core{cfg: cfg, st: st, pub: pub, opts: opts}, nil
}

// Config is the policy section the core runs.
func (c *Core) Config() Config { return c.cfg }

// Store is the store the core runs on: a driver reads the records from it
// to know when Advance is next due (ProviderRecord.NextDue).
func (c *Core) Store() Store { return c.st }

// update applies fn to the provider's record and saves it by revision,
// retrying on conflict from a fresh read. fn reports whether it changed
// anything; it must be safe to run again on a fresh copy.
func (c *Core) update(ctx context.Context, provider string, fn func(*ProviderRecord) (bool, error)) (*ProviderRecord, error) {
	for range maxCAS {
		r, rev, err := c.st.LoadProvider(ctx, provider)
		if err != nil {
			return nil, err
		}
		if r == nil {
			r = &ProviderRecord{Provider: provider}
		}
		changed, err := fn(r)
		if err != nil || !changed {
			return r, err
		}
		if _, err := c.st.SaveProvider(ctx, r, rev); errors.Is(err, ErrConflict) {
			continue
		} else if err != nil {
			return nil, err
		}
		return r, nil
	}
	return nil, fmt.Errorf("recovery: provider %q: %w %d times in a row", provider, ErrConflict, maxCAS)
}

// noteUser remembers that agent used provider at `at` (a probe target):
// what the agent reported itself (heartbeats, cron and write reports).
// Agents that only report outcomes are found when a probe is due
// (Usage.RecentUsers).
func (c *Core) noteUser(ctx context.Context, provider, agent string, at time.Time) error {
	if provider == "" || agent == "" || c.isProbeAgent(provider, agent) {
		return nil
	}
	key := [2]string{provider, agent}
	c.notesMu.Lock()
	last, ok := c.notes[key]
	c.notesMu.Unlock()
	if ok && (!at.After(last) || at.Sub(last) < c.cfg.ProbeInterval/2) {
		return nil
	}
	_, err := c.update(ctx, provider, func(r *ProviderRecord) (bool, error) {
		i := slices.IndexFunc(r.Users, func(u User) bool { return u.Agent == agent })
		if i >= 0 {
			old := r.Users[i]
			if !at.After(old.At.Time) || at.Sub(old.At.Time) < c.cfg.ProbeInterval/2 {
				return false, nil // nothing worth a write
			}
			r.Users = slices.Delete(r.Users, i, i+1)
		}
		r.Users = slices.Insert(r.Users, 0, User{Agent: agent, At: events.At(at)})
		if len(r.Users) > MaxUsers {
			r.Users = r.Users[:MaxUsers]
		}
		return true, nil
	})
	if err == nil {
		// What the record holds now for the agent (written, or found
		// recent enough).
		n := at
		if ok && last.After(n) {
			n = last
		}
		c.notesMu.Lock()
		if c.notes == nil || len(c.notes) >= maxNotes {
			c.notes = map[[2]string]time.Time{}
		}
		c.notes[key] = n
		c.notesMu.Unlock()
	}
	return err
}

func (c *Core) isProbeAgent(provider, agent string) bool {
	p, ok := c.cfg.Probes[provider]
	return ok && p.Agent == agent
}

// send publishes one command unless the ledger has it, then records it.
// plannedAt is when the command was decided (for the dedupe-window check).
func (c *Core) send(ctx context.Context, id, subject string, msg events.Message, plannedAt, now time.Time) (bool, error) {
	sent, err := c.st.Sent(ctx, id)
	if err != nil || sent {
		return false, err
	}
	var verify time.Time
	if c.opts.DedupeWindow > 0 && now.Sub(plannedAt) > c.opts.DedupeWindow/2 {
		verify = plannedAt
	}
	if err := c.pub.Publish(ctx, id, subject, msg, verify); err != nil {
		return false, fmt.Errorf("send %s: %w", id, err)
	}
	c.hook(HookPublished, id)
	if err := c.st.MarkSent(ctx, id, now); err != nil {
		return true, fmt.Errorf("ledger %s: %w", id, err)
	}
	c.hook(HookMarked, id)
	return true, nil
}

func (c *Core) hook(point, what string) {
	if c.opts.Hook != nil {
		c.opts.Hook(point, what)
	}
}
