package recovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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

// ErrInvalid is wrapped by every error about a record the core cannot use
// (a missing field, an unparseable schedule): a service dead-letters it,
// simulate writes an error record.
var ErrInvalid = errors.New("invalid input")

// Input is one record for the core: exactly one field is set. TaskSeq is
// the task's sequence in FAILBUS_TASKS (0: the store appends it).
type Input struct {
	Health    *events.Health
	Heartbeat *events.Heartbeat
	CronSpec  *events.CronSpec
	CronRun   *events.CronRun
	Write     *events.Write
	Task      *events.Task
	TaskSeq   uint64
	Decision  *events.Decision
}

// Core is the recovery checklist, the held-task queue and the outage probes
// (CONTRACT.md § "Recovery"; see the package doc). Its decisions depend only
// on its inputs, `now` and the store, so `failbus simulate` (MemStore) and
// the recovery service (KV and streams) run the same code. It keeps no
// state of its own and is safe for concurrent use when its store and
// publisher are.
type Core struct {
	cfg  Config
	st   Store
	pub  Publisher
	opts Options

	// notes remembers the user notes this core wrote or found needless,
	// so the frequent inputs (heartbeats, decisions) do not read the
	// provider's record each time only to change nothing. It only skips
	// what noteUser would skip after reading.
	notesMu sync.Mutex
	notes   map[[2]string]note
}

// note is what Core.notes remembers of an agent's user entry; holding is
// only known once a decision said it.
type note struct {
	at           time.Time
	holding      bool
	holdingKnown bool
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

// invalid wraps a validation error.
func invalid(kind string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrInvalid, kind, err)
}

// Step folds one input in at now. Errors wrapping ErrInvalid are about the
// input; others about the store or publisher (retry later). Step never runs
// the checklist itself: Advance does.
func (c *Core) Step(ctx context.Context, in Input, now time.Time) error {
	switch {
	case in.Health != nil:
		h := *in.Health
		if err := h.Validate(); err != nil {
			return invalid("health", err)
		}
		if h.At.IsZero() {
			h.At = events.At(now)
		}
		_, err := c.update(ctx, h.Provider, func(r *ProviderRecord) (bool, error) { return c.applyHealth(r, h), nil })
		return err
	case in.Heartbeat != nil:
		h := *in.Heartbeat
		if err := h.Validate(); err != nil {
			return invalid("heartbeat", err)
		}
		if h.At.IsZero() {
			h.At = events.At(now)
		}
		if err := c.st.PutHeartbeat(ctx, h); err != nil {
			return err
		}
		return c.noteUser(ctx, h.Provider, h.Agent, h.At.Time, nil)
	case in.CronSpec != nil:
		s := *in.CronSpec
		if err := s.Validate(); err != nil {
			return invalid("cron_spec", err)
		}
		if s.At.IsZero() {
			s.At = events.At(now)
		}
		if err := c.st.PutCronSpec(ctx, s); err != nil {
			return err
		}
		return c.noteUser(ctx, s.Provider, s.Agent, s.At.Time, nil)
	case in.CronRun != nil:
		r := *in.CronRun
		if err := r.Validate(); err != nil {
			return invalid("cron_run", err)
		}
		if r.At.IsZero() {
			r.At = events.At(now)
		}
		if err := c.st.NoteCronRun(ctx, r); err != nil {
			return err
		}
		return c.noteUser(ctx, r.Provider, r.Agent, r.At.Time, nil)
	case in.Write != nil:
		w := *in.Write
		if err := w.Validate(); err != nil {
			return invalid("write", err)
		}
		if w.At.IsZero() {
			w.At = events.At(now)
		}
		if err := c.st.NoteWrite(ctx, w); err != nil {
			return err
		}
		return c.noteUser(ctx, w.Provider, w.Agent, w.At.Time, nil)
	case in.Decision != nil:
		d := in.Decision
		if d.Provider == "" || d.Agent == "" {
			return nil
		}
		holding := d.Action == events.ActionWaitProvider
		at := d.At.Time
		if at.IsZero() {
			at = now
		}
		return c.noteUser(ctx, d.Provider, d.Agent, at, &holding)
	case in.Task != nil:
		t := *in.Task
		if err := t.Validate(); err != nil {
			return invalid("task", err)
		}
		if t.At.IsZero() {
			t.At = events.At(now)
		}
		seq := in.TaskSeq
		if seq == 0 {
			app, ok := c.st.(TaskAppender)
			if !ok {
				return errors.New("recovery: a task without its stream sequence")
			}
			var err error
			if seq, err = app.AppendTask(ctx, t, now); err != nil {
				return err
			}
		}
		return c.task(ctx, t, seq, now)
	}
	return invalid("input", errors.New("empty"))
}

