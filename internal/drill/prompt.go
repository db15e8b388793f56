package drill

import (
	"fmt"
	"strings"
	"time"
)

// instructions stand for what an agent's system prompt carries besides
// the task (its tools, its rules): a few hundred tokens every call
// re-sends.
var instructions = strings.Repeat("Use the tools you are given; read before you write; keep the notes short and exact; "+
	"say what you changed and why; ask the coordinator when a step needs a person. ", 12)

// stepConversation is the prompt of step (1-based) of t, given the
// answers of the steps before it: the system prompt, the task, and one
// exchange per step done. Within a task the history only grows, so the
// task's content stays in every later prompt.
func stepConversation(t TaskPlan, step int, answers []string) []message {
	conv := []message{
		{role: "system", text: fmt.Sprintf("You are %s, a worker agent, on task %s.\n%s", t.Agent, t.ID, instructions)},
		{role: "user", text: fmt.Sprintf("Task %s: review the change set and write the release notes, in %d steps.%s", t.ID, t.Steps, markerText(t.Marker))},
	}
	for k := 1; k < step; k++ {
		a := ""
		if k-1 < len(answers) {
			a = answers[k-1]
		}
		conv = append(conv, message{role: "assistant", text: a}, message{role: "user", text: fmt.Sprintf("Step %d of %d: go on.", k+1, t.Steps)})
	}
	return conv
}

func markerText(marker string) string {
	if marker == "" {
		return ""
	}
	return " The change set quotes: " + marker
}

// cronConversation is the prompt of an agent's cron run for its
// scheduled time: a journal entry, the memory write it makes.
func cronConversation(agent string, scheduled time.Time) []message {
	return []message{
		{role: "system", text: fmt.Sprintf("You are %s. Keep your journal: one entry per run.", agent)},
		{role: "user", text: "Write the journal entry for " + scheduled.UTC().Format(time.RFC3339Nano) + ": summarise the work since the last entry."},
	}
}

// probeConversation is the smallest real call: what the fleet sends when
// the bus asks it to probe a provider.
var probeConversation = []message{{role: "system", text: "failbus probe"}, {role: "user", text: "Reply OK."}}

// journalKey is the memory entry a cron run writes.
func journalKey(agent string, scheduled time.Time) string {
	return fmt.Sprintf("memory/%s/journal/%d", agent, scheduled.UnixMilli())
}
