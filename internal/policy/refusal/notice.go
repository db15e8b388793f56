package refusal

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

// Rule ids of the refusal tiers, named in Text.RuleID and in
// notification labels so a decision can be traced to the rule that made it.
const (
	RuleRerender = "refusal.increment.rerender"
	RuleSkip     = "refusal.history.skip"
	RuleFrozen   = "refusal.history.frozen"
	RuleLegacy   = "refusal.legacy.frozen"
)

// refusalBoundaryWords lists what counts as a boundary, the only thing that
// lets a frozen provider try the segment again.
const refusalBoundaryWords = "a boundary (compaction, fresh start, or a model, mode, tool-surface or prompt change)"

// Text is every word failbus says about one refusal state, produced by
// Notice from the same policy values the state machine runs, so the
// human, the model and the code cannot disagree.
type Text struct {
	// RuleID names the rule that decided (RuleRefusal*).
	RuleID string
	// Rule states the schedule the code runs, from the policy's delays.
	Rule string
	// Reason is what the agent hands the model (Decision.reason,
	// route skipped[].reason).
	Reason string
	// Severity, DedupeKey, Title and Text are the notification for the
	// human; they are set on every text but only sent when the event says
	// Notify.
	Severity  string
	DedupeKey string
	Title     string
	Text      string
}

// Rule is the rule in words, built from cfg: for the defaults,
// "skipped for this segment; bounded re-probes at +15m, +1h, +6h after the
// latest refusal; frozen after that until a boundary".
func Rule(cfg Config) string {
	if cfg.MaxReprobes() == 0 {
		return "skipped for this segment; no re-probes: frozen until a boundary"
	}
	ds := make([]string, len(cfg.ReprobeDelays))
	for i, d := range cfg.ReprobeDelays {
		ds[i] = "+" + refusalDur(d)
	}
	return "skipped for this segment; bounded re-probes at " + strings.Join(ds, ", ") +
		" after the latest refusal; frozen after that until a boundary"
}

// DedupeKey is `provider-refusal:<segment>:<reprobes>:<sorted provider
// ids>`: one key per state, so each state is reported once.
// providers are sorted and de-duplicated here.
func DedupeKey(segment string, reprobes int, providers []string) string {
	ids := slices.Compact(slices.Sorted(slices.Values(providers)))
	return "provider-refusal:" + segment + ":" + strconv.Itoa(reprobes) + ":" + strings.Join(ids, ",")
}

