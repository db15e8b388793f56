/*
Package failbus is a failure bus for LLM agent systems, on NATS JetStream.

It is for teams running fleets of LLM agents against OpenAI, Anthropic or
compatible APIs. Agents publish the raw outcome of every LLM call — status,
body, headers, transport error, as received — and independent services
decide what to do about it. The decision rests on one question: what does
the cause change with? A 503 or a rate limit passes with time, so the bus
retries on a durable timer; a refused segment, a spent key or an
overflowing context does not, so it switches profile, model or provider, or
hands the call back. It holds every agent's calls while a provider is down,
probes it, runs a recovery checklist once it is back, and tells a human
once instead of a thousand times. A decision is only as good as its
classification, so the raw evidence travels with it, each decision names
the rule that fired, and hard evidence overrules a guess (a gateway's empty
400 is not a context overflow). All state lives in JetStream: kill any
process at any moment, nothing is lost or done twice.

This package holds no code; it documents the module. The bus itself is the
failbus command (cmd/failbus) and the services under cmd/.

# Getting started

From a checkout, with Go installed:

	go run ./cmd/failbus demo            # the main scenarios on a throwaway bus
	go test -race -timeout 12m ./...     # every test, against real embedded nats-servers
	go run ./cmd/failbus dev             # a bus with every service, to develop against

# An agent

[github.com/failbus/failbus/pkg/agent.Call] runs one LLM call to completion
under the bus: the function makes the request with any SDK (its own
retries off), Call reports each attempt's raw outcome and carries out the
decision — waits for the durable retry, switches profile, model or
provider, holds through an outage — and returns what only the agent can do
as a [github.com/failbus/failbus/pkg/agent.DecisionError]:

	answer, _, err := agent.Call(ctx, bot, agent.Request{
		Provider: "openai", Model: "gpt-4o", Session: "sess-42", Segment: 1, Turn: 7, Step: 1,
		Describe: openaievidence.Describe,
	}, func(ctx context.Context, at *agent.Attempt) (string, error) {
		c, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: at.Model, Messages: msgs})
		if err != nil {
			return "", err
		}
		return c.Choices[0].Message.Content, nil
	})

The whole program is the example of
[github.com/failbus/failbus/pkg/agent/openaievidence]; TypeScript agents
use clients/typescript, and any other language needs only a NATS client and
msgpack.

# Packages

  - [github.com/failbus/failbus/pkg/agent]: the Go agent client.
  - [github.com/failbus/failbus/pkg/events]: the wire types and subjects.
  - [github.com/failbus/failbus/jetstream]: the streams, consumers and
    buckets, applied idempotently.

# Where next

README.md is the product page; docs/ARCHITECTURE.md the design,
docs/GUARANTEES.md each promise with the test that holds it,
docs/PERFORMANCE.md the figures and how to reproduce them,
docs/CONTRACT.md the wire contract, docs/POLICY.md the policy file,
docs/DEPLOY.md a cluster with users and TLS, docs/OPERATORS.md the
operator commands.
*/
package failbus
