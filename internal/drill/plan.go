package drill

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/failbus/failbus/internal/chaos"
)

// The providers of the drill: one chaos server plays both, each under
// its own path, so the provider's own error tables (insufficient_quota,
// billing_error, overloaded_error) apply.
const (
	// ProviderOpenAI speaks the OpenAI chat completions API; its outage is
	// the timeline's.
	ProviderOpenAI = "openai"
	// ProviderAnthropic speaks the Anthropic messages API.
	ProviderAnthropic = "anthropic"
)

// Profiles: every agent has two auth profiles per provider, each backed
// by a key of its own.
const (
	ProfileMain   = "main"
	ProfileBackup = "backup"
)

// Window names of the default timeline; the figures look them up.
const (
	WindowOutage = "outage"
	WindowCapped = "capped-keys"
	WindowStorm  = "storm"
	WindowStalls = "stalls"
)

// Defaults of a Config.
const (
	DefaultAgents  = 200
	DefaultTasks   = 4
	DefaultSteps   = 4
	DefaultCrashes = 5
	DefaultSeed    = 7
	// DefaultGrace is how long (timeline time) the fleet may go on after
	// the timeline's last window closed before what is unfinished counts
	// as lost.
	DefaultGrace = 90 * time.Second
)

// Timing of the fleet, in timeline time (multiplied by Config.Scale on
// the machine's clock, like the chaos server's windows).
const (
	// stepGap is the time between two steps of a task (the tools run).
	stepGap = 2 * time.Second
	// cronEvery is the schedule of every agent's cron.
	cronEvery = 30 * time.Second
	// stallAfter is the stall watchdog of Call, and the stall window the
	// hung calls are measured against.
	stallAfter = 20 * time.Second
	// heartbeatEvery is a subagent's heartbeat interval (recovery kills
	// one whose latest heartbeat is 3 intervals old after an outage).
	heartbeatEvery = 3 * time.Second
	// resumeWindow spreads the calls released by a recovery (Call's
	// default).
	resumeWindow = 10 * time.Second
	// firstArrival and lastArrival bound the tasks' arrival, before the
	// timeline's end.
	firstArrival  = 2 * time.Second
	arrivalMargin = 10 * time.Second
)

// Floors on the machine's clock: a compressed run keeps heartbeats and
// the watchdog within what a loaded machine (and the bus's 250 ms
// scheduler tick) can keep.
const (
	minHeartbeat = 250 * time.Millisecond
	minStall     = 1500 * time.Millisecond
)

// Plan is the fleet: who the agents are, what they are given and when.
// It depends only on the Config (seed included), so every strategy runs
// the same fleet.
type Plan struct {
	Agents []AgentPlan
	// Crashes are the tasks whose subagent crashes at CrashAt, in every
	// strategy, if it is running then.
	Crashes []string
	// CrashAt is when (timeline time) the crashes happen: in the outage.
	CrashAt time.Duration
	// Tasks is the number of tasks of the whole fleet.
	Tasks int
}

// AgentPlan is one agent.
type AgentPlan struct {
	Name string
	// Primary is the provider its tasks and cron use.
	Primary string
	// Profile is the profile it starts on.
	Profile string
	// Capped is true when its main keys are capped (the capped-keys
	// window's filter).
	Capped bool
	Tasks  []TaskPlan
}

// TaskPlan is one task.
type TaskPlan struct {
	ID    string
	Agent string
	// Arrival is when it is given to the agent (timeline time).
	Arrival time.Duration
	Steps   int
	// Marker is content that the Primary provider refuses, in the task's
	// prompt ("" for most tasks).
	Marker string
}

// RefusalMarker is the content provider refuses (the refusal windows'
// marker).
func RefusalMarker(provider string) string { return "[[flagged-by-" + provider + "]]" }

// Other is the drill's other provider.
func Other(provider string) string {
	if provider == ProviderOpenAI {
		return ProviderAnthropic
	}
	return ProviderOpenAI
}

// Key is the API key of an agent's profile at a provider.
func Key(agent, provider, profile string) string {
	prefix := "sk-"
	if provider == ProviderAnthropic {
		prefix = "sk-ant-"
	}
	return prefix + agent + "-" + profile
}

// NewPlan draws the fleet of cfg over tl (for the tasks' arrivals, the
// outage and the crashes).
func NewPlan(cfg Config, tl *chaos.Timeline) (*Plan, error) {
	end := tl.End()
	outage, ok := tl.Fault(WindowOutage)
	if end <= firstArrival+arrivalMargin || !ok {
		return nil, fmt.Errorf("drill: the timeline needs a window %q and to last more than %v", WindowOutage, firstArrival+arrivalMargin)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6472696c6c)) // "drill"
	p := &Plan{CrashAt: outage.From + (outage.To-outage.From)/4}
	last := end - arrivalMargin
	for i := range cfg.Agents {
		a := AgentPlan{Name: agentName(i), Primary: ProviderOpenAI, Profile: ProfileMain, Capped: capped(i)}
		if i%2 == 1 {
			a.Primary = ProviderAnthropic
		}
		if i/2%4 == 3 {
			// A quarter of each provider's agents start on their
			// backup: the bus knows a working profile to switch to.
			a.Profile = ProfileBackup
		}
		for j := range cfg.Tasks {
			t := TaskPlan{
				ID: fmt.Sprintf("%s-t%d", a.Name, j), Agent: a.Name, Steps: cfg.Steps,
				Arrival: firstArrival + time.Duration(rng.Int64N(int64(last-firstArrival))),
			}
			if rng.IntN(16) == 0 {
				t.Marker = RefusalMarker(a.Primary)
			}
			a.Tasks = append(a.Tasks, t)
			p.Tasks++
		}
		slices.SortFunc(a.Tasks, func(x, y TaskPlan) int { return int(x.Arrival - y.Arrival) })
		p.Agents = append(p.Agents, a)
	}
	p.Crashes = chooseCrashes(p, outage, cfg.Crashes, rng)
	return p, nil
}

