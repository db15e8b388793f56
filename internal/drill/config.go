package drill

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/chaos"
)

// Strategies of the Go client. Other clients add rows under their own
// names (the TypeScript drill: "ts-openai", "ts-pi-ai", "ts-failbus").
const (
	// StrategySDK is openai-go and anthropic-sdk-go as they come: their
	// own retries (two, with backoff), nothing else.
	StrategySDK = "go-sdk"
	// StrategyFailbus is the same SDKs with their retries off, each call
	// under agent.Call on the bus.
	StrategyFailbus = "go-failbus"
)

// Strategies are the Go strategies, in the order they run.
var Strategies = []string{StrategySDK, StrategyFailbus}

// Config configures a drill. The zero value of every field is its
// default.
type Config struct {
	// Agents is the fleet's size (DefaultAgents).
	Agents int
	// Tasks is each agent's number of tasks (DefaultTasks).
	Tasks int
	// Steps is each task's number of LLM calls (DefaultSteps).
	Steps int
	// Crashes is how many subagents crash during the outage
	// (DefaultCrashes); negative: none.
	Crashes int
	// Seed draws the fleet (arrivals, flagged content, crashes) and the
	// chaos server's probabilities (DefaultSeed).
	Seed uint64
	// Scale multiplies every time of the timeline and the fleet on the
	// machine's clock: 0.1 runs the default two and a half minutes in
	// fifteen seconds. Default 1. The bus's clocks (retry delays, probe
	// interval, recovery time, drain rate) are scaled with it when the
	// bus runs in process; the SDKs' own backoff is not.
	Scale float64
	// Timeline replaces DefaultTimeline. It must have a window named
	// "outage" (WindowOutage) whose provider is ProviderOpenAI.
	Timeline *chaos.Timeline
	// Strategies to run, in order (default: Strategies).
	Strategies []string
	// Parallel runs the strategies side by side, each against its own
	// chaos server, instead of one after the other: faster, on a machine
	// with the cores for it (the fleets then share the CPU).
	Parallel bool
	// Grace is how long (timeline time) the fleet may go on after the
	// timeline's end (DefaultGrace).
	Grace time.Duration
	// Connect, when set, connects the failbus strategy's agents to an
	// existing bus instead of a bus started in process; its policy is its
	// own (see docs/DRILL.md).
	Connect func(name string) (*nats.Conn, error)
	// Real, when set, points the fleet at real providers instead of a
	// chaos server.
	Real *Real
	// Requests, when set, gets every request the provider received, one
	// JSON line each: the chaos server's record, the strategy, what the
	// fleet sent it for and why it was wasted.
	Requests io.Writer
	// Progress receives a line now and then while a strategy runs (nil:
	// none).
	Progress io.Writer
	// Log receives the bus's and the chaos server's logs (zero: none).
	Log zerolog.Logger
}

// Real is where the fleet calls when it does not call a chaos server.
type Real struct {
	// OpenAIBaseURL and AnthropicBaseURL are the SDKs' base URLs (empty:
	// the SDK's default, the public API).
	OpenAIBaseURL, AnthropicBaseURL string
	// OpenAIModel and AnthropicModel are the models called.
	OpenAIModel, AnthropicModel string
	// Keys are the API keys per provider and profile: Keys[provider]
	// [ProfileMain] and [ProfileBackup] (the backup may be the main key
	// again). Every agent uses them.
	Keys map[string]map[string]string
}

// Validate reports what makes c unusable (Run would return it).
func (c Config) Validate() error {
	_, err := c.resolved()
	return err
}

// resolved is a Config with its defaults filled in.
func (c Config) resolved() (Config, error) {
	if c.Agents == 0 {
		c.Agents = DefaultAgents
	}
	if c.Tasks == 0 {
		c.Tasks = DefaultTasks
	}
	if c.Steps == 0 {
		c.Steps = DefaultSteps
	}
	if c.Crashes == 0 {
		c.Crashes = DefaultCrashes
	}
	c.Crashes = max(c.Crashes, 0)
	if c.Seed == 0 {
		c.Seed = DefaultSeed
	}
	if c.Scale == 0 {
		c.Scale = 1
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.Strategies == nil {
		c.Strategies = Strategies
	}
	switch {
	case c.Agents < 2 || c.Tasks < 1 || c.Steps < 1:
		return c, errors.New("drill: at least 2 agents (one per provider), 1 task and 1 step")
	case c.Scale <= 0 || math.IsNaN(c.Scale) || math.IsInf(c.Scale, 0):
		return c, fmt.Errorf("drill: scale %v: must be positive", c.Scale)
	case c.Grace < 0:
		return c, errors.New("drill: grace must not be negative")
	}
	for _, s := range c.Strategies {
		if !slices.Contains(Strategies, s) {
			return c, fmt.Errorf("drill: strategy %q: not one of %v", s, Strategies)
		}
	}
	if c.Timeline == nil {
		c.Timeline = DefaultTimeline(c.Seed, CappedKeys(c.Agents))
	}
	if o, ok := c.Timeline.Fault(WindowOutage); !ok || !slices.Equal(o.Providers, []string{ProviderOpenAI}) {
		return c, fmt.Errorf("drill: the timeline needs a window %q of provider %s alone", WindowOutage, ProviderOpenAI)
	}
	return c, nil
}

// wall is timeline time d on the machine's clock.
func (c Config) wall(d time.Duration) time.Duration { return time.Duration(float64(d) * c.Scale) }

// stallWall is the stall watchdog on the machine's clock.
func (c Config) stallWall() time.Duration { return max(c.wall(stallAfter), minStall) }

// heartbeatWall is a subagent's heartbeat interval on the machine's clock.
func (c Config) heartbeatWall() time.Duration { return max(c.wall(heartbeatEvery), minHeartbeat) }
