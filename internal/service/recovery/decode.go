package recovery

import (
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/failbus/failbus/pkg/events"
)

// decodeAs reads a message that must be of want's type. The subject carries
// its type (CONTRACT.md "On the bus"): a message without a Failbus-Schema
// header is read as want; a header naming another type is an error that
// says so. The result is validated.
func decodeAs[T events.Message](h nats.Header, data []byte, want T) (T, error) {
	if h != nil && h.Get(events.HeaderSchema) != "" {
		m, err := events.Decode(h, data)
		if err != nil {
			return want, err
		}
		t, ok := m.(T)
		if !ok {
			return want, fmt.Errorf("a %s message does not belong on this subject (want %s)", m.SchemaName(), want.SchemaName())
		}
		return t, nil
	}
	if err := events.Unmarshal(data, want); err != nil {
		return want, err
	}
	if err := want.Validate(); err != nil {
		return want, fmt.Errorf("invalid %s: %w", want.SchemaName(), err)
	}
	return want, nil
}
