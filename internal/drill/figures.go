package drill

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/failbus/failbus/internal/chaos"
	"github.com/failbus/failbus/pkg/events"
)

// Reasons a call was wasted (the fields of Waste), checked in this order:
// a call is counted under the first that applies.
const (
	// WasteOutage: sent to the provider during its outage, other than a
	// probe the bus asked for.
	WasteOutage = "outage"
	// WastePastCap: sent with a key past its cap, after the first call
	// that found it capped.
	WastePastCap = "past_cap"
	// WasteRefusedResent: a segment re-sent to the provider that already
	// refused it.
	WasteRefusedResent = "refused_resent"
	// WasteNonRetryable: the same prompt re-sent with the same key to the
	// same provider after a non-retryable error (a 4xx other than 408,
	// 409 and a rate limit).
	WasteNonRetryable = "nonretryable_retried"
)

// Waste is a row's wasted calls by reason, their total and the prompt
// tokens they carried.
type Waste struct {
	Outage              int `json:"outage"`
	PastCap             int `json:"past_cap"`
	RefusedResent       int `json:"refused_resent"`
	NonretryableRetried int `json:"nonretryable_retried"`
	Total               int `json:"total"`
	PromptTokens        int `json:"prompt_tokens"`
}

func (w *Waste) add(reason string, tokens int) {
	switch reason {
	case WasteOutage:
		w.Outage++
	case WastePastCap:
		w.PastCap++
	case WasteRefusedResent:
		w.RefusedResent++
	case WasteNonRetryable:
		w.NonretryableRetried++
	}
	w.Total++
	w.PromptTokens += tokens
}

// Row is one strategy's figures: a row of the table and of --json. The
// TypeScript client's drill (clients/typescript/test/drill.ts) writes
// rows with the same JSON names; a figure a row does not carry is shown
// as "—". Times are timeline seconds unless named otherwise.
type Row struct {
	// Strategy names the strategy (StrategySDK, StrategyFailbus; the
	// TypeScript drill's "openai", "pi", "call"), Label says what it is
	// in words, Client is the language ("go", "typescript").
	Strategy string `json:"strategy"`
	Label    string `json:"label"`
	Client   string `json:"client"`
	// CountedFrom is "provider" (the chaos server's log) or "client"
	// (what the fleet sent, against a real provider).
	CountedFrom string `json:"counted_from,omitempty"`

	// Tasks, Completed and Lost: every task is completed or lost by the
	// end of the run; LostBy says why, by reason; CompletedTwice counts
	// tasks completed more than once.
	Tasks          int            `json:"tasks"`
	Completed      int            `json:"completed"`
	Lost           int            `json:"lost"`
	LostBy         map[string]int `json:"lost_by,omitempty"`
	CompletedTwice int            `json:"completed_twice"`

	// Calls is what the provider received, Probes those of them that
	// were probes the bus asked for, SDKRetries those an SDK sent as its
	// own retry (X-Stainless-Retry-Count ≥ 1).
	Calls      int `json:"calls"`
	Probes     int `json:"probes"`
	SDKRetries int `json:"sdk_retries"`
	// Wasted are the calls that could not have helped.
	Wasted Waste `json:"wasted"`
	// CallsPerCompleted is Calls / Completed (0 when none completed).
	CallsPerCompleted float64 `json:"calls_per_completed_task"`
	// Burst is the most calls the outage's provider got within one
	// second after it came back, at BurstAt: in the minute after the
	// outage, or until the next window opens if that is sooner.
	Burst   int     `json:"burst_after_recovery"`
	BurstAt float64 `json:"burst_at_s"`
	// Hung counts the calls whose answer lasted more than 1.5 × the
	// stall window (StallSeconds): hung, nobody ended them.
	Hung         int     `json:"hung_calls"`
	StallSeconds float64 `json:"stall_window_s"`
	// Notifications are the messages to humans: for a strategy on the bus
	// what its notifier sent, otherwise a page per failure the agents saw
	// (NotificationsAre says which).
	Notifications    int    `json:"notifications"`
	NotificationsAre string `json:"notifications_are"`
	// RecoveryToLastDone is the time from the end of the outage to the
	// completion of the last task of the outage's provider that arrived
	// before that end; -1 when none completed after it.
	RecoveryToLastDone float64 `json:"recovery_to_last_done_s"`

	// Crashed counts the subagents that crashed in the outage (the plan's
	// crashes that were running); Killed the kills recovery sent, of
	// which WronglyKilled hit a subagent that was alive.
	Crashed       int `json:"subagents_crashed"`
	Killed        int `json:"subagents_killed"`
	WronglyKilled int `json:"subagents_wrongly_killed"`
	// Crons: scheduled runs (those the end of the run cut short left
	// out), re-run after an outage, missed for good (no successful run).
	// WritesRedone: memory writes redone after a check_write.
	CronsScheduled int `json:"crons_scheduled"`
	CronsRerun     int `json:"crons_rerun"`
	CronsMissed    int `json:"crons_missed"`
	WritesRedone   int `json:"writes_redone"`
	// RestartTokens are the prompt tokens of steps sent again after they
	// had been answered (a restarted task redoing done work);
	// CheckpointTokens those a restart from scratch would have re-sent
	// and the checkpoints saved.
	RestartTokens    int `json:"tokens_resent_after_restarts"`
	CheckpointTokens int `json:"tokens_saved_by_checkpoints"`

	// Refused counts the calls the providers refused (the first of a
	// segment included).
	Refused int `json:"refused_calls"`

	// Bus side (strategies on the bus): when it declared the outage and
	// the recovery (when the bus stored them; -1 when it did not), the
	// attempts the fleet began on the outage's provider between the two
	// while the outage lasted, other than probes (the promise is none),
	// the outages and recoveries it declared ("provider state@seconds")
	// and how often each provider's health went between degraded and
	// healthy, tasks re-dispatched, streams restarted.
	OutageDeclared   float64  `json:"outage_declared_s,omitempty"`
	RecoveryDeclared float64  `json:"recovery_declared_s,omitempty"`
	CallsWhileDown   int      `json:"calls_while_known_down"`
	Health           []string `json:"health,omitempty"`
	Redispatched     int      `json:"redispatched"`
	StreamRestarts   int      `json:"stream_restarts"`
	// Call is what the TypeScript drill's `call` row reports of its
	// promises; the Go failbus row fills it as well.
	Call *CallFigures `json:"call,omitempty"`

	UnmatchedRequests int    `json:"unmatched_requests"`
	AgentErrors       int    `json:"agent_errors,omitempty"`
	LastAgentError    string `json:"last_agent_error,omitempty"`

	// Seconds is how long the run took on the machine's clock.
	Seconds float64 `json:"seconds"`

	// present are the JSON names a row read from elsewhere carries (nil:
	// a row of this drill, which carries all).
	present map[string]bool
}

