package scheduler

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/streamread"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// activePolicy is one policy the scheduler may decide with, and where it
// came from.
type activePolicy struct {
	p        *policy.Policy
	source   string
	revision uint64
}

// policyLayers are the two sources of the policy, in precedence order: kv
// (the last valid policy under PolicyKVKey; nil while the key is absent or
// has held no valid policy since start) over base (the policy file's last
// good content, or Config.Policy).
type policyLayers struct {
	base *activePolicy
	kv   *activePolicy
}

// inForce is the layer that wins.
func (l *policyLayers) inForce() *activePolicy {
	if l.kv != nil {
		return l.kv
	}
	return l.base
}

// Policy audit kinds: the Kind of a PolicyAudit.
const (
	// PolicyApplied: a policy from KV, or a changed policy file while KV
	// holds none, is in force from now on.
	PolicyApplied = "applied"
	// PolicyShadowed: the policy file changed to a valid policy, but the
	// KV key overrides it: the KV policy stays in force (PolicyKey is its
	// key) and the file's applies once the key is deleted.
	PolicyShadowed = "shadowed"
	// PolicyRemoved: the KV key was deleted; the base policy (the policy
	// file's current content, or Config.Policy) is in force.
	PolicyRemoved = "removed"
	// PolicyRejected: the KV value or the policy file is not a valid policy
	// (or the file cannot be read); the previous one stays in force.
	PolicyRejected = "rejected"
)

// Sources of a policy change: the `source` label of
// failbus_scheduler_policy_reloads_total.
const (
	reloadKV   = "kv"
	reloadFile = "file"
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
	// Source names where the change was seen: the KV entry, e.g. "kv
	// FAILBUS_POLICY/active", or the policy file and the SHA-256 prefix of
	// the content read, e.g. "file /etc/failbus/policy.yaml
	// sha256:0123456789abcdef" (no hash when the file cannot be read).
	Source string `msgpack:"source" json:"source"`
	// Revision is the KV revision of the change; 0 for a change of the
	// policy file.
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
func PolicyAuditSubject() string { return events.AuditSubject(Name, PolicyAuditKind) }

// kvSource names the KV entry the policy is watched at.
var kvSource = "kv " + topology.BucketPolicy + "/" + PolicyKVKey

// startPolicyWatch opens the watch on the KV policy and applies its current
// value before returning, so the first message is decided with it.
func (s *Service) startPolicyWatch(ctx context.Context) (jetstream.KeyWatcher, error) {
	kv, err := streamread.KeyValue(ctx, s.js, topology.BucketPolicy)
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
func (s *Service) followPolicy(ctx context.Context, w jetstream.KeyWatcher) {
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
func (s *Service) applyKV(ctx context.Context, e jetstream.KeyValueEntry) {
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
		s.setLayer(func(l *policyLayers) {
			l.kv = &activePolicy{p: p, source: kvSource + " rev " + strconv.FormatUint(e.Revision(), 10), revision: e.Revision()}
		})
		a.Kind, a.PolicyKey = PolicyApplied, p.RetryFor("").Key()
		s.log.Info().Str("policy", kvSource).Uint64("revision", e.Revision()).Str("policy_key", a.PolicyKey).Msg("policy applied")
	default: // deleted or purged: back to the base policy
		var base *activePolicy
		s.setLayer(func(l *policyLayers) {
			l.kv = nil
			base = l.base
		})
		a.Kind, a.PolicyKey = PolicyRemoved, base.p.RetryFor("").Key()
		s.log.Info().Str("policy", kvSource).Uint64("revision", e.Revision()).Str("now", base.source).Str("policy_key", a.PolicyKey).
			Msg("policy removed from KV; back to the configured one")
	}
	msgID := Name + ":policy:" + strconv.FormatUint(e.Revision(), 10)
	s.recordPolicy(ctx, reloadKV, a, msgID)
}

// setLayer changes the layers with change and puts the winning one into
// force, atomically with respect to the other source, and returns it.
func (s *Service) setLayer(change func(*policyLayers)) *activePolicy {
	s.layersMu.Lock()
	defer s.layersMu.Unlock()
	change(&s.layers)
	p := s.layers.inForce()
	if err := s.eng.SetPolicy(p.p); err != nil {
		// Cannot happen for a policy that passed Validate; the engine keeps
		// the previous one.
		s.log.Error().Err(err).Str("policy", p.source).Msg("engine refused the policy")
	}
	s.active.Store(p)
	return p
}

// recordPolicy counts a policy change of source and records it on
// failbus.audit.scheduler.policy.
func (s *Service) recordPolicy(ctx context.Context, source string, a *PolicyAudit, msgID string) {
	s.m.reloads.WithLabelValues(source, a.Kind).Inc()
	if _, err := s.publish(ctx, PolicyAuditSubject(), a, msgID, nil); err != nil {
		s.log.Warn().Err(err).Msg("record policy change")
	}
}
