package topology

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

const DefaultMaxAgeAudit = defaultMaxAgeAudit
const DefaultMaxAgeClassified = defaultMaxAgeClassified
const DefaultMaxAgeControl = defaultMaxAgeControl
const DefaultMaxAgeDLQ = defaultMaxAgeDLQ
const DefaultMaxAgeDispatch = defaultMaxAgeDispatch
const DefaultMaxAgeHealth = defaultMaxAgeHealth
const DefaultMaxAgeLiveness = defaultMaxAgeLiveness
const DefaultMaxAgeNotify = defaultMaxAgeNotify
const DefaultMaxAgeOutcomes = defaultMaxAgeOutcomes
const DefaultMaxAgeRecoveries = defaultMaxAgeRecoveries
const DefaultMaxAgeReports = defaultMaxAgeReports
const DefaultMaxAgeRetries = defaultMaxAgeRetries
const DefaultMaxAgeStoreCheck = defaultMaxAgeStoreCheck
const DefaultMaxBytesAudit = defaultMaxBytesAudit
const DefaultMaxBytesClassified = defaultMaxBytesClassified
const DefaultMaxBytesControl = defaultMaxBytesControl
const DefaultMaxBytesDLQ = defaultMaxBytesDLQ
const DefaultMaxBytesDecisions = defaultMaxBytesDecisions
const DefaultMaxBytesDispatch = defaultMaxBytesDispatch
const DefaultMaxBytesHealth = defaultMaxBytesHealth
const DefaultMaxBytesLiveness = defaultMaxBytesLiveness
const DefaultMaxBytesNotify = defaultMaxBytesNotify
const DefaultMaxBytesOutcomes = defaultMaxBytesOutcomes
const DefaultMaxBytesRecoveries = defaultMaxBytesRecoveries
const DefaultMaxBytesReports = defaultMaxBytesReports
const DefaultMaxBytesRetries = defaultMaxBytesRetries
const DefaultMaxBytesStoreCheck = defaultMaxBytesStoreCheck
const DefaultMaxBytesTasks = defaultMaxBytesTasks
const DefaultStorage = defaultStorage
const DefaultTTLCrons = defaultTTLCrons
const DefaultTTLDLQRequeues = defaultTTLDLQRequeues
const DefaultTTLHeartbeats = defaultTTLHeartbeats
const DefaultTTLLimits = defaultTTLLimits
const DefaultTTLNotifyBudget = defaultTTLNotifyBudget
const DefaultTTLPolicy = defaultTTLPolicy
const DefaultTTLRecovery = defaultTTLRecovery
const DefaultTTLRefusals = defaultTTLRefusals
const DefaultTTLScope = defaultTTLScope

var HookLastTake = hookLastTake
var QueuedLastReads = queuedLastReads
var ReadFromPaged = readFromPaged
