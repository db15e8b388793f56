package events

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/failbus/failbus/pkg/redact"
)

// SchemaName implements Message.
func (*Outcome) SchemaName() string { return SchemaOutcome }

// SchemaName implements Message.
func (*Classification) SchemaName() string { return SchemaClassification }

// SchemaName implements Message.
func (*Decision) SchemaName() string { return SchemaDecision }

// SchemaName implements Message.
func (*RetryDue) SchemaName() string { return SchemaRetryDue }

// SchemaName implements Message.
func (*Health) SchemaName() string { return SchemaHealth }

// SchemaName implements Message.
func (*Notification) SchemaName() string { return SchemaNotification }

// SchemaName implements Message.
func (*Boundary) SchemaName() string { return SchemaBoundary }

// SchemaName implements Message.
func (*DeadLetter) SchemaName() string { return SchemaDeadLetter }

// Validate checks the fields CONTRACT.md requires of an Outcome: id, agent,
// provider; a sane status; a known refusal scope.
func (o *Outcome) Validate() error {
	if err := firstErr(required("id", o.ID), required("agent", o.Agent), required("provider", o.Provider)); err != nil {
		return err
	}
	if err := checkID(o.ID); err != nil {
		return &FieldError{Field: "id", Problem: err.Error()}
	}
	if err := names("agent", o.Agent, "provider", o.Provider, "model", o.Model, "profile", o.Profile, "session", o.Session); err != nil {
		return err
	}
	if g := o.Origin; g != nil {
		if err := names("origin.kind", g.Kind, "origin.name", g.Name, "origin.parent", g.Parent); err != nil {
			return err
		}
	}
	if err := notACredential(o.ID); err != nil {
		return &FieldError{Field: "id", Problem: err.Error()}
	}
	if o.Status < 0 || o.Status > 999 {
		return &FieldError{Field: "status", Problem: fmt.Sprintf("%d is not an HTTP status (0 when none)", o.Status)}
	}
	switch o.RefusalScope {
	case "", "increment", "history":
	default:
		return &FieldError{Field: "refusal_scope", Problem: fmt.Sprintf("%q is not increment or history", truncate(o.RefusalScope, 64))}
	}
	if err := tokenCount(o.RequestTokens); err != nil {
		return &FieldError{Field: "request_tokens", Problem: err.Error(), Err: causeOf(err)}
	}
	if err := tokenCount(o.ContextWindow); err != nil {
		return &FieldError{Field: "context_window", Problem: err.Error(), Err: causeOf(err)}
	}
	if err := tokenCount(o.MaxOutputTokens); err != nil {
		return &FieldError{Field: "max_output_tokens", Problem: err.Error(), Err: causeOf(err)}
	}
	return nil
}

// Bounds on Outcome fields, so a hostile value is a clear error instead of a
// wrapped-around number, an oversized subject or a broken header.
const (
	// maxNameBytes bounds id, agent, provider, model, profile and session:
	// they become subject tokens, header values and metric labels.
	maxNameBytes = 512
	// maxTokens bounds request_tokens, context_window and
	// max_output_tokens (2^40, about 1.1e12), so sums and differences of
	// them never overflow.
	maxTokens = 1 << 40
)

// checkID accepts an id that can be a Nats-Msg-Id header value: a name
// (checkText: at most maxNameBytes of UTF-8, no control characters, a CR
// or LF would end the header).
func checkID(id string) error { return checkText(id) }

// checkText is the shape every identifier an agent sends must have: at
// most maxNameBytes, valid UTF-8 (a Prometheus label refuses anything
// else, by panicking), no control character (C0, DEL or C1: a CR or LF
// ends a header line, and none belongs in a name shown to a person).
func checkText(v string) error {
	if len(v) > maxNameBytes {
		return fmt.Errorf("%d bytes exceed the limit of %d", len(v), maxNameBytes)
	}
	for i, r := range v {
		switch {
		case r == utf8.RuneError && !validRuneAt(v, i):
			return fmt.Errorf("not valid UTF-8 at byte %d", i)
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			return fmt.Errorf("control character %U at byte %d", r, i)
		}
	}
	return nil
}

