package engine

import (
	"fmt"
	"github.com/failbus/failbus/pkg/events"
)

// Classify is the classification stage: the policy's classifier, the
// class's retryability "after policy" (CONTRACT.md: the provider's
// effective retryable set under the policy, false under mode off), and the
// outcome's identity and context copied in (Complete). The classifier
// service publishes what it returns; simulate and shadow feed it on. It
// never fails: an outcome nothing explains is `unknown`.
func (e *Engine) Classify(o *events.Outcome) events.Classification {
	cur := e.cur.Load()
	c := cur.cl.Classify(o)
	if o != nil {
		Complete(&c, o)
		if c.Class != events.ClassOK {
			c.Retryable = cur.retryFor(o.Provider).IsRetryable(c.Class)
		}
	}
	return c
}

// Complete copies the outcome's identity and context into c where the
// classifier left them empty, and the class's contract scope when c has
// none, so no later stage needs a second lookup whatever classifier made c.
func Complete(c *events.Classification, o *events.Outcome) {
	set := func(dst *string, v string) {
		if *dst == "" {
			*dst = v
		}
	}
	set(&c.OutcomeID, o.ID)
	set(&c.Agent, o.Agent)
	set(&c.Provider, o.Provider)
	set(&c.Model, o.Model)
	set(&c.Profile, o.Profile)
	set(&c.Session, o.Session)
	set(&c.RefusalScope, o.RefusalScope)
	if c.At.IsZero() {
		c.At = o.At
	}
	if c.Segment == 0 {
		c.Segment = o.Segment
	}
	if c.Turn == 0 {
		c.Turn = o.Turn
	}
	if c.Step == 0 {
		c.Step = o.Step
	}
	if c.Scope == "" {
		if info, ok := events.LookupClass(c.Class); ok {
			c.Scope = info.Scope
		}
	}
	// A network-layer class on an outcome that had an HTTP answer (a
	// stream that stalled or broke after a 2xx began) is the provider's
	// failure, not the network path's: it counts toward the provider's
	// error share, never toward an outage (every profile failing at the
	// network layer), which a few stalled streams of a provider that
	// answers would otherwise declare.
	if c.Scope == events.ScopeNetwork && o.Status >= 200 && o.Status < 300 {
		c.Scope = events.ScopeProvider
		c.Evidence = append(c.Evidence, fmt.Sprintf("scope provider: the provider answered (status %d) before the failure", o.Status))
	}
}
