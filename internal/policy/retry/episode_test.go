package retry_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// episodeLedger plays the ledger in the pure tests: the latest record of
// the one budget an agent without turn and step spends.
type episodeLedger struct {
	t      *testing.T
	p      *retry.Policy
	latest *retry.Record
	ids    map[string]bool
}

func (l *episodeLedger) fail(id string, at time.Time) events.Decision {
	l.t.Helper()
	c := coreFailure(id, events.ClassServerError)
	c.Turn, c.Step = 0, 0
	v := retry.Decide(retry.Input{Classification: c, Policy: l.p, Prior: l.latest, Now: at, U: 0.5})
	if v.Record != nil && !v.Replayed {
		if l.ids[v.Record.RetryID] {
			l.t.Fatalf("retry id %s issued twice", v.Record.RetryID)
		}
		l.ids[v.Record.RetryID] = true
		l.latest = v.Record
	}
	return v.Decision
}

func (l *episodeLedger) succeed(id, model string, at time.Time) bool {
	s := events.Classification{OutcomeID: id, Agent: "a1", Session: "s1", Provider: "openai", Model: model, Profile: "p1", Class: events.ClassOK}
	if end := retry.EndEpisode(s, l.latest, at); end != nil {
		l.latest = end
		return true
	}
	return false
}

func newEpisodeLedger(t *testing.T) *episodeLedger {
	return &episodeLedger{t: t, p: coreMustPolicy(t, "retry: {}").RetryFor("openai"), ids: map[string]bool{}}
}

// Retry episodes: eleven independent 503s of an agent without turn and step,
// each call going through on its retry, are eleven retry episodes: each
// gets retry 1 — not retries 1-10 and then "retry budget exhausted".
func TestEpisodesWithoutTurnAndStepEndAtASuccess(t *testing.T) {
	t.Parallel()
	l := newEpisodeLedger(t)
	at := coreT0
	for i := range 11 {
		d := l.fail(fmt.Sprintf("f%d", i), at)
		if d.Action != events.ActionRetry || d.Retry != 1 {
			t.Fatalf("503 #%d: %s retry %d (%s), want retry 1 of its own episode", i+1, d.Action, d.Retry, d.Reason)
		}
		if i > 0 && !strings.Contains(d.Reason, "new retry episode: success") {
			t.Errorf("503 #%d: reason %q does not say a success ended the previous episode", i+1, d.Reason)
		}
		at = d.DueAt.Add(200 * time.Millisecond)
		if !l.succeed(fmt.Sprintf("ok%d", i), "gpt", at) {
			t.Fatalf("the success after retry %s came due ended nothing", d.RetryID)
		}
		at = at.Add(time.Second)
	}
}

// A call that keeps failing on its retries stays one episode: its budget
// still ends in give_up.
func TestAnEpisodeWithoutSuccessSpendsItsBudget(t *testing.T) {
	t.Parallel()
	l := newEpisodeLedger(t)
	at := coreT0
	for n := 1; n <= retry.DefaultMaxRetries; n++ {
		d := l.fail(fmt.Sprintf("f%d", n), at)
		if d.Action != events.ActionRetry || d.Retry != n {
			t.Fatalf("failure %d: %s retry %d, want retry %d", n, d.Action, d.Retry, n)
		}
		at = d.DueAt.Add(2 * time.Minute) // the retried call took 2 minutes to fail
	}
	if d := l.fail("last", at); d.Action != events.ActionGiveUp || !strings.Contains(d.Reason, "budget exhausted") {
		t.Fatalf("after %d retries: %s (%s), want give_up", retry.DefaultMaxRetries, d.Action, d.Reason)
	}
}

func TestEpisodeEnds(t *testing.T) {
	t.Parallel()
	t.Run("a success older than the failure ends nothing", func(t *testing.T) {
		l := newEpisodeLedger(t)
		d := l.fail("f1", coreT0)
		if l.succeed("ok", "gpt", coreT0.Add(-time.Millisecond)) {
			t.Fatal("a success from before the failure ended its episode")
		}
		if d := l.fail("f2", d.DueAt.Add(time.Second)); d.Retry != 2 {
			t.Fatalf("retry %d, want 2 (same episode)", d.Retry)
		}
	})
	t.Run("a success of another model does not end it", func(t *testing.T) {
		l := newEpisodeLedger(t)
		d := l.fail("f1", coreT0)
		if l.succeed("ok", "other-model", d.DueAt.Add(time.Second)) {
			t.Fatal("a success of another model ended the episode")
		}
	})
	t.Run("an idle gap longer than episode_idle begins a new one", func(t *testing.T) {
		l := newEpisodeLedger(t)
		d := l.fail("f1", coreT0)
		d = l.fail("f2", d.DueAt.Add(time.Second))
		if d.Retry != 2 {
			t.Fatalf("retry %d, want 2", d.Retry)
		}
		d = l.fail("f3", d.DueAt.Add(retry.DefaultEpisodeIdle+time.Second))
		if d.Retry != 1 || !strings.Contains(d.Reason, "new retry episode: no failure for") {
			t.Fatalf("after an idle gap: retry %d (%s), want retry 1 of a new episode", d.Retry, d.Reason)
		}
		if !strings.HasSuffix(d.RetryID, "-3") {
			t.Errorf("retry id %s: the ledger's third retry should end in -3", d.RetryID)
		}
	})
	t.Run("an outcome with turn and step keeps its step's budget", func(t *testing.T) {
		p := coreMustPolicy(t, "retry: {}").RetryFor("openai")
		c := coreFailure("f1", events.ClassServerError)
		v := retry.Decide(retry.Input{Classification: c, Policy: p, Now: coreT0})
		s := events.Classification{OutcomeID: "ok", Agent: "a1", Session: "s1", Turn: 1, Step: 1, Provider: "openai", Model: "gpt", Class: events.ClassOK}
		if retry.EndEpisode(s, v.Record, v.Record.DueAt.Add(time.Second)) != nil {
			t.Fatal("a success with turn and step wrote an episode end")
		}
		c2 := coreFailure("f2", events.ClassServerError)
		v2 := retry.Decide(retry.Input{Classification: c2, Policy: p, Prior: v.Record, Now: v.Record.DueAt.Add(time.Hour)})
		if v2.Decision.Retry != 2 {
			t.Fatalf("retry %d, want 2: a step's budget has no episodes", v2.Decision.Retry)
		}
	})
	t.Run("episode_idle below max_delay is refused", func(t *testing.T) {
		p, err := policy.Parse([]byte("retry: {max_delay: 5m, episode_idle: 1m}"))
		if err == nil || !strings.Contains(err.Error(), "retry.episode_idle") {
			t.Fatalf("policy %+v, error %v; want an error naming retry.episode_idle", p, err)
		}
	})
}
