// Package retrymark is the started and cancel records an agent writes
// about a due retry, which the scheduler reads to close the retry's wait.
package retrymark

import "github.com/failbus/failbus/pkg/events"

// Schema names of the records an agent's Started and Cancel write and the
// scheduler reads (msgpack, schema header, like every failbus record).
const (
	SchemaStarted = "retry_started"
	SchemaCancel  = "retry_cancel"
)

// Mark is the payload of a started or cancel record.
type Mark struct {
	RetryID string      `msgpack:"retry_id" json:"retry_id"`
	Agent   string      `msgpack:"agent" json:"agent"`
	At      events.Time `msgpack:"at" json:"at"`
}