// CallFigures are the checks of a strategy on the bus, as the TypeScript
// drill names them.
type CallFigures struct {
	// CallsWhileHeld: attempts other than probes an agent made to the
	// provider while it was held on it (the Go row: while the bus knew it
	// was down).
	CallsWhileHeld int `json:"calls_while_held"`
	// OutageCallsAfterDeclared: calls other than probes the outage
	// answered that arrived after the bus declared it.
	OutageCallsAfterDeclared int `json:"outage_calls_after_declared"`
	// OutageDeclaredMS is when the bus declared the outage, in ms after
	// the run started; nil when it did not.
	OutageDeclaredMS *int64 `json:"outage_declared_ms"`
	// Decisions the fleet got, by action.
	Decisions map[string]int `json:"decisions"`
}

// Has reports whether the row carries the figure of JSON name key.
func (r Row) Has(key string) bool { return r.present == nil || r.present[key] }

// onBus reports a row of a strategy on the bus.
func (r Row) onBus() bool { return r.Strategy == StrategyFailbus || r.Call != nil }

// routeSlack is how old the refusal route's answer an attempt goes on
// may be, for calls_while_known_down: the time between the answer and
// the attempt's start on a loaded machine.
const routeSlack = 100 * time.Millisecond

// clients says what each Go strategy is made of.
var clients = map[string]string{
	StrategySDK:     "go: openai-go + anthropic-sdk-go, their own retries (2)",
	StrategyFailbus: "go: the same SDKs, retries off, each call under failbus Call",
}

// nonRetryable reports a status no retry can change (a 4xx other than
// 408, 409 and 429; a 429 that is a quota is counted as a capped key).
func nonRetryable(status int) bool {
	return status >= 400 && status < 500 && status != 408 && status != 409 && status != 429
}