// applyHealth folds a health record into the provider's record (rules 1 and
// "flapping" of the package doc). It reports whether r changed.
func (c *Core) applyHealth(r *ProviderRecord, h events.Health) bool {
	if !r.HealthAt.IsZero() && h.At.Before(r.HealthAt.Time) {
		return false // older than what was applied: a late redelivery
	}
	changed := r.Health != h.State || !r.HealthAt.Equal(h.At.Time)
	r.Health, r.HealthAt = h.State, h.At
	switch h.State {
	case events.HealthOutage:
		if r.Down {
			return changed // recovery interrupted: the same outage goes on
		}
		r.Down = true
		if r.open() == nil {
			r.Episodes = append(r.Episodes, Episode{
				RecoveryID:      RecoveryID(r.Provider, h.At.Time),
				OutageStartedAt: h.At,
			})
		}
		if !r.Queue.Holding {
			r.Queue.Holding, r.Queue.Released = true, 0
		}
		r.Queue.NextAt = events.Time{} // a release under way stops; it restarts after recovery
		r.Probe = ProbeState{NextAt: events.At(h.At.Add(c.cfg.ProbeInterval))}
		return true
	case events.HealthRecovered, events.HealthHealthy:
		if !r.Down {
			return changed
		}
		r.Down = false
		if e := r.open(); e != nil {
			at := h.At
			if at.Before(e.OutageStartedAt.Time) {
				at = e.OutageStartedAt
			}
			e.RecoveredAt = at
		}
		r.Probe.NextAt, r.Probe.Pending = events.Time{}, nil // no probing a provider that is back
		return true
	}
	return changed // degraded: recovering (while Down) or rate-limited
}

// RecoveryID is "<provider>:<outage start, epoch ms>" (CONTRACT.md).
func RecoveryID(provider string, outageStart time.Time) string {
	return provider + ":" + strconv.FormatInt(outageStart.UnixMilli(), 10)
}

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

// noteUser remembers that agent used provider at `at` (a probe target).
// holding, when set, is whether its latest decision was wait_provider.
func (c *Core) noteUser(ctx context.Context, provider, agent string, at time.Time, holding *bool) error {
	if provider == "" || agent == "" || c.isProbeAgent(provider, agent) {
		return nil
	}
	key := [2]string{provider, agent}
	c.notesMu.Lock()
	last, ok := c.notes[key]
	c.notesMu.Unlock()
	if ok && (holding == nil || last.holdingKnown && *holding == last.holding) && (!at.After(last.at) || at.Sub(last.at) < c.cfg.ProbeInterval/2) {
		return nil
	}
	_, err := c.update(ctx, provider, func(r *ProviderRecord) (bool, error) {
		i := slices.IndexFunc(r.Users, func(u User) bool { return u.Agent == agent })
		u := User{Agent: agent, At: events.At(at)}
		if i >= 0 {
			old := r.Users[i]
			u.Holding = old.Holding
			if holding != nil {
				u.Holding = *holding
			}
			if u.Holding == old.Holding && (!at.After(old.At.Time) || at.Sub(old.At.Time) < c.cfg.ProbeInterval/2) {
				return false, nil // nothing worth a write
			}
			r.Users = slices.Delete(r.Users, i, i+1)
		} else if holding != nil {
			u.Holding = *holding
		}
		r.Users = slices.Insert(r.Users, 0, u)
		if len(r.Users) > MaxUsers {
			r.Users = r.Users[:MaxUsers]
		}
		return true, nil
	})
	if err == nil {
		// What the record holds now for the agent (written, or found
		// recent enough).
		n := note{at: at}
		if holding != nil {
			n.holding, n.holdingKnown = *holding, true
		} else if ok {
			n.holding, n.holdingKnown = last.holding, last.holdingKnown
		}
		if ok && last.at.After(n.at) {
			n.at = last.at
		}
		c.notesMu.Lock()
		if c.notes == nil || len(c.notes) >= maxNotes {
			c.notes = map[[2]string]note{}
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

// msgID builds a command id from its parts: printable, ':'-separated.
func msgID(parts ...string) string {
	s := strings.Join(parts, ":")
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '_'
		}
		return r
	}, s)
}

// DispatchID is the Nats-Msg-Id (and ledger id) of dispatch attempt n of a
// task: one per (task id, attempt), whoever sends it.
func DispatchID(taskID string, attempt int) string {
	return msgID("recovery", "dispatch", taskID, strconv.Itoa(attempt))
}

// CronRerunID is the id of the one re-run of (agent, cron, scheduled_at).
func CronRerunID(agent, cron string, scheduled time.Time) string {
	return msgID("recovery", "cron", agent, cron, strconv.FormatInt(scheduled.UnixMilli(), 10))
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
