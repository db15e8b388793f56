package recovery

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/failbus/failbus/internal/policy/recovery/checklist"
	"github.com/failbus/failbus/pkg/events"
)

// plan decides one checklist step: its result (kept in the episode for the
// steps after it and in the step's record) and its commands, the record
// last. Nothing is sent here.
func (c *Core) plan(ctx context.Context, r *ProviderRecord, e *Episode, step string, now time.Time) (*Plan, error) {
	p := &Plan{Step: step, At: events.At(now)}
	rec := c.record(r, e, step, now)
	switch step {
	case events.StepSubagents, events.StepKill, events.StepCrons:
		ok, err := c.st.CaughtUp(ctx)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, ErrLagging
		}
	}
	switch step {
	case events.StepConfirm:
	case events.StepSubagents:
		hbs, err := c.st.LatestHeartbeats(ctx)
		if err != nil {
			return nil, err
		}
		e.Subagents = checklist.RunningSubagents(c.cfg.Limits(), r.Provider, hbs, now)
		e.Counts.Subagents = len(e.Subagents)
		rec.Subagents = e.Subagents
	case events.StepKill:
		hbs, err := c.st.LatestHeartbeats(ctx)
		if err != nil {
			return nil, err
		}
		for _, k := range checklist.StaleSubagents(c.cfg.Limits(), e.Subagents, hbs, now) {
			id := KillID(k.Agent, k.Subagent, k.LastHeartbeatAt.Time)
			sent, err := c.st.Sent(ctx, id)
			if err != nil {
				return nil, err
			}
			if sent {
				continue // killed already, by another provider's run (a subagent without a provider)
			}
			e.Killed = append(e.Killed, k)
			p.Commands = append(p.Commands, Command{
				ID:      id,
				Subject: events.ControlSubject(k.Agent),
				Control: &events.Control{
					At: events.At(now), Agent: k.Agent, Action: events.ControlKill, RecoveryID: e.RecoveryID,
					Subagent: k.Subagent, TaskID: k.TaskID,
					Reason: fmt.Sprintf("no heartbeat since %s: it stopped during the outage of %s but its status still says running", clock(k.LastHeartbeatAt.Time), r.Provider),
				},
			})
		}
		e.Counts.Killed = len(e.Killed)
		rec.Killed = e.Killed
	case events.StepCrons:
		crons, err := c.st.CronStates(ctx)
		if err != nil {
			return nil, err
		}
		runs, err := c.st.CronRuns(ctx, e.OutageStartedAt.Add(-c.opts.ReportWindow))
		if err != nil {
			return nil, err
		}
		var sentErr error
		rerun, missed, nMissed := checklist.MissedCrons(c.cfg.Limits(), r.Provider, e.OutageStartedAt.Time, e.RecoveredAt.Time, crons, runs, func(agent, cron string, scheduled time.Time) bool {
			sent, err := c.st.Sent(ctx, CronRerunID(agent, cron, scheduled))
			if err != nil && sentErr == nil {
				sentErr = err
			}
			return sent
		})
		if sentErr != nil {
			return nil, sentErr
		}
		e.Counts.CronsRerun, e.Counts.CronsMissed = len(rerun), nMissed
		rec.CronsRerun, rec.CronsMissed = rerun, missed
		for _, cr := range rerun {
			p.Commands = append(p.Commands, Command{
				ID:      CronRerunID(cr.Agent, cr.Cron, cr.ScheduledAt.Time),
				Subject: events.ControlSubject(cr.Agent),
				Control: &events.Control{
					At: events.At(now), Agent: cr.Agent, Action: events.ControlRunCron, RecoveryID: e.RecoveryID,
					Cron: cr.Cron, ScheduledAt: cr.ScheduledAt,
					Reason: fmt.Sprintf("its run scheduled at %s fell in the outage of %s and has no ok run: %s", clock(cr.ScheduledAt.Time), r.Provider, cr.Why),
				},
			})
		}
		for i := range rec.CronsRerun {
			rec.CronsRerun[i].Why = ""
		}
	case events.StepWrites:
		writes, err := c.st.WritesSince(ctx, e.OutageStartedAt.Add(-c.opts.ReportWindow))
		if err != nil {
			return nil, err
		}
		failed, why := checklist.FailedWrites(r.Provider, e.OutageStartedAt.Time, e.RecoveredAt.Time, writes)
		for i, w := range failed {
			id := WriteCheckID(w.Agent, w.Key, w.FailedAt.Time)
			sent, err := c.st.Sent(ctx, id)
			if err != nil {
				return nil, err
			}
			if sent {
				continue // checked already, by another provider's run (a write without a provider)
			}
			rec.Writes = append(rec.Writes, w)
			p.Commands = append(p.Commands, Command{
				ID:      id,
				Subject: events.ControlSubject(w.Agent),
				Control: &events.Control{
					At: events.At(now), Agent: w.Agent, Action: events.ControlCheckWrite, RecoveryID: e.RecoveryID, Key: w.Key,
					Reason: fmt.Sprintf("write failed at %s during the outage of %s%s and was not written again since: check it is there, redo it if not", clock(w.FailedAt.Time), r.Provider, why[i]),
				},
			})
		}
		e.Counts.Writes = len(rec.Writes)
	case events.StepRedispatch:
		seen := map[string]bool{}
		for _, k := range e.Killed {
			if k.TaskID == "" || seen[k.TaskID] {
				continue
			}
			seen[k.TaskID] = true
			d, err := c.redispatch(ctx, r.Provider, k, now)
			if err != nil {
				return nil, err
			}
			rec.Redispatched = append(rec.Redispatched, events.TaskRef{TaskID: d.TaskID, Attempt: d.Attempt})
			p.Commands = append(p.Commands, Command{ID: DispatchID(d.TaskID, d.Attempt), Subject: events.DispatchSubject(d.Agent), Dispatch: d})
		}
		e.Counts.Redispatched = len(rec.Redispatched)
	case events.StepRelease:
		// Commands are planned once the held tasks are released
		// (finishRelease).
		p.Draining = true
		return p, nil
	default:
		return nil, fmt.Errorf("unknown step %q", step)
	}
	p.Commands = append(p.Commands, c.recordCommand(rec))
	return p, nil
}

