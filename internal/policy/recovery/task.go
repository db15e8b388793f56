package recovery

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// task dispatches t (stored in the task stream at `stored`) at once
// (attempt 1) when its provider is up and nothing of it is held, else
// holds it: it stays in the task stream, and the provider's queue range
// grows to include it (rule "tasks are held").
func (c *Core) task(ctx context.Context, t events.Task, seq uint64, stored, now time.Time) error {
	latest, err := c.latestHealth(ctx, t.Provider)
	if err != nil {
		return err
	}
	othersDown := false
	if t.Provider == "" {
		if othersDown, err = c.anyProviderHolding(ctx); err != nil {
			return err
		}
	}
	held := false
	_, err = c.update(ctx, t.Provider, func(r *ProviderRecord) (bool, error) {
		held = false
		changed := false
		if latest != nil {
			// The bus stored a health change this record has not seen yet
			// (another consumer applies it): apply it here, idempotently.
			changed = c.applyHealth(r, *latest)
		}
		q := &r.Queue
		if !(r.Down || q.Holding || othersDown) {
			return changed, nil
		}
		held = true
		if q.Holding && seq <= q.LastSeq {
			return changed, nil // held already (a redelivery)
		}
		if !q.Holding {
			q.Holding, q.Released, q.NextAt = true, 0, events.Time{}
		}
		if q.LastSeq <= q.Cursor {
			// The first task held since the queue was last empty: the
			// range to release starts here (every earlier task was
			// dispatched or released).
			q.Cursor = seq - 1
		}
		q.LastSeq = max(q.LastSeq, seq)
		q.Held++
		return true, nil
	})
	if err != nil {
		return err
	}
	if held {
		// Indexed while held (attempt 0), so a redispatch of it (its
		// subagent killed in a checklist) carries the submitted payload
		// and supersedes the held copy (drain skips it): one live
		// dispatch per task.
		return c.indexTask(ctx, &StoredTask{Seq: seq, Task: t}, 0)
	}
	_, err = c.dispatch(ctx, &StoredTask{Seq: seq, Task: t}, 1, "submitted; "+providerWords(t.Provider)+" is up", "", now, stored, now)
	return err
}

// latestHealth is the newest health record on the bus for provider when
// the store knows one (nil otherwise).
func (c *Core) latestHealth(ctx context.Context, provider string) (*events.Health, error) {
	if provider == "" {
		return nil, nil
	}
	return c.st.LatestHealth(ctx, provider)
}

func providerWords(p string) string {
	if p == "" {
		return "no provider"
	}
	return "provider " + p
}

// anyProviderHolding reports whether some provider is down or still holds
// tasks: then a task without a provider (which belongs to every provider)
// waits too.
func (c *Core) anyProviderHolding(ctx context.Context) (bool, error) {
	names, err := c.st.ListProviders(ctx)
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if n == "" {
			continue
		}
		r, _, err := c.st.LoadProvider(ctx, n)
		if err != nil {
			return false, err
		}
		if r != nil && (r.Down || r.Queue.Holding) {
			return true, nil
		}
	}
	return false, nil
}

// dispatch sends attempt n of a stored task (once: the ledger) at `at`,
// with the checkpoint to resume from (a re-dispatch), and moves the task's
// index to that attempt. plannedAt is the earliest time it may have been
// sent before (see Core.send). It reports whether it sent.
func (c *Core) dispatch(ctx context.Context, t *StoredTask, attempt int, reason, checkpoint string, at, plannedAt, now time.Time) (bool, error) {
	d := &events.Dispatch{
		TaskID: t.Task.ID, Attempt: attempt, At: events.At(at), Agent: t.Task.Agent,
		Provider: t.Task.Provider, Kind: t.Task.Kind, Payload: t.Task.Payload, Reason: reason, Checkpoint: checkpoint,
	}
	sent, err := c.send(ctx, DispatchID(d.TaskID, attempt), events.DispatchSubject(d.Agent), d, plannedAt, now)
	if err != nil || !sent {
		return sent, err
	}
	return true, c.indexTask(ctx, t, attempt)
}

// indexTask records that attempt of t was dispatched.
func (c *Core) indexTask(ctx context.Context, t *StoredTask, attempt int) error {
	for range maxCAS {
		idx, rev, err := c.st.LoadTaskIndex(ctx, t.Task.ID)
		if err != nil {
			return err
		}
		if idx == nil {
			idx = &TaskIndex{ID: t.Task.ID, Seq: t.Seq, Agent: t.Task.Agent, Provider: t.Task.Provider}
		} else if idx.Agent != t.Task.Agent || idx.Attempt >= attempt && idx.Seq != 0 {
			return nil // another agent's task of the same id, or indexed already
		}
		idx.Attempt = max(idx.Attempt, attempt)
		if idx.Seq == 0 {
			idx.Seq = t.Seq
		}
		if err := c.st.SaveTaskIndex(ctx, idx, rev); errors.Is(err, ErrConflict) {
			continue
		} else if err != nil {
			return err
		}
		return nil
	}
	return fmt.Errorf("recovery: task index %q: %w", t.Task.ID, ErrConflict)
}

// superseded reports whether a held task was already dispatched by a
// redispatch (the index of this copy names an attempt), so releasing it
// would make a second live dispatch of one task.
func (c *Core) superseded(ctx context.Context, t *StoredTask) (bool, error) {
	idx, _, err := c.st.LoadTaskIndex(ctx, t.Task.ID)
	if err != nil || idx == nil {
		return false, err
	}
	return idx.Seq == t.Seq && idx.Agent == t.Task.Agent && idx.Attempt >= 1, nil
}

