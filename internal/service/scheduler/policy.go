package scheduler

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// activePolicy is the policy decisions use now, and where it came from.
type activePolicy struct {
	p        *policy.Policy
	source   string
	revision uint64
}

// Policy audit kinds: the Kind of a PolicyAudit.
const (
	// PolicyApplied: a policy from KV is in force from now on.
	PolicyApplied = "applied"
	// PolicyRemoved: the KV key was deleted; Options.Policy is in force.
	PolicyRemoved = "removed"
	// PolicyRejected: the KV value is not a valid policy; the previous one
	// stays in force.
	PolicyRejected = "rejected"
)

// SchemaPolicyAudit is the Failbus-Schema name of a PolicyAudit.
const SchemaPolicyAudit = "scheduler_policy_audit"

// PolicyAuditKind is the last token of the audit subject the scheduler
// records policy changes on: failbus.audit.scheduler.policy.
const PolicyAuditKind = "policy"

// PolicyAudit records a change of the policy the scheduler decides with, on
// failbus.audit.scheduler.policy, so "which budgets did this decision
// count in?" can be answered after the fact, and a tool that changes the
// policy can wait until it is in force.
type PolicyAudit struct {
	At   events.Time `msgpack:"at" json:"at"`
	Kind string      `msgpack:"kind" json:"kind"`
	// Source names the KV entry, e.g. "kv FAILBUS_POLICY/active".
	Source string `msgpack:"source" json:"source"`
	// Revision is the KV revision of the change.
	Revision uint64 `msgpack:"revision" json:"revision"`
	// PolicyKey is the key of the global retry policy now in force (each
	// provider override has its own): budgets counted from now on carry
	// it.
	PolicyKey string `msgpack:"policy_key,omitempty" json:"policy_key,omitempty"`
	// Error says why a rejected value is not a policy.
	Error string `msgpack:"error,omitempty" json:"error,omitempty"`
}

// SchemaName implements events.Message.
func (*PolicyAudit) SchemaName() string { return SchemaPolicyAudit }

// Validate implements events.Message.
func (a *PolicyAudit) Validate() error {
	if a.Kind == "" {
		return &events.FieldError{Field: "kind", Problem: "required"}
	}
	return nil
}

// PolicyAuditSubject is where the scheduler records policy changes.
func PolicyAuditSubject() string { return events.AuditSubject(Service, PolicyAuditKind) }

// kvSource names the KV entry the policy is watched at.
var kvSource = "kv " + topology.BucketPolicy + "/" + PolicyKVKey

// startPolicyWatch opens the watch on the KV policy and applies its current
// value before returning, so the first message is decided with it.
func (s *Scheduler) startPolicyWatch(ctx context.Context) (jetstream.KeyWatcher, error) {
	kv, err := s.js.KeyValue(ctx, topology.BucketPolicy)
	if err != nil {
		return nil, fmt.Errorf("scheduler: open KV %s (apply the topology first): %w", topology.BucketPolicy, err)
	}
	w, err := kv.Watch(ctx, PolicyKVKey)
	if err != nil {
		return nil, fmt.Errorf("scheduler: watch %s: %w", kvSource, err)
	}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("scheduler: watch %s ended before its initial value", kvSource)
			}
			if e == nil {
				return w, nil // initial values done
			}
			s.applyKV(ctx, e)
		case <-ctx.Done():
			_ = w.Stop()
			return nil, ctx.Err()
		}
	}
}

// followPolicy applies every later change until ctx ends.
func (s *Scheduler) followPolicy(ctx context.Context, w jetstream.KeyWatcher) {
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() == nil {
					s.mu.Lock()
					s.watchErr = fmt.Errorf("watch of %s ended", kvSource)
					s.mu.Unlock()
					s.log.Error().Str("policy", kvSource).Msg("policy watch ended; keeping the current policy")
				}
				return
			}
			if e != nil {
				s.applyKV(ctx, e)
			}
		case <-ctx.Done():
			return
		}
	}
}

// applyKV puts a KV change of the policy into force and records it.
func (s *Scheduler) applyKV(ctx context.Context, e jetstream.KeyValueEntry) {
	a := &PolicyAudit{At: events.At(s.now()), Source: kvSource, Revision: e.Revision()}
	switch e.Operation() {
	case jetstream.KeyValuePut:
		p, err := policy.Parse(e.Value())
		if err != nil {
			a.Kind, a.Error = PolicyRejected, err.Error()
			a.PolicyKey = s.Policy().RetryFor("").Key()
			s.log.Error().Err(err).Str("policy", kvSource).Uint64("revision", e.Revision()).Msg("policy rejected; keeping the current one")
			break
		}
		s.active.Store(&activePolicy{p: p, source: kvSource + " rev " + strconv.FormatUint(e.Revision(), 10), revision: e.Revision()})
		a.Kind, a.PolicyKey = PolicyApplied, p.RetryFor("").Key()
		s.log.Info().Str("policy", kvSource).Uint64("revision", e.Revision()).Str("policy_key", a.PolicyKey).Msg("policy applied")
	default: // deleted or purged: back to Options.Policy
		s.active.Store(&activePolicy{p: s.base, source: "options (" + kvSource + " removed)", revision: e.Revision()})
		a.Kind, a.PolicyKey = PolicyRemoved, s.base.RetryFor("").Key()
		s.log.Info().Str("policy", kvSource).Uint64("revision", e.Revision()).Msg("policy removed from KV; back to the configured one")
	}
	s.m.reloads.WithLabelValues(a.Kind).Inc()
	msgID := Service + ":policy:" + strconv.FormatUint(e.Revision(), 10)
	if _, err := s.publish(ctx, PolicyAuditSubject(), a, msgID, nil); err != nil {
		s.log.Warn().Err(err).Msg("record policy change")
	}
}