// chooseCrashes picks n tasks of the outage's provider (none with
// flagged content) and moves their arrival to a few steps before the
// outage, with steps enough to be running, some done and the next held,
// well into it: a crash then hits a subagent that was working.
func chooseCrashes(p *Plan, outage chaos.Fault, n int, rng *rand.Rand) []string {
	type ref struct{ a, t int }
	var candidates []ref
	for i, a := range p.Agents {
		for j, t := range a.Tasks {
			if a.Primary == ProviderOpenAI && t.Marker == "" {
				candidates = append(candidates, ref{i, j})
			}
		}
	}
	rng.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	var ids []string
	for k, c := range candidates[:min(n, len(candidates))] {
		t := &p.Agents[c.a].Tasks[c.t]
		t.Arrival = max(outage.From-3*stepGap-time.Duration(k)*100*time.Millisecond, 0)
		t.Steps = max(t.Steps, crashSteps)
		ids = append(ids, t.ID)
	}
	for i := range p.Agents {
		slices.SortFunc(p.Agents[i].Tasks, func(x, y TaskPlan) int { return int(x.Arrival - y.Arrival) })
	}
	slices.Sort(ids)
	return ids
}

// crashSteps is the least number of steps of a task whose subagent
// crashes: three done before the outage, the rest after.
const crashSteps = 7

func agentName(i int) string { return fmt.Sprintf("agent-%03d", i) }

// capped says whether agent i's main keys are capped: every fifth agent.
func capped(i int) bool { return i%5 == 0 }

// CappedKeys are the keys of a fleet of n agents that the capped-keys
// window caps: the main keys, at both providers, of every fifth agent.
func CappedKeys(n int) []string {
	var keys []string
	for i := range n {
		if capped(i) {
			keys = append(keys, Key(agentName(i), ProviderOpenAI, ProfileMain), Key(agentName(i), ProviderAnthropic, ProfileMain))
		}
	}
	return keys
}

// Task returns the task called id.
func (p *Plan) Task(id string) (TaskPlan, bool) {
	name, _, ok := strings.Cut(id, "-t")
	if !ok {
		return TaskPlan{}, false
	}
	for _, a := range p.Agents {
		if a.Name != name {
			continue
		}
		for _, t := range a.Tasks {
			if t.ID == id {
				return t, true
			}
		}
	}
	return TaskPlan{}, false
}

// DefaultTimeline is the drill's timeline (timeline time; the run's scale
// applies): two and a half minutes with
//
//   - outage: the OpenAI provider resets every connection from 50 s to
//     90 s (reset, so the calls made to it are counted);
//   - refusals: each provider refuses the content flagged for it, always;
//   - capped-keys: from 10 s to 40 s, the main keys of every fifth agent
//     answer their quota error after 2 successful calls (OpenAI's 429
//     insufficient_quota, Anthropic's 402);
//   - storm: from 105 s to 120 s half the calls to either provider get
//     429 with retry-after 2 s;
//   - stalls: from 125 s to 140 s, 15 % of the streams stall after their
//     first delta for ten minutes.
//
// cappedKeys are the keys the capped-keys window caps (CappedKeys).
func DefaultTimeline(seed uint64, cappedKeys []string) *chaos.Timeline {
	faults := []chaos.Fault{
		{Name: WindowOutage, Kind: chaos.KindReset, Providers: []string{ProviderOpenAI}, From: 50 * time.Second, To: 90 * time.Second},
		{Name: "refusals-openai", Kind: chaos.KindRefusal, Providers: []string{ProviderOpenAI}, Markers: []string{RefusalMarker(ProviderOpenAI)}},
		{Name: "refusals-anthropic", Kind: chaos.KindRefusal, Providers: []string{ProviderAnthropic}, Markers: []string{RefusalMarker(ProviderAnthropic)}},
	}
	if len(cappedKeys) > 0 {
		faults = append(faults, chaos.Fault{Name: WindowCapped, Kind: chaos.KindQuota, Keys: cappedKeys, From: 10 * time.Second, To: 40 * time.Second, AfterRequests: 2})
	}
	faults = append(faults,
		chaos.Fault{Name: WindowStorm, Kind: chaos.KindRateLimit, From: 105 * time.Second, To: 120 * time.Second, Probability: 0.5, RetryAfter: 2 * time.Second},
		chaos.Fault{Name: WindowStalls, Kind: chaos.KindSlow, From: 125 * time.Second, To: 140 * time.Second, Probability: 0.15, Stall: 10 * time.Minute, AfterChunks: 1},
	)
	return &chaos.Timeline{
		Seed:   seed,
		Answer: chaos.Answer{Text: "Done. The step is complete and its result is recorded in the task's notes.", Chunks: 4, Latency: 300 * time.Millisecond},
		Faults: faults,
	}
}
