package streamread

import (
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// IsWrongLastSeq reports a compare-and-set conflict as the server words
// it: a publish with an expected last sequence (per subject, as the
// ledger's appends and KV updates send it, or of the stream) that found
// another (10071, or 10164 on replicated streams). A nil error is none,
// without errors.As, whose target escapes: the callers ask after every
// write, most of them successful.
func IsWrongLastSeq(err error) bool {
	if err == nil {
		return false
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}
