package openaievidence_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/agent/openaievidence"
)

// An agent runs each LLM call under the bus with agent.Call: the OpenAI
// SDK makes the request with its own retries off, Call reports every
// attempt's raw outcome and carries out what the bus decides (wait for
// the durable retry, switch profile, model or provider, hold while the
// provider is down), and what only the agent can do comes back as a
// *agent.DecisionError. README.md shows the body of this example; it
// needs a running bus (`failbus dev`) and an OpenAI key, so it is
// compiled, not run.
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL) // `failbus dev`, or your bus
	if err != nil {
		log.Fatal(err)
	}
	bot, err := agent.New(nc, "support-bot")
	if err != nil {
		log.Fatal(err)
	}
	client := openai.NewClient(option.WithMaxRetries(0)) // the bus decides retries

	answer, _, err := agent.Call(ctx, bot, agent.Request{
		Provider: "openai", Model: "gpt-4o", Session: "sess-42", Segment: 1, Turn: 7, Step: 1,
		Describe: openaievidence.Describe, // the SDK's errors, read as raw evidence
	}, func(ctx context.Context, at *agent.Attempt) (string, error) {
		c, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    at.Model, // the bus may switch it
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Summarise ticket 42.")},
		})
		if err != nil {
			return "", err // reported; Call carries out the decision
		}
		if ev, ok := openaievidence.Completion(c); !ok {
			at.Observe(ev) // a 200 that did not answer: the content filter
			return "", nil
		}
		return c.Choices[0].Message.Content, nil
	})
	var de *agent.DecisionError
	if errors.As(err, &de) { // rerender, compact, skip_provider, give_up: the agent's to do
		log.Fatalf("failbus decided %s: %s", de.Action(), de.Decision.Reason)
	} else if err != nil {
		log.Fatal(err)
	}
	fmt.Println(answer)
}
