// Package durable names the durable consumers an agent keeps on the server.
package durable

import "github.com/failbus/failbus/pkg/events"

// Name is the name of the durable consumer pkg/agent's WithDurable keeps for an
// agent and kind ("decisions" or "retries"); operators look it up with
// `nats consumer info`.
func Name(agent, kind string) string {
	return "agent-" + events.Token(agent) + "-" + kind
}
