package scope

// The words of the fault scope: notification requests for profile and
// model faults, and the small formatters every notice uses.

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
)

func (s *ProviderState) profileFaultNotice(c events.Classification, e *Entry, target string, now time.Time) events.Notification {
	what := "No other profile of " + s.Provider + " is known to work."
	if target != "" {
		what = "Profile " + target + " works: agents that reported it switch to it."
	}
	return events.Notification{
		DedupeKey: "profile-fault:" + s.Provider + ":" + c.Profile + ":" + c.Class + ":" + millis(e.FaultSince),
		Severity:  events.SeverityNormal,
		Title:     fmt.Sprintf("profile %s of %s fails with %s", displayName(c.Profile), s.Provider, c.Class),
		Text:      fmt.Sprintf("The credential %s of %s fails with %s since %s: refresh or replace it. %s", displayName(c.Profile), s.Provider, c.Class, clock(e.FaultSince.Time), what),
		Labels:    map[string]string{"provider": s.Provider, "profile": c.Profile, "class": c.Class},
		At:        events.At(now),
	}
}

func (s *ProviderState) modelFaultNotice(c events.Classification, e *Entry, target string, now time.Time) events.Notification {
	what := "No other model of " + s.Provider + " is known to work."
	if target != "" {
		what = "Agents switch to model " + target + "."
	}
	return events.Notification{
		DedupeKey: "model-fault:" + s.Provider + ":" + c.Model + ":" + millis(e.FaultSince),
		Severity:  events.SeverityNormal,
		Title:     fmt.Sprintf("model %s of %s fails with %s", c.Model, s.Provider, c.Class),
		Text:      fmt.Sprintf("Model %s of %s rejects requests with %s since %s (the model, not the provider: other models are unaffected). %s", c.Model, s.Provider, c.Class, clock(e.FaultSince.Time), what),
		Labels:    map[string]string{"provider": s.Provider, "model": c.Model, "class": c.Class},
		At:        events.At(now),
	}
}

// modelEscalation reports a second (or further) model of the provider in a
// model-fault episode: the fallback fails the same way.
func (s *ProviderState) modelEscalation(c events.Classification, now time.Time) (events.Notification, bool) {
	var models []string
	var first events.Time
	for name, e := range s.Models {
		if e.FaultSince.IsZero() {
			continue
		}
		models = append(models, name)
		if first.IsZero() || e.FaultSince.Before(first.Time) {
			first = e.FaultSince
		}
	}
	if len(models) < 2 {
		return events.Notification{}, false
	}
	sort.Strings(models)
	return events.Notification{
		DedupeKey: "model-fault-escalated:" + s.Provider + ":" + millis(first) + ":" + strings.Join(models, ","),
		Severity:  events.SeverityCritical,
		Title:     fmt.Sprintf("the fallback model fails too on %s", s.Provider),
		Text:      fmt.Sprintf("Models %s of %s all reject requests with model errors (latest: %s on %s). Switching models did not help; a human must look at the request shape or the provider's API changes.", strings.Join(models, ", "), s.Provider, c.Class, c.Model),
		Labels:    map[string]string{"provider": s.Provider, "models": strings.Join(models, ",")},
		At:        events.At(now),
	}, true
}

func sortedKeys(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func millis(t events.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

func clock(t time.Time) string { return t.UTC().Format(events.JSONTimeLayout) }

// sentence capitalises a reason for use as a sentence.
func sentence(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
