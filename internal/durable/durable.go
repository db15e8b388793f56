// Package durable names the durable consumers an agent keeps on the
// server, and holds what the topology's Apply, the consumer runner and
// `failbus lag` agree on about durables beyond the topology's files: the
// durables earlier versions created and this one retired, and the
// metadata a runner leaves on a durable it recreated.
package durable

import "github.com/failbus/failbus/pkg/events"

// Name is the name of the durable consumer pkg/agent's WithDurable keeps for an
// agent and kind ("decisions" or "retries"); operators look it up with
// `nats consumer info`.
func Name(agent, kind string) string {
	return "agent-" + events.Token(agent) + "-" + kind
}