// validRuneAt reports whether the U+FFFD that ranging over v decoded at i
// was written as such (three bytes), not made up for an invalid byte.
func validRuneAt(v string, i int) bool {
	_, size := utf8.DecodeRuneInString(v[i:])
	return size == 3
}

// CheckName applies the rules of every identifier an agent sends (agent,
// provider, model, profile, session, subagent, task, cron, write key, …):
// at most maxNameBytes of valid UTF-8, no control character, nothing
// redact.String would mask. Identifiers become subject tokens, KV keys,
// header values and metric labels, and are repeated in every output, so
// one that breaks any of these is refused where it enters, naming the
// field. An empty value passes (requiredness is the caller's).
func CheckName(field, v string) error {
	if v == "" {
		return nil
	}
	if err := checkText(v); err != nil {
		return &FieldError{Field: field, Problem: err.Error()}
	}
	if err := notACredential(v); err != nil {
		return &FieldError{Field: field, Problem: err.Error()}
	}
	return nil
}

// notACredential rejects an identifier that redact.String would mask: ids
// and names are repeated in every output (classifications, decisions,
// subjects, metric labels, logs), so one holding an API key or a URL
// password would spread it where redaction of free text never looks.
func notACredential(v string) error {
	if m := redact.String(v); m != v {
		return fmt.Errorf("looks like a credential (%s): identifiers are repeated in every output, so none may hold one", truncate(m, 64))
	}
	return nil
}

func tokenCount(n int) error {
	switch {
	case n < 0:
		return errors.New("negative")
	case n > maxTokens:
		return fmt.Errorf("%w: %d exceeds the limit of %d", errNumberRange, n, maxTokens)
	}
	return nil
}

// Validate checks that a classification names its outcome and a contract
// class.
func (c *Classification) Validate() error {
	if err := firstErr(required("outcome_id", c.OutcomeID), required("class", c.Class)); err != nil {
		return err
	}
	if _, ok := LookupClass(c.Class); !ok {
		return &FieldError{Field: "class", Problem: fmt.Sprintf("%q is not a contract class", truncate(c.Class, 64))}
	}
	return nil
}

var actions = map[string]bool{
	ActionRetry: true, ActionSwitchProfile: true, ActionSwitchModel: true, ActionSwitchProvider: true,
	ActionRerender: true, ActionSkipProvider: true, ActionWaitProvider: true, ActionCompact: true, ActionGiveUp: true,
}

// Validate checks that a decision names its agent and a contract action.
func (d *Decision) Validate() error {
	if err := firstErr(required("outcome_id", d.OutcomeID), required("agent", d.Agent), required("action", d.Action)); err != nil {
		return err
	}
	if !actions[d.Action] {
		return &FieldError{Field: "action", Problem: fmt.Sprintf("%q is not a contract action", truncate(d.Action, 64))}
	}
	return nil
}

// Validate checks the identity of a due retry.
func (r *RetryDue) Validate() error {
	return firstErr(required("retry_id", r.RetryID), required("agent", r.Agent))
}

// Validate checks a health record.
func (h *Health) Validate() error {
	if err := firstErr(required("provider", h.Provider), required("state", h.State)); err != nil {
		return err
	}
	switch h.State {
	case HealthHealthy, HealthDegraded, HealthOutage, HealthRecovered:
		return nil
	}
	return &FieldError{Field: "state", Problem: fmt.Sprintf("%q is not healthy, degraded, outage or recovered", truncate(h.State, 64))}
}

// Validate checks a notification request: a dedupe key and a known severity.
func (n *Notification) Validate() error {
	if err := firstErr(required("dedupe_key", n.DedupeKey), required("severity", n.Severity)); err != nil {
		return err
	}
	switch n.Severity {
	case SeverityInfo, SeverityNormal, SeverityCritical:
		return nil
	}
	return &FieldError{Field: "severity", Problem: fmt.Sprintf("%q is not info, normal or critical", truncate(n.Severity, 64))}
}

// Validate checks a segment boundary.
func (b *Boundary) Validate() error {
	if err := firstErr(required("agent", b.Agent), required("session", b.Session)); err != nil {
		return err
	}
	return names("agent", b.Agent, "session", b.Session)
}

// Validate checks a dead letter.
func (d *DeadLetter) Validate() error {
	return firstErr(required("service", d.Service), required("reason", d.Reason))
}
