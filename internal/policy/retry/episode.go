package retry

// Retry episodes of calls without a loop position.
//
// A budget is counted per (turn, step, provider, policy key): a retry
// stays in its step, and a success or a non-retryable failure ends the
// step, so the next call is a new step with a budget of its own. An
// outcome without turn and step (both 0: the simplest clients, the README's
// quick start) has no step to end, and every such call of an agent used to
// share one budget for the ledger's lifetime: eleven independent 503s got
// retries 1-10, then "retry budget exhausted".
//
// failbus's rule for them: the budget's ledger (agent, session, provider,
// policy key) holds a sequence of retry episodes. A failure continues the
// latest episode unless
//
//   - a success of the same agent, session, provider and model came after
//     the episode's latest failure (the call went through, on its retry or
//     after a switch of profile: EndEpisode marks it in the ledger), or
//   - it comes more than the policy's episode_idle after that retry came
//     due (the agent went on to other work; a retry's own failure comes
//     right after its due time, plus the call's duration).
//
// A new episode counts from retry 1 again; its retry ids keep counting
// (Record.Seq), so no id is ever issued twice. A give_up does not end an
// episode by itself. Calls that run concurrently cannot be told apart
// without turn and step (one's success ends the other's episode): such
// agents should send them.

import (
	"fmt"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// DefaultEpisodeIdle is retry.episode_idle's default: ten times the
// default max_delay, room for a retried call that times out slowly.
const DefaultEpisodeIdle = 10 * time.Minute

// Positioned reports whether c names its place in the agent loop (turn or
// step set): its budget is the step's, and episodes do not apply.
func Positioned(c events.Classification) bool { return c.Turn != 0 || c.Step != 0 }

// NewEpisode says why failure c, at now, begins a new retry episode
// instead of continuing prior's (see the top of this file); "" when it
// continues it, when prior is nil, or when c has a turn or step.
func NewEpisode(c events.Classification, prior *Record, now time.Time, p *Policy) string {
	if prior == nil || Positioned(c) {
		return ""
	}
	if prior.EndedBy != "" {
		return fmt.Sprintf("new retry episode: success %s of model %s ended the previous one at %s",
			prior.EndedBy, displayName(prior.Model), prior.EndedAt.UTC().Format(time.RFC3339))
	}
	if p != nil && p.EpisodeIdle > 0 && now.Sub(prior.DueAt.Time) > p.EpisodeIdle {
		return fmt.Sprintf("new retry episode: no failure for %s after the previous one's retry %d came due (episode_idle %s)",
			now.Sub(prior.DueAt.Time).Round(time.Second), prior.Retry, p.EpisodeIdle)
	}
	return ""
}

// EndEpisode is the ledger mark a success ends an open retry episode with:
// a copy of latest with EndedAt and EndedBy set, or nil when success s, at
// now, ends nothing — s has a turn or step, latest is nil or already
// ended, names another model, or is newer than the success (a late
// success from before the failure).
func EndEpisode(s events.Classification, latest *Record, now time.Time) *Record {
	if latest == nil || Positioned(s) || latest.EndedBy != "" || latest.Model != s.Model || now.Before(latest.At.Time) {
		return nil
	}
	out := *latest
	out.EndedAt, out.EndedBy = events.At(now), s.OutcomeID
	return &out
}

// Number is the retry's number among every retry of its ledger: the number
// in its RetryID.
func (r *Record) Number() int {
	if r.Seq > 0 {
		return r.Seq
	}
	return r.Retry
}
