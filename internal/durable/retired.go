package durable

// Retired consumers: durables of earlier versions that Apply deletes where
// it finds them, so nothing keeps counting messages nobody reads (a lag
// alarm on them would never clear).
const (
	// RetiredRecoveryDecisions read the decisions stream for the recovery
	// service's probe targets, which it now reads from the outcomes and
	// decisions when a probe is due.
	RetiredRecoveryDecisions = "recovery-decisions"
)

// Consumer is a durable consumer named by its stream.
type Consumer struct{ Stream, Name string }

// Retired are the retired consumers and their streams (the topology's
// names: a test of the topology checks that each stream is one of its).
var Retired = []Consumer{
	{"FAILBUS_DECISIONS", RetiredRecoveryDecisions},
}

// IsRetired reports whether name on stream is a durable an earlier version
// created and this one retired: nothing reads it, and Apply deletes it
// (`failbus lag` says so rather than counting it late forever).
func IsRetired(stream, name string) bool {
	for _, c := range Retired {
		if c.Stream == stream && c.Name == name {
			return true
		}
	}
	return false
}

// MetaRecreated is the metadata key of a durable consumer that a consumer
// runner recreated after finding it deleted; its value says when, by which
// service and at which stream sequence it starts. Such a consumer starts at
// that sequence instead of at the start of its stream, and Apply keeps that
// start instead of reporting the consumer incompatible.
const MetaRecreated = "failbus_recreated"