// redispatch plans the next attempt of a killed subagent's task: one more
// than the latest attempt dispatched (the index, then the ledger, which is
// the truth when an index update was lost), 2 for a task the bus never
// dispatched (a subagent ran it, so that was its first attempt): a task
// still held is dispatched now with its payload, and its held copy is
// passed over when the queue is released. Only the killed subagent's own
// agent's task: a task id another agent submitted is never touched (the
// subject is the identity; task ids are the agents' own).
func (c *Core) redispatch(ctx context.Context, provider string, k events.SubagentRef, now time.Time) (*DispatchRef, error) {
	d := &DispatchRef{TaskID: k.TaskID, Agent: k.Agent, Provider: provider, At: events.At(now), Attempt: 2, Subagent: k.Subagent}
	idx, _, err := c.st.LoadTaskIndex(ctx, k.TaskID)
	if err != nil {
		return nil, err
	}
	if idx != nil && idx.Agent == k.Agent {
		d.Seq, d.Provider = idx.Seq, idx.Provider
		d.Attempt = max(idx.Attempt+1, 2)
	}
	for {
		sent, err := c.st.Sent(ctx, DispatchID(d.TaskID, d.Attempt))
		if err != nil {
			return nil, err
		}
		if !sent {
			break
		}
		d.Attempt++
	}
	d.Reason = fmt.Sprintf("redispatched: subagent %s of agent %s was killed after the outage of %s (no heartbeat since %s)",
		k.Subagent, k.Agent, provider, clock(k.LastHeartbeatAt.Time))
	if d.Seq == 0 {
		d.Reason += "; the bus never saw this task, so no payload"
	}
	return d, nil
}

// record is the common part of a step's record.
func (c *Core) record(r *ProviderRecord, e *Episode, step string, now time.Time) *events.Recovery {
	return &events.Recovery{
		RecoveryID: e.RecoveryID, At: events.At(now), Provider: r.Provider,
		OutageStartedAt: e.OutageStartedAt, RecoveredAt: e.RecoveredAt, Step: step,
	}
}

func (c *Core) recordCommand(rec *events.Recovery) Command {
	return Command{ID: msgID("recovery", rec.RecoveryID, rec.Step), Subject: events.RecoverySubject(rec.Provider), Recovery: rec}
}

// count is n and word, in the plural unless n is 1 ("1 task").
func count(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// notification is the one normal notification at the end of a run.
func (c *Core) notification(provider string, e *Episode, now time.Time) Command {
	n := e.Counts
	return Command{
		ID:      msgID("recovery", e.RecoveryID, "notify"),
		Subject: events.NotifySubject(events.SeverityNormal),
		Notification: &events.Notification{
			DedupeKey: NotificationKey(provider, e.OutageStartedAt.Time),
			Severity:  events.SeverityNormal,
			Title:     "recovery checklist done for " + provider,
			Text: fmt.Sprintf("After the outage of %s from %s to %s (%s): %s found, %d killed; %s re-run, %d listed as missed; %s to check; %s re-dispatched; %s released. Each step is recorded on %s.",
				provider, clock(e.OutageStartedAt.Time), clock(e.RecoveredAt.Time), e.RecoveredAt.Sub(e.OutageStartedAt.Time).Round(time.Second),
				count(n.Subagents, "running subagent"), n.Killed, count(n.CronsRerun, "missed cron run"), n.CronsMissed,
				count(n.Writes, "failed write"), count(n.Redispatched, "task"), count(n.Released, "held task"), events.RecoverySubject(provider)),
			Labels: map[string]string{"provider": provider, "recovery_id": e.RecoveryID},
			At:     events.At(now),
		},
	}
}
