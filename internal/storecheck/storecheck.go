// Package storecheck is the record an idle consumer runner writes to
// FAILBUS_STORECHECK to find out whether the bus can still store.
package storecheck

import "github.com/failbus/failbus/pkg/events"

// Prefix is the subject prefix of store checks:
// failbus.storecheck.<service>, in FAILBUS_STORECHECK.
const Prefix = events.Prefix + ".storecheck"

// Subject is the subject of service's store checks.
func Subject(service string) string { return Prefix + "." + events.Token(service) }

// Schema is the Failbus-Schema name of a Record.
const Schema = "store_check"

// Record is the record an idle runner writes to show it can store.
type Record struct {
	At      events.Time `msgpack:"at" json:"at"`
	Service string      `msgpack:"service" json:"service"`
	// Pad makes the write a page long.
	Pad []byte `msgpack:"pad" json:"pad,omitempty"`
}

// SchemaName implements events.Message.
func (*Record) SchemaName() string { return Schema }

// Validate implements events.Message: a check names its service.
func (c *Record) Validate() error {
	if c.Service == "" {
		return &events.FieldError{Field: "service", Problem: "required"}
	}
	return nil
}
