// Package limits is the `limits:` policy section: how much of the bus's
// shared state one agent may hold, and all agents together. Agents name
// providers, subagents, crons and tasks; each name becomes state that every
// agent shares (a provider's fault scope and recovery record, a subagent's
// heartbeat, a cron's record, a task's bytes in FAILBUS_TASKS). Without a
// bound, one agent that invents names (a bug, a loop, an attacker with the
// agent role) fills a bucket or stream, and then every agent's writes fail:
// decisions stop for everyone. With these limits, past its share an agent's
// new names are refused (dead letters naming the limit and the agent, one
// notification), and every other agent is decided as before.
//
// A name already held is never refused: the limits apply to new names
// only, so an agent at its limit keeps working with what it has. Names
// leave an agent's count when their state expires (the buckets' and
// streams' own TTLs, documented per field).
//
// What is not guaranteed: totals are counted as the stores hold them, and
// replicas admitting new names at the same instant can each admit one past
// a bound; a bound is a cap on growth, not an exact count.
package limits

import (
	"errors"
	"fmt"
)

// Defaults of the `limits:` section.
const (
	// DefaultProvidersPerAgent is how many providers one agent's records
	// may name. A real agent uses a handful (its providers, a gateway or
	// two, a local server).
	DefaultProvidersPerAgent = 32
	// DefaultProviders is how many providers all agents together may name:
	// each has a fault-scope record (FAILBUS_SCOPE, 64 MiB) of up to
	// scope.max_profiles profiles and scope.max_models models.
	DefaultProviders = 1000
	// DefaultSubagentsPerAgent is how many subagents one agent may have a
	// heartbeat stored for (FAILBUS_HEARTBEATS keeps each for 30 days).
	DefaultSubagentsPerAgent = 10_000
	// DefaultSubagents is how many subagents all agents together may have
	// a heartbeat stored for: about 40 MB of FAILBUS_HEARTBEATS' 64 MiB.
	DefaultSubagents = 100_000
	// DefaultCronsPerAgent is how many crons one agent may declare.
	DefaultCronsPerAgent = 200
	// DefaultCrons is how many crons all agents together may declare.
	DefaultCrons = 20_000
	// DefaultTasksPerAgent is how many tasks one agent may have in
	// FAILBUS_TASKS, which keeps each for 30 days.
	DefaultTasksPerAgent = 100_000
	// DefaultTaskBytesPerAgent is how many bytes of tasks one agent may
	// have in FAILBUS_TASKS (512 MiB): 64 MiB.
	DefaultTaskBytesPerAgent = 64 << 20
	// DefaultTaskBytes is the largest task: 1 MiB. FAILBUS_TASKS refuses a
	// larger one when it is published (its max_msg_size), so it is never
	// stored.
	DefaultTaskBytes = 1 << 20
)

// Config is the `limits:` policy section. Every field must be positive.
type Config struct {
	// ProvidersPerAgent bounds the distinct providers one agent's records
	// (outcomes, heartbeats, cron specs and runs, writes, tasks) may name.
	// A provider counts for an agent from its first record naming it until
	// 30 days after the last. Defaults to 32.
	ProvidersPerAgent int `yaml:"providers_per_agent" json:"providers_per_agent"`
	// Providers bounds the distinct providers all agents together may
	// name. Defaults to 1000.
	Providers int `yaml:"providers" json:"providers"`
	// SubagentsPerAgent bounds the subagents one agent may have a stored
	// heartbeat for (a heartbeat is kept 30 days). Defaults to 10000.
	SubagentsPerAgent int `yaml:"subagents_per_agent" json:"subagents_per_agent"`
	// Subagents bounds the subagents all agents together may have a
	// stored heartbeat for. Defaults to 100000.
	Subagents int `yaml:"subagents" json:"subagents"`
	// CronsPerAgent bounds the crons one agent may declare. Defaults to
	// 200.
	CronsPerAgent int `yaml:"crons_per_agent" json:"crons_per_agent"`
	// Crons bounds the crons all agents together may declare. Defaults to
	// 20000.
	Crons int `yaml:"crons" json:"crons"`
	// TasksPerAgent bounds the tasks one agent may have in FAILBUS_TASKS
	// (submitted in the last 30 days, held or not). Defaults to 100000.
	TasksPerAgent int `yaml:"tasks_per_agent" json:"tasks_per_agent"`
	// TaskBytesPerAgent bounds the bytes of those tasks. Defaults to 64
	// MiB.
	TaskBytesPerAgent int64 `yaml:"task_bytes_per_agent" json:"task_bytes_per_agent"`
	// TaskBytes is the largest task, in bytes: FAILBUS_TASKS' max_msg_size
	// (applied with the topology), so a larger task is refused when it is
	// published. Defaults to 1 MiB.
	TaskBytes int `yaml:"task_bytes" json:"task_bytes"`
}

