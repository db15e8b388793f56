// Package msgid derives the Nats-Msg-Id of the records failbus services
// write from where their input is, so a redelivery writes the same ids.
package msgid

import "strconv"

// Output is the Nats-Msg-Id of an output: "<service>:<input id>:<key>".
// It depends only on the input's identity and the output's key, so a
// redelivered input re-publishes its outputs under the same ids and the
// output streams drop the copies. Exported for tools and tests that must
// predict it.
func Output(service, inputID, key string) string {
	return service + ":" + inputID + ":" + key
}

// DeadLetter is the Nats-Msg-Id of a dead letter,
// "dlq:<service>:<stream>:<seq>", so an input dead-lettered twice (its ack
// was lost) is stored once. It names where the input is stored rather than
// its id: input that cannot be used cannot be trusted to name itself (an
// id may be a credential put in the wrong field, which a header would
// repeat in clear).
func DeadLetter(service, stream string, seq uint64) string {
	return "dlq:" + service + ":" + StreamSeq(stream, seq)
}

// StreamSeq is the identity of an input without Nats-Msg-Id.
func StreamSeq(stream string, seq uint64) string {
	return stream + ":" + strconv.FormatUint(seq, 10)
}
