package streamread

// ReadFromPaged is ReadFrom with answers of at most pageBytes, so a test
// sees it page.
var readFromPaged = readFrom

// HookLastTake sets the functions a LastReader's leader calls before it
// takes the queue and once it has (with how many reads it took), so a
// test can hold reads queued or a batch in flight.
func hookLastTake(r *LastReader, before func(), after func(n int)) {
	r.hookTake, r.hookTaken = before, after
}

// QueuedLastReads is how many reads wait in r's queue.
func queuedLastReads(r *LastReader) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

var HookLastTake = hookLastTake
var QueuedLastReads = queuedLastReads
var ReadFromPaged = readFromPaged
