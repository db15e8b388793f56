package topology

// ReadFromPaged is ReadFrom with answers of at most pageBytes, so a test
// sees it page.
var ReadFromPaged = readFrom

// HookLastTake sets the functions a LastReader's leader calls before it
// takes the queue and once it has (with how many reads it took), so a
// test can hold reads queued or a batch in flight.
func HookLastTake(r *LastReader, before func(), after func(n int)) {
	r.hookTake, r.hookTaken = before, after
}

// QueuedLastReads is how many reads wait in r's queue.
func QueuedLastReads(r *LastReader) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}
