package policy

import (
	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/pkg/events"
)

// Classifier turns an outcome into a classification: the class, whether it
// is retryable, the rule that matched and the evidence it saw. It is pure
// (no I/O, no clock: delays are read against the outcome's own time) and
// safe for concurrent use; the classifier service runs the same one.
type Classifier = classify.Classifier

// Classify classifies o by the built-in rules, as the classifier service
// does under the default policy: for a tool or another service that reads
// outcomes and wants failbus's class for them without a bus.
func Classify(o *events.Outcome) events.Classification { return classify.Classify(o) }

// Classifier compiles the policy's classify section (its user rules before
// the built-in ones) into the classifier the services would run under this
// policy. It fails as Validate does on a bad rule.
func (p *Policy) Classifier() (*Classifier, error) { return classify.New(p.Classify) }