// Notice words ev for the model (Reason), for the human (Title, Text)
// and names the rule, all from cfg. peers are the provider ids for the dedupe
// key (Peers); nil means ev's provider alone.
func Notice(cfg Config, ev Event, peers []string) Text {
	if len(peers) == 0 {
		peers = []string{ev.Provider}
	}
	rule := Rule(cfg)
	nprobes := cfg.MaxReprobes()
	t := Text{
		Rule:      rule,
		Severity:  ev.Severity(),
		DedupeKey: DedupeKey(ev.Segment, ev.Reprobes, peers),
	}
	agent := ""
	if ev.Agent != "" {
		agent = " (agent " + ev.Agent + ")"
	}
	latest := refusalAt(ev.RefusedAt)

	switch {
	case ev.Action == events.ActionRerender:
		t.RuleID = RuleRerender
		t.Reason = fmt.Sprintf("%s refused the new, not yet accepted content (re-render %d of %d): quarantine it or re-render it in a neutral form, then retry %s. If the same increment is still refused after %d re-renders, %s is %s.",
			ev.Provider, ev.Rerender, cfg.MaxRerenders, ev.Provider, cfg.MaxRerenders, ev.Provider, rule)
		t.Title = fmt.Sprintf("%s refused new content in segment %s; re-render %d of %d", ev.Provider, ev.Segment, ev.Rerender, cfg.MaxRerenders)
		t.Text = fmt.Sprintf("%s refused new, not yet accepted content in context segment %s%s. The agent re-renders it (attempt %d of %d) and retries %s; if it is still refused, %s is %s.",
			ev.Provider, ev.Segment, agent, ev.Rerender, cfg.MaxRerenders, ev.Provider, ev.Provider, rule)

	case ev.Legacy:
		t.RuleID = RuleLegacy
		t.Reason = fmt.Sprintf("%s has a refusal record for this context segment without a usable refusal count: treated as frozen, nothing is sent to %s for this segment until %s. Rule: %s. Fall back to the next provider.",
			ev.Provider, ev.Provider, refusalBoundaryWords, rule)
		t.Title = fmt.Sprintf("%s frozen for segment %s: legacy refusal record", ev.Provider, ev.Segment)
		t.Text = fmt.Sprintf("%s has a refusal record for context segment %s%s without a usable refusal count, so it is treated as frozen until %s. Rule: %s.",
			ev.Provider, ev.Segment, agent, refusalBoundaryWords, rule)

	case ev.Frozen:
		t.RuleID = RuleFrozen
		used := fmt.Sprintf("its %d re-probes are used up", nprobes)
		if nprobes == 0 {
			used = "the policy allows no re-probes"
		}
		t.Reason = fmt.Sprintf("%s refused this context segment %s; %s: frozen, nothing is sent to %s for this segment until %s. Rule: %s. Fall back to the next provider.",
			ev.Provider, refusalCount(ev.Refusals, latest), used, ev.Provider, refusalBoundaryWords, rule)
		t.Title = fmt.Sprintf("%s frozen for segment %s: refused %s, no re-probes left", ev.Provider, ev.Segment, refusalTimes(ev.Refusals))
		t.Text = fmt.Sprintf("%s refused context segment %s%s %s; %s. It is frozen for this segment: nothing more is sent to %s for it until %s. Rule: %s. Only a boundary lets %s try again: compact the thread, start fresh, or change the model, mode, tools or prompt.",
			ev.Provider, ev.Segment, agent, refusalCount(ev.Refusals, latest), used, ev.Provider, refusalBoundaryWords, rule, ev.Provider)

	default:
		t.RuleID = RuleSkip
		next := refusalAt(ev.NextProbeAt)
		delay := "+" + refusalDur(refusalDelay(cfg, ev.Reprobes))
		t.Reason = fmt.Sprintf("%s refused this context segment %s; it is %s. Next probe at %s (%s after the latest refusal, re-probe %d of %d); fall back to the next provider until then.",
			ev.Provider, refusalCount(ev.Refusals, latest), rule, next, delay, ev.Reprobes+1, nprobes)
		t.Title = fmt.Sprintf("%s skipped for segment %s after a content refusal; next probe in %s", ev.Provider, ev.Segment, refusalDur(refusalDelay(cfg, ev.Reprobes)))
		t.Text = fmt.Sprintf("%s refused context segment %s%s %s. It is %s. Next probe at %s (%s after the latest refusal, re-probe %d of %d); the agent falls back to the next provider until then. You will be told again only if it freezes.",
			ev.Provider, ev.Segment, agent, refusalCount(ev.Refusals, latest), rule, next, delay, ev.Reprobes+1, nprobes)
	}
	return t
}

// Notification is the notification request for ev worded by t, stamped at.
func (t Text) Notification(ev Event, at time.Time) events.Notification {
	return events.Notification{
		DedupeKey: t.DedupeKey,
		Severity:  t.Severity,
		Title:     t.Title,
		Text:      t.Text,
		Labels: map[string]string{
			"segment":  ev.Segment,
			"provider": ev.Provider,
			"agent":    ev.Agent,
			"refusals": strconv.Itoa(ev.Refusals),
			"reprobes": strconv.Itoa(ev.Reprobes),
			"rule":     t.RuleID,
		},
		At: events.At(at),
	}
}

func refusalTimes(n int) string {
	if n == 1 {
		return "once"
	}
	return strconv.Itoa(n) + " times"
}

// refusalCount is "once, at T" or "N times, latest at T".
func refusalCount(n int, latest string) string {
	if n == 1 {
		return "once, at " + latest
	}
	return refusalTimes(n) + ", latest at " + latest
}

func refusalAt(t time.Time) string {
	if t.IsZero() {
		return "an unknown time"
	}
	return t.UTC().Format(events.JSONTimeLayout)
}

// refusalDur writes a duration the way the policy file does: "15m", "1h",
// "1h30m", "500ms", without Go's trailing "0s"/"0m".
func refusalDur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// refusalDelay is reprobe_delays[i], or zero outside the list.
func refusalDelay(cfg Config, i int) time.Duration {
	if i < 0 || i >= len(cfg.ReprobeDelays) {
		return 0
	}
	return cfg.ReprobeDelays[i]
}