// figures counts a run's row from the provider's log (or the client's,
// fromServer false), the ledger, the tracker and the bus.
func (r *run) figures(log chaos.Log, fromServer bool, bus *busFigures) Row {
	cfg, tl := r.cfg, r.cfg.Timeline
	outage, _ := tl.Fault(WindowOutage)
	row := Row{
		Strategy: r.strategy, Label: clients[r.strategy], Client: "go", CountedFrom: "provider",
		Tasks: r.plan.Tasks, Calls: len(log),
		StallSeconds: r.cfg.stallWall().Seconds() / cfg.Scale,
	}
	if !fromServer {
		row.CountedFrom = "client"
	}
	offset := func(t time.Time) float64 {
		if t.IsZero() {
			return -1
		}
		return math.Round(float64(t.Sub(r.start))/cfg.Scale/float64(time.Millisecond)) / 1000
	}
	if bus != nil && !bus.OutageAt.IsZero() {
		row.OutageDeclared, row.RecoveryDeclared = offset(bus.OutageAt), offset(bus.RecoveredAt)
		// The attempts the fleet began on the provider while the bus
		// said it was down, other than probes: from routeSlack after it
		// stored the outage, since an attempt goes on a route answer that
		// may be that old (check, then act).
		known := bus.OutageAt.Add(routeSlack)
		until := r.wallAt(outage.To)
		if !bus.RecoveredAt.IsZero() && bus.RecoveredAt.Before(until) {
			until = bus.RecoveredAt
		}
		for _, q := range r.ledger.sent() {
			b := q.intent.Began
			if q.Provider == ProviderOpenAI && q.intent.Kind != kindProbe && !b.Before(known) && b.Before(until) {
				row.CallsWhileDown++
			}
		}
	}

	type segment struct{ task, provider, fp string }
	type sent struct{ provider, fp, key string }
	type stepKey struct {
		task string
		step int
	}
	cappedSeen := map[string]bool{}
	refused := map[segment]bool{}
	rejected := map[sent]bool{}
	answered := map[stepKey]int{} // tokens of a step's first answer
	hungAfter := time.Duration(1.5 * float64(r.cfg.stallWall()))
	for _, q := range log {
		in, known := r.ledger.intent(q.Fingerprint)
		if !known {
			row.UnmatchedRequests++
		}
		if q.SDKRetry > 0 {
			row.SDKRetries++
		}
		if q.Duration > hungAfter {
			row.Hung++
		}
		isProbe := in.Kind == kindProbe
		if isProbe {
			row.Probes++
		}
		if q.Fault == chaos.KindRefusal {
			row.Refused++
		}
		waste := ""
		seg := segment{task: in.Task, provider: q.Provider}
		if in.Task == "" {
			seg.fp = q.Fingerprint
		}
		s := sent{q.Provider, q.Fingerprint, q.Key}
		switch {
		case fromServer && q.Provider == ProviderOpenAI && q.Offset >= outage.From && q.Offset < outage.To && !isProbe:
			waste = WasteOutage
		case q.Window == WindowCapped || !fromServer && isQuota(q):
			if cappedSeen[q.Key] {
				waste = WastePastCap
			}
			cappedSeen[q.Key] = true
		case q.Fault == chaos.KindRefusal:
			if refused[seg] {
				waste = WasteRefusedResent
			}
			refused[seg] = true
		case rejected[s]:
			waste = WasteNonRetryable
		}
		if nonRetryable(q.Status) {
			rejected[s] = true
		}
		r.wasteOf = append(r.wasteOf, waste)
		if waste != "" {
			row.Wasted.add(waste, q.Tokens)
		}
		if in.Kind == kindStep {
			k := stepKey{in.Task, in.Step}
			ok := q.Status == 200 && q.Done && !q.Aborted && q.Fault != chaos.KindRefusal && q.Error == ""
			if _, done := answered[k]; done {
				row.RestartTokens += q.Tokens
			} else if ok {
				answered[k] = q.Tokens
			}
		}
	}
	if fromServer {
		var at time.Duration
		row.Burst, at = log.Where(func(q chaos.Request) bool { return q.Provider == ProviderOpenAI }).Peak(time.Second, outage.To, burstEnd(tl, outage))
		row.BurstAt = math.Round(at.Seconds()*10) / 10
	}
	r.track.mu.Lock()
	resumed := maps.Clone(r.track.resumed)
	r.track.mu.Unlock()
	for task, step := range resumed {
		for k := 1; k <= step; k++ {
			row.CheckpointTokens += answered[stepKey{task, k}]
		}
	}

	c := r.track.counts(r.plan)
	row.Completed, row.Lost, row.CompletedTwice, row.LostBy = c.done, c.lost, c.twice, c.why
	if row.Completed > 0 {
		row.CallsPerCompleted = math.Round(float64(row.Calls)/float64(row.Completed)*100) / 100
	}
	row.RecoveryToLastDone = -1
	if last := r.lastDoneOf(ProviderOpenAI, outage.To); last > outage.To {
		row.RecoveryToLastDone = math.Round((last-outage.To).Seconds()*10) / 10
	}
	t := r.track
	t.mu.Lock()
	row.Crashed, row.Killed, row.WronglyKilled = t.crashed, t.killed, t.wronglyKilled
	row.CronsScheduled, row.CronsRerun, row.WritesRedone = t.cronRuns-t.cronsCut, t.cronsRerun, t.writesRedone
	row.CronsMissed = max(row.CronsScheduled-len(t.cronOK), 0)
	row.StreamRestarts = t.restarts
	decisions := maps.Clone(t.decisions)
	pages := t.pages
	t.mu.Unlock()
	if bus != nil {
		row.Notifications, row.NotificationsAre = bus.NotifySent, fmt.Sprintf("sent by the notifier (%d asked for, %d held by the daily budget)", bus.NotifyRequests, bus.NotifyHeld)
		row.Redispatched, row.AgentErrors, row.LastAgentError = bus.Redispatched, bus.AgentErrors, bus.LastAgentError
		row.Call = &CallFigures{CallsWhileHeld: row.CallsWhileDown, Decisions: decisions}
		if !bus.OutageAt.IsZero() {
			ms := bus.OutageAt.Sub(r.start).Milliseconds()
			row.Call.OutageDeclaredMS = &ms
			for _, q := range log {
				in, _ := r.ledger.intent(q.Fingerprint)
				if q.Window == WindowOutage && in.Kind != kindProbe && q.At.After(bus.OutageAt) {
					row.Call.OutageCallsAfterDeclared++
				}
			}
		}
		flaps := map[string]int{}
		for _, h := range bus.Health {
			if h.State == events.HealthOutage || h.State == events.HealthRecovered {
				row.Health = append(row.Health, fmt.Sprintf("%s %s@%.1fs", h.Provider, h.State, offset(h.At)))
			} else {
				flaps[h.Provider]++
			}
		}
		for _, p := range slices.Sorted(maps.Keys(flaps)) {
			row.Health = append(row.Health, fmt.Sprintf("%s: %d changes between degraded and healthy", p, flaps[p]))
		}
	} else {
		row.Notifications, row.NotificationsAre = pages, "pages: one per failure an agent saw (a task failed, a cron run failed)"
	}
	return row
}

// isQuota reports a quota answer seen by the client (real providers).
func isQuota(q chaos.Request) bool { return q.Status == 402 }

// lastDoneOf is the latest completion (timeline time) of a task of a
// provider's agents that arrived before cutoff.
func (r *run) lastDoneOf(provider string, cutoff time.Duration) time.Duration {
	t := r.track
	t.mu.Lock()
	defer t.mu.Unlock()
	var last time.Duration
	for _, a := range r.plan.Agents {
		if a.Primary != provider {
			continue
		}
		for _, task := range a.Tasks {
			if s := t.tasks[task.ID]; task.Arrival < cutoff && s.state == taskDone {
				last = max(last, s.doneAt)
			}
		}
	}
	return last
}

// burstEnd is the end of the span the burst after an outage is measured
// in: a minute after it, or the next window's opening if sooner (a storm
// right after would be counted as the recovery's burst).
func burstEnd(tl *chaos.Timeline, outage chaos.Fault) time.Duration {
	end := outage.To + time.Minute
	for _, f := range tl.Faults {
		if f.From > outage.To && f.From < end {
			end = f.From
		}
	}
	return end
}
