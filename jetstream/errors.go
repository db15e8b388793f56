package topology

import (
	"errors"
	"fmt"
)

// Kinds of resource an IncompatibleError can name.
const (
	// kindStream names a stream in an IncompatibleError.
	kindStream = "stream"
	// kindConsumer names a durable consumer in an IncompatibleError.
	kindConsumer = "consumer"
	// kindBucket names a KV bucket in an IncompatibleError.
	kindBucket = "bucket"
)

// ErrIncompatible matches every *IncompatibleError with errors.Is, for a
// caller that only needs to know that Apply refused, not why.
var ErrIncompatible = errors.New("topology: incompatible existing resource")

// IncompatibleError says that a stream, consumer or bucket already exists on
// the server with a setting that cannot be changed in place (storage,
// retention, subjects the topology would drop, message schedules or TTLs
// turned off, a consumer's ack or deliver policy, ...). Apply returns it
// before changing anything, joined with the others it found; use errors.As to
// read one. Resolving it is an operator's decision: migrate or delete the
// resource (losing its messages or its consumer position), or adjust Options.
type IncompatibleError struct {
	// Kind is "stream", "consumer" or "bucket".
	Kind string
	// Name is the stream, consumer or bucket name.
	Name string
	// Field is the setting, spelt as in the JSON files (e.g. "retention").
	Field string
	// Have is the value on the server.
	Have string
	// Want is the value the topology asks for.
	Want string
}

// Error names the resource, the field and both values.
func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("topology: %s %s exists with %s %q but the topology wants %q, which cannot be changed in place",
		e.Kind, e.Name, e.Field, e.Have, e.Want)
}

// Is makes errors.Is(err, ErrIncompatible) true.
func (e *IncompatibleError) Is(target error) bool { return target == ErrIncompatible }

// ErrStore reports a server whose JetStream store limit cannot hold what
// the topology reserves: JetStream sets aside every stream's and bucket's
// max_bytes when it creates it (DefaultReservedBytes with the defaults).
var ErrStore = errors.New("topology: not enough JetStream store")