// claim claims the held task at seq for release at now, and the release
// after it for 1/drain_rate later: saved by the caller in one
// compare-and-set on the provider's record, so that across replicas no two
// releases are closer than that, whichever replica sends a claimed task or
// moves the cursor past it, and with whatever clock reading. The caller
// checked that the release is due (now is not before Queue.NextAt).
func (q *Queue) claim(seq uint64, since, now time.Time, interval time.Duration) {
	q.Sending = &Sending{Seq: seq, Since: events.At(since), At: events.At(now)}
	q.NextAt = events.At(now.Add(interval))
}

// drain releases the provider's held tasks in stream order, one per
// 1/drain_rate: at most one per call once caught up with the clock (the
// next one's time is in the record, so Advance is called again then). Each
// task is claimed with its release time before it is sent (claim); a
// claimed task is sent at that time by any driver. It returns true when
// the queue is empty and no longer holding.
func (c *Core) drain(ctx context.Context, provider string, reason string, now time.Time) (bool, error) {
	interval := time.Duration(float64(time.Second) / c.cfg.DrainRate)
	for range maxCAS * 4 {
		r, rev, err := c.st.LoadProvider(ctx, provider)
		if err != nil {
			return false, err
		}
		if r == nil || !r.Queue.Holding {
			return true, nil
		}
		q := &r.Queue
		// A task claimed with its release time is sent at that time;
		// any other waits until the next release is due.
		claim := q.claimed()
		due := q.NextAt.IsZero() || !now.Before(q.NextAt.Time)
		if claim == nil && !due {
			return false, nil
		}
		var tasks []StoredTask
		if q.LastSeq > q.Cursor {
			if tasks, err = c.st.TasksAfter(ctx, provider, q.Cursor, q.LastSeq, 1); err != nil {
				return false, err
			}
		}
		if len(tasks) == 0 {
			// Nothing left up to the last held task: stop holding, unless a
			// task was held meanwhile (then the save conflicts and the loop
			// goes on with it).
			q.Cursor, q.Holding, q.Held = q.LastSeq, false, 0
			if _, err := c.st.SaveProvider(ctx, r, rev); errors.Is(err, ErrConflict) {
				continue
			} else if err != nil {
				return false, err
			}
			return true, nil
		}
		t := tasks[0]
		if claim == nil || claim.Seq != t.Seq {
			if !due {
				return false, nil // not this task's claim: it waits its turn
			}
			if q.Sending != nil && q.Sending.Seq == t.Seq {
				// Claimed without a release time (by an older version):
				// claim it again, with one, keeping since when its
				// dispatch may be in the stream.
				q.claim(t.Seq, q.Sending.Since.Time, now, interval)
				if _, err := c.st.SaveProvider(ctx, r, rev); err != nil && !errors.Is(err, ErrConflict) {
					return false, err
				}
				continue
			}
			superseded, err := c.superseded(ctx, &t)
			if err != nil {
				return false, err
			}
			if superseded {
				// Redispatched in a checklist (its subagent was killed):
				// that attempt is the task's live dispatch; this copy is
				// passed over, not released.
				q.Cursor, q.Held = t.Seq, max(q.Held-1, 0)
				if _, err := c.st.SaveProvider(ctx, r, rev); err != nil && !errors.Is(err, ErrConflict) {
					return false, err
				}
				continue
			}
			// Claim the task and its release time before sending it, in
			// one compare-and-set (claim). A driver that resumes after a
			// crash between send and cursor update knows since when the
			// dispatch may be in the stream (the dedupe-window check),
			// however the queue's times moved meanwhile.
			q.claim(t.Seq, now, now, interval)
			if _, err := c.st.SaveProvider(ctx, r, rev); err != nil && !errors.Is(err, ErrConflict) {
				return false, err
			}
			continue
		}
		// Claimed, with its release time: sent at that time whoever sends
		// it, even when this driver's clock reading is older or newer.
		sent, err := c.dispatch(ctx, &t, 1, reason, "", claim.At.Time, claim.Since.Time, now)
		if err != nil {
			return false, err
		}
		// mine: this copy of the task was released by this queue, now or
		// before a crash that came between sending and saving (then the
		// ledger has it and the index points at this copy). A second copy
		// of a task id (re-submitted after the dedupe window) is skipped
		// and not counted.
		mine := sent
		if !sent {
			idx, _, err := c.st.LoadTaskIndex(ctx, t.Task.ID)
			if err != nil {
				return false, err
			}
			mine = idx == nil || idx.Seq == t.Seq
		}
		if _, err := c.update(ctx, provider, func(r *ProviderRecord) (bool, error) {
			q := &r.Queue
			if q.Cursor >= t.Seq {
				return false, nil
			}
			q.Cursor = t.Seq
			if s := q.Sending; s != nil && s.Seq == t.Seq && !mine {
				// Nothing went out at this claim's time (a second copy of
				// a task id): the next task may have it.
				q.NextAt = s.At
			}
			q.Sending = nil
			q.Held = max(q.Held-1, 0)
			if mine {
				q.Released++
			}
			return true, nil
		}); err != nil {
			return false, err
		}
	}
	return false, fmt.Errorf("recovery: drain %q: %w", provider, ErrConflict)
}
