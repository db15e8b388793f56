package topology

// ReadFromPaged is ReadFrom with answers of at most pageBytes, so a test
// sees it page.
var ReadFromPaged = readFrom

// HookLastBatch sets the function a LastReader's batch leader calls
// before it takes the queue, so a test can hold a read in flight.
func HookLastBatch(r *LastReader, hook func()) { r.hookBatch = hook }

// QueuedLastReads is how many reads wait in r's queue.
func QueuedLastReads(r *LastReader) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}
