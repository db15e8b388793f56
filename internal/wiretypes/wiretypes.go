// Package wiretypes, imported, puts every record type the failbus services
// write into pkg/events' type table: the contract's types are there
// already, and the services' own records (the scheduler's retry ledger
// entries and policy audits, the notifier's audit records, the agent's
// started and cancel records) are registered by their packages' init
// functions. A reader of the whole bus (tail, report, dlq) imports it so
// it decodes every message typed instead of as generic msgpack.
package wiretypes

import (
	// Each registers its records with events.Register.
	_ "github.com/failbus/failbus/internal/delivery"
	_ "github.com/failbus/failbus/internal/retrymark"
	_ "github.com/failbus/failbus/internal/service/scheduler"
)
