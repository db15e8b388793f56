// Package refusal is the refusal tiers, as pure state and words.
//
// A content refusal is judged on the request's bytes, and inside a context
// segment (`<session>#<segment>`) history only grows: the refused bytes are in
// every later request until a boundary. Waiting does not change the verdict,
// so the clock may only cover classifier noise, a bounded number of times:
//
//	reprobes = max(0, refusals-1)
//	reprobes >= len(reprobe_delays)  -> frozen for the segment until a boundary
//	otherwise next probe at refused_at + reprobe_delays[reprobes]
//
// where refusals counts real refusals in the segment and refused_at is the
// latest of them. Only a real refusal advances the state; a skipped turn reads
// it and never moves the clock. config.go holds the policy section; the
// state machine is in state.go, the shared-bus additions (probe claims,
// applied refusals) in claim.go, the words in notice.go and the route rule
// in route.go. The engine (internal/engine: Refuse, Route, Boundary) runs them
// on a store: in memory for simulate, the KV bucket on the bus, whose
// codec is next to the service that writes it (internal/service/refusals).
package refusal

import (
	"errors"
	"fmt"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults of the `refusal:` policy section, exported so documentation and
// tests name them instead of repeating numbers.
const (
	// DefaultMaxRerenders is how often the same refused increment may be
	// re-rendered and retried on the same provider before skip_provider.
	DefaultMaxRerenders = 2
	// DefaultStateTTL backstops refusal state no boundary retires.
	DefaultStateTTL = 7 * 24 * time.Hour
)

// DefaultReprobeDelays returns the default re-probe schedule: 15m, 1h, 6h after the
// latest refusal. It is a function so no caller can mutate a shared slice.
func DefaultReprobeDelays() []time.Duration {
	return []time.Duration{15 * time.Minute, time.Hour, 6 * time.Hour}
}

// Config is the policy's `refusal:` section: the bounded re-probe
// schedule for content refusals. It is the single source of the
// numbers the state machine runs AND of the words the human and the model
// read (Notice), so changing the policy changes both at once.
type Config struct {
	// ReprobeDelays[i] is how long after the latest real refusal re-probe
	// i+1 may be sent. Its length is the number of re-probes; once they are
	// used up the provider is frozen for the segment until a boundary. An
	// empty list freezes at the first refusal. Each delay must be positive.
	// Defaults to DefaultReprobeDelays (15m, 1h, 6h).
	ReprobeDelays []time.Duration `yaml:"reprobe_delays" json:"reprobe_delays"`
	// MaxRerenders bounds how often the same refused increment (same turn
	// and step) is answered with rerender before the provider is skipped.
	// Must be >= 0. Defaults to DefaultMaxRerenders (2).
	MaxRerenders int `yaml:"max_rerenders" json:"max_rerenders"`
	// StateTTL is the KV backstop for state no boundary retires, counted
	// from the state's last write. Must exceed the sum of ReprobeDelays so
	// state cannot expire before it freezes. Defaults to
	// DefaultStateTTL (7 days).
	StateTTL time.Duration `yaml:"state_ttl" json:"state_ttl"`
}

// DefaultConfig returns the default re-probe schedule (15m, 1h, 6h), two
// re-renders per increment and a seven-day state backstop, so a policy
// without a `refusal:` section bounds re-probes to three.
func DefaultConfig() Config {
	return Config{
		ReprobeDelays: DefaultReprobeDelays(),
		MaxRerenders:  DefaultMaxRerenders,
		StateTTL:      DefaultStateTTL,
	}
}

// MaxReprobes is the number of re-probes before a provider is frozen for a
// segment. It is the length of ReprobeDelays by definition, never a separate
// constant that could drift from the list.
func (c Config) MaxReprobes() int { return len(c.ReprobeDelays) }

// Validate rejects schedules that would make the state machine or its texts
// lie: non-positive delays, a negative re-render bound, or a TTL that would
// expire state before the last re-probe is even due.
func (c Config) Validate() error {
	var errs []error
	var total time.Duration
	for i, d := range c.ReprobeDelays {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("refusal.reprobe_delays[%d]: must be positive, got %s", i, d))
		}
		total += d
	}
	if c.MaxRerenders < 0 {
		errs = append(errs, fmt.Errorf("refusal.max_rerenders: must be >= 0, got %d", c.MaxRerenders))
	}
	switch {
	case c.StateTTL <= 0:
		errs = append(errs, fmt.Errorf("refusal.state_ttl: must be positive, got %s", c.StateTTL))
	case c.StateTTL <= total:
		errs = append(errs, fmt.Errorf("refusal.state_ttl: %s must exceed the sum of reprobe_delays (%s), or state expires before it freezes", c.StateTTL, total))
	}
	return errors.Join(errs...)
}

// refusalConfigYAML mirrors Config with string durations so YAML
// carries Go duration strings ("15m", "1h") without a shared Duration type.
type refusalConfigYAML struct {
	ReprobeDelays []string `yaml:"reprobe_delays"`
	MaxRerenders  *int     `yaml:"max_rerenders"`
	StateTTL      string   `yaml:"state_ttl,omitempty"`
}

var refusalYAMLKeys = map[string]bool{"reprobe_delays": true, "max_rerenders": true, "state_ttl": true}

// UnmarshalYAML parses Go duration strings. Keys absent from the document keep
// the values already in c (the defaults, when c is zero), so a partial
// `refusal:` section stays valid; an unknown key is an error that names it.
func (c *Config) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i].Value; !refusalYAMLKeys[k] {
				return fmt.Errorf("refusal: unknown key %q (line %d)", k, n.Content[i].Line)
			}
		}
	}
	var raw refusalConfigYAML
	if err := n.Decode(&raw); err != nil {
		return fmt.Errorf("refusal: %w", err)
	}
	out := DefaultConfig()
	if c.ReprobeDelays != nil || c.MaxRerenders != 0 || c.StateTTL != 0 {
		out = *c
	}
	if raw.ReprobeDelays != nil {
		out.ReprobeDelays = make([]time.Duration, 0, len(raw.ReprobeDelays))
		for i, s := range raw.ReprobeDelays {
			d, err := time.ParseDuration(s)
			if err != nil {
				return fmt.Errorf("refusal.reprobe_delays[%d]: %w", i, err)
			}
			out.ReprobeDelays = append(out.ReprobeDelays, d)
		}
	}
	if raw.MaxRerenders != nil {
		out.MaxRerenders = *raw.MaxRerenders
	}
	if raw.StateTTL != "" {
		d, err := time.ParseDuration(raw.StateTTL)
		if err != nil {
			return fmt.Errorf("refusal.state_ttl: %w", err)
		}
		out.StateTTL = d
	}
	*c = out
	return nil
}

// MarshalYAML writes durations as Go duration strings so a dumped policy
// round-trips through UnmarshalYAML.
func (c Config) MarshalYAML() (any, error) {
	delays := make([]string, len(c.ReprobeDelays))
	for i, d := range c.ReprobeDelays {
		delays[i] = refusalDur(d)
	}
	m := c.MaxRerenders
	return refusalConfigYAML{ReprobeDelays: delays, MaxRerenders: &m, StateTTL: refusalDur(c.StateTTL)}, nil
}
