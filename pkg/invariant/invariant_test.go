package invariant_test

import (
	"encoding/json"
	"errors"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/invariant"
)

// fixtureDir holds the stream fixtures this package and the TypeScript
// client (clients/typescript) both run.
const fixtureDir = "../../testdata/invariants"

type fixture struct {
	Rule  string `json:"rule"`
	Cases []struct {
		Name        string            `json:"name"`
		ViolationAt *int              `json:"violation_at"`
		Events      []json.RawMessage `json:"events"`
	} `json:"cases"`
}

func loadFixtures(t *testing.T) map[string]fixture {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(fixtureDir, "*.json"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no fixtures in %s: %v", fixtureDir, err)
	}
	out := map[string]fixture{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var f fixture
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		out[strings.TrimSuffix(filepath.Base(p), ".json")] = f
	}
	return out
}

// providerEvent stands for a provider's own event type: the grammar event
// plus what the provider says.
type providerEvent struct {
	invariant.Event
	raw json.RawMessage
}

func grammar(e providerEvent) (invariant.Event, bool) { return e.Event, true }

func replay(t *testing.T, raws []json.RawMessage) iter.Seq2[providerEvent, error] {
	return func(yield func(providerEvent, error) bool) {
		for _, r := range raws {
			var e invariant.Event
			if err := json.Unmarshal(r, &e); err != nil {
				t.Fatal(err)
			}
			if !yield(providerEvent{Event: e, raw: r}, nil) {
				return
			}
		}
	}
}

// TestFixtures: every rule has fixtures, each case breaks exactly the rule
// its file names at the position it names (valid.json: none), through the
// Validator and through Stream, which fails fast: nothing from the offending
// event on reaches the consumer.
func TestFixtures(t *testing.T) {
	fx := loadFixtures(t)
	for _, rule := range invariant.Rules {
		if f, ok := fx[rule]; !ok || f.Rule != rule || len(f.Cases) == 0 {
			t.Errorf("rule %s has no fixture file %s.json with cases", rule, rule)
		}
	}
	if len(fx["valid"].Cases) == 0 {
		t.Error("no valid streams in valid.json")
	}
	for file, f := range fx {
		if f.Rule != "" && !slices.Contains(invariant.Rules, f.Rule) {
			t.Errorf("%s.json names unknown rule %q", file, f.Rule)
		}
		for _, c := range f.Cases {
			t.Run(file+"/"+c.Name, func(t *testing.T) {
				if (f.Rule == "") != (c.ViolationAt == nil) {
					t.Fatalf("case must name violation_at exactly when its file names a rule")
				}
				var v invariant.Validator
				var got error
				for _, r := range c.Events {
					var e invariant.Event
					if err := json.Unmarshal(r, &e); err != nil {
						t.Fatal(err)
					}
					if got = v.Check(e); got != nil {
						break
					}
				}
				if got == nil {
					got = v.End()
				}
				var passed int
				var streamErr error
				for _, err := range invariant.Stream(replay(t, c.Events), grammar) {
					if err != nil {
						streamErr = err
						break
					}
					passed++
				}
				if f.Rule == "" {
					if got != nil || streamErr != nil {
						t.Fatalf("valid stream rejected: %v / %v", got, streamErr)
					}
					if passed != len(c.Events) {
						t.Fatalf("Stream passed on %d of %d events", passed, len(c.Events))
					}
					return
				}
				var viol *invariant.Violation
				if !errors.As(got, &viol) {
					t.Fatalf("Validator: %v, want a violation of %s", got, f.Rule)
				}
				if viol.Rule != f.Rule || viol.At != *c.ViolationAt {
					t.Fatalf("Validator: %s at %d (%v), want %s at %d", viol.Rule, viol.At, viol, f.Rule, *c.ViolationAt)
				}
				if !strings.Contains(viol.Error(), f.Rule) {
					t.Errorf("error %q does not name the rule", viol)
				}
				if !errors.As(streamErr, &viol) || viol.Rule != f.Rule || viol.At != *c.ViolationAt {
					t.Fatalf("Stream: %v, want %s at %d", streamErr, f.Rule, *c.ViolationAt)
				}
				if passed != min(*c.ViolationAt, len(c.Events)) {
					t.Fatalf("Stream passed on %d events before failing, want %d (fail fast)", passed, *c.ViolationAt)
				}
			})
		}
	}
}

// TestViolationOutcomeClassifiesAsInvariant: the outcome a violation reports
// is filed as `invariant` by the classifier, for each rule, keeping the
// call's evidence.
func TestViolationOutcomeClassifiesAsInvariant(t *testing.T) {
	base := events.Outcome{ID: "c1", Agent: "a", Provider: "anthropic", Model: "m", Status: 200, OK: true,
		Headers: map[string]string{"request-id": "req_1"}}
	for _, rule := range invariant.Rules {
		t.Run(rule, func(t *testing.T) {
			v := &invariant.Violation{Rule: rule, At: 3, Detail: "what happened"}
			o := v.Outcome(base)
			if err := o.Validate(); err != nil {
				t.Fatal(err)
			}
			if o.OK || o.Status != 200 || o.Headers["request-id"] != "req_1" || o.UpstreamCode != "INVARIANT" {
				t.Fatalf("outcome %+v", o)
			}
			c := classify.Classify(&o)
			if c.Class != events.ClassInvariant || c.Retryable {
				t.Fatalf("classified %s (rule %s, retryable %v), want invariant, not retryable", c.Class, c.Rule, c.Retryable)
			}
			if !strings.Contains(strings.Join(c.Evidence, " "), rule) {
				t.Errorf("evidence %q does not carry the rule", c.Evidence)
			}
		})
	}
	// A stream cut off by the network is a transport failure, not a grammar
	// violation: Stream passes the error on as it is.
	cut := errors.New("read tcp 10.0.0.1:443: connection reset by peer")
	src := func(yield func(providerEvent, error) bool) {
		if yield(providerEvent{Event: invariant.Event{Type: invariant.BlockStart}}, nil) {
			yield(providerEvent{}, cut)
		}
	}
	for _, err := range invariant.Stream(src, grammar) {
		if err != nil && err != cut {
			t.Fatalf("stream error %v, want the transport error itself", err)
		}
	}
}

// TestStreamSkipsNonGrammarEvents: events the grammar function does not map
// pass through unchecked and still count for positions.
func TestStreamSkipsNonGrammarEvents(t *testing.T) {
	type ev struct {
		name string
		g    invariant.Event
	}
	src := func(yield func(ev, error) bool) {
		for _, e := range []ev{{name: "ping"}, {name: "x", g: invariant.Event{Type: invariant.Delta}}} {
			if !yield(e, nil) {
				return
			}
		}
	}
	var passed []string
	var got error
	for e, err := range invariant.Stream(src, func(e ev) (invariant.Event, bool) { return e.g, e.name != "ping" }) {
		if err != nil {
			got = err
			break
		}
		passed = append(passed, e.name)
	}
	var v *invariant.Violation
	if !errors.As(got, &v) || v.Rule != "delta_in_open_block" || v.At != 1 || !slices.Equal(passed, []string{"ping"}) {
		t.Fatalf("passed %v, error %v", passed, got)
	}
}
