package drill

import (
	"sort"
	"sync"
	"time"
)

// Task states, as the fleet's owner sees them.
const (
	taskWaiting = iota // not given yet, or held by the bus
	taskRunning        // a subagent works on it
	taskDone
	taskLost
)

// tracker is what the fleet's owner knows: each task's state, and the
// counts only the client can make (pages, re-runs, kills).
type tracker struct {
	start time.Time
	scale float64

	mu    sync.Mutex
	tasks map[string]*taskState
	// why counts the tasks lost, by reason.
	why map[string]int

	pages         int // failures the agent saw (sdk), each a page
	cronRuns      int // scheduled cron times
	cronsCut      int // runs the end of the run cut short
	cronOK        map[string]bool
	cronsRerun    int
	writesRedone  int
	killed        int
	wronglyKilled int
	crashed       int
	restarts      int // streams restarted after failing midway
	// decisions counts the decisions the fleet's calls got, by action.
	decisions map[string]int
	// resumed is the step each re-dispatched task resumed after (its
	// checkpoint).
	resumed map[string]int
}

type taskState struct {
	state       int
	completions int
	// calls is how many calls of it are in flight; active when the
	// latest of them last produced something.
	calls  int
	active time.Time
	doneAt time.Duration // timeline time
	why    string
}

func newTracker(p *Plan, start time.Time, scale float64) *tracker {
	t := &tracker{start: start, scale: scale, tasks: map[string]*taskState{}, why: map[string]int{}, cronOK: map[string]bool{}, resumed: map[string]int{}, decisions: map[string]int{}}
	for _, a := range p.Agents {
		for _, task := range a.Tasks {
			t.tasks[task.ID] = &taskState{}
		}
	}
	return t
}

// offset is t on the timeline.
func (t *tracker) offset(at time.Time) time.Duration {
	return time.Duration(float64(at.Sub(t.start)) / t.scale)
}

func (t *tracker) running(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.tasks[id]; s != nil && s.state == taskWaiting {
		s.state = taskRunning
	}
}

// call marks a call of task id starting (n = 1) or ending (n = -1).
func (t *tracker) call(id string, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.tasks[id]; s != nil {
		s.calls += n
		s.active = time.Now()
	}
}

// touch marks task id active (a chunk arrived).
func (t *tracker) touch(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.tasks[id]; s != nil {
		s.active = time.Now()
	}
}

// done records a completion of task id.
func (t *tracker) done(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.tasks[id]
	if s == nil {
		return
	}
	s.completions++
	if s.state != taskDone {
		s.state, s.why = taskDone, ""
		s.doneAt = t.offset(time.Now())
	}
}

// lost records that task id will not be completed, and why.
func (t *tracker) lost(id, why string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.tasks[id]; s != nil && s.state != taskDone && s.state != taskLost {
		s.state, s.why = taskLost, why
		t.why[why]++
	}
}

// waiting puts task id back to waiting (its subagent crashed or was
// killed; the bus will dispatch it again).
func (t *tracker) waiting(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.tasks[id]; s != nil && s.state == taskRunning {
		s.state = taskWaiting
	}
}

func (t *tracker) add(counter *int, n int) {
	t.mu.Lock()
	*counter += n
	t.mu.Unlock()
}

// cronRan records that the cron run for key succeeded; false when it had
// already.
func (t *tracker) cronRan(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cronOK[key] {
		return false
	}
	t.cronOK[key] = true
	return true
}

// settled reports whether every task is done or lost, or (hung) is in a
// call silent for longer than silent: nothing the fleet still does would
// change the figures.
func (t *tracker) settled(silent time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	for _, s := range t.tasks {
		switch {
		case s.state == taskDone || s.state == taskLost:
		case s.state == taskRunning && s.calls > 0 && now.Sub(s.active) > silent:
		default:
			return false
		}
	}
	return true
}

// finish marks what is still unfinished lost: hung in a silent call, or
// unfinished.
func (t *tracker) finish(silent time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	for _, s := range t.tasks {
		if s.state == taskDone || s.state == taskLost {
			continue
		}
		why := "unfinished at the end of the run"
		if s.state == taskRunning && s.calls > 0 && now.Sub(s.active) > silent {
			why = "hung in a call that never answered"
		}
		s.state, s.why = taskLost, why
		t.why[why]++
	}
}

// counts is a snapshot for the progress line and the figures.
type counts struct {
	done, lost, running, waiting, twice int
	why                                 map[string]int
}

func (t *tracker) counts(p *Plan) counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := counts{why: map[string]int{}}
	for k, v := range t.why {
		c.why[k] = v
	}
	for _, a := range p.Agents {
		for _, task := range a.Tasks {
			s := t.tasks[task.ID]
			switch s.state {
			case taskDone:
				c.done++
			case taskLost:
				c.lost++
			case taskRunning:
				c.running++
			default:
				c.waiting++
			}
			if s.completions > 1 {
				c.twice++
			}
		}
	}
	return c
}

// reasons lists why tasks were lost, most frequent first.
func (c counts) reasons() []string {
	var out []string
	for k := range c.why {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if c.why[out[i]] != c.why[out[j]] {
			return c.why[out[i]] > c.why[out[j]]
		}
		return out[i] < out[j]
	})
	return out
}

// resume records that task id was dispatched again from checkpoint step.
func (t *tracker) resume(id string, step int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.resumed[id] = max(t.resumed[id], step)
}

// decided counts a decision of action.
func (t *tracker) decided(action string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.decisions[action]++
}