// DefaultConfig returns the documented defaults.
func DefaultConfig() Config {
	return Config{
		ProvidersPerAgent: DefaultProvidersPerAgent,
		Providers:         DefaultProviders,
		SubagentsPerAgent: DefaultSubagentsPerAgent,
		Subagents:         DefaultSubagents,
		CronsPerAgent:     DefaultCronsPerAgent,
		Crons:             DefaultCrons,
		TasksPerAgent:     DefaultTasksPerAgent,
		TaskBytesPerAgent: DefaultTaskBytesPerAgent,
		TaskBytes:         DefaultTaskBytes,
	}
}

// Validate reports every field that is not positive, each naming its key.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		key string
		v   int64
	}{
		{"providers_per_agent", int64(c.ProvidersPerAgent)}, {"providers", int64(c.Providers)},
		{"subagents_per_agent", int64(c.SubagentsPerAgent)}, {"subagents", int64(c.Subagents)},
		{"crons_per_agent", int64(c.CronsPerAgent)}, {"crons", int64(c.Crons)},
		{"tasks_per_agent", int64(c.TasksPerAgent)}, {"task_bytes_per_agent", c.TaskBytesPerAgent},
		{"task_bytes", int64(c.TaskBytes)},
	} {
		if f.v <= 0 {
			errs = append(errs, fmt.Errorf("limits.%s: %d must be positive", f.key, f.v))
		}
	}
	return errors.Join(errs...)
}

// Names of the limits, as dead letters, notifications and metrics name
// them: the policy keys.
const (
	ProvidersPerAgent = "providers_per_agent"
	Providers         = "providers"
	SubagentsPerAgent = "subagents_per_agent"
	Subagents         = "subagents"
	CronsPerAgent     = "crons_per_agent"
	Crons             = "crons"
	TasksPerAgent     = "tasks_per_agent"
	TaskBytesPerAgent = "task_bytes_per_agent"
)

// ErrExceeded is the cause of every *Exceeded.
var ErrExceeded = errors.New("limit reached")

// Exceeded says which limit refused an agent's new name. Its text is the
// dead letter's reason.
type Exceeded struct {
	// Limit is the policy key: ProvidersPerAgent, Providers, ...
	Limit string
	// Max is the limit's value; Held what the agent (or, for a total, all
	// agents) holds.
	Max, Held int64
	// Agent is the agent whose record was refused; Kind and Name the new
	// name ("provider", "openai").
	Agent, Kind, Name string
}

func (e *Exceeded) Error() string {
	whose := "agent " + e.Agent + " holds"
	if !e.perAgent() {
		whose = "all agents hold"
	}
	return fmt.Sprintf("limits.%s (%d) reached: %s %d; new %s %q of agent %s refused (raise limits.%s in the policy, or let old ones expire)",
		e.Limit, e.Max, whose, e.Held, e.Kind, e.Name, e.Agent, e.Limit)
}

// Unwrap returns ErrExceeded.
func (e *Exceeded) Unwrap() error { return ErrExceeded }

func (e *Exceeded) perAgent() bool {
	switch e.Limit {
	case Providers, Subagents, Crons:
		return false
	}
	return true
}

// Admit is the rule every limit applies to a new name: refused when the
// holder already holds max or more. It returns nil or an *Exceeded.
func Admit(limit string, max int64, held int64, agent, kind, name string) error {
	if held < max {
		return nil
	}
	return &Exceeded{Limit: limit, Max: max, Held: held, Agent: agent, Kind: kind, Name: name}
}

// NotifyKey is the dedupe key of the one notification an agent's reaching
// a limit sends: one per agent, limit and UTC day.
func NotifyKey(limit, agent, day string) string {
	return "limit:" + limit + ":" + agent + ":" + day
}

// WithDefaults returns c with every field that is not positive set to its
// default: a Config built in code (tests, tools) need set only what it
// changes.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	set := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	set(&c.ProvidersPerAgent, d.ProvidersPerAgent)
	set(&c.Providers, d.Providers)
	set(&c.SubagentsPerAgent, d.SubagentsPerAgent)
	set(&c.Subagents, d.Subagents)
	set(&c.CronsPerAgent, d.CronsPerAgent)
	set(&c.Crons, d.Crons)
	set(&c.TasksPerAgent, d.TasksPerAgent)
	set(&c.TaskBytes, d.TaskBytes)
	if c.TaskBytesPerAgent <= 0 {
		c.TaskBytesPerAgent = d.TaskBytesPerAgent
	}
	return c
}
