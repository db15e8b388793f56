// The README's example, compiled with the package (never run): if the API
// it shows changes, `npm test` fails to build.

import OpenAI from "openai";

import { Agent, call, completionEvidence, connect, DecisionError, wrap } from "../src/index.js";

export async function readmeExample(endpoints: Record<string, string>, headers: Record<string, string>, body: string,
  callAgain: (outcomeId: string) => Promise<void>): Promise<string | undefined> {
  const nc = await connect({ servers: "nats://127.0.0.1:4222" });
  const agent = new Agent(nc, "support-bot-1", { durable: true });

  // Which provider may receive segment 3 of this session now? Call it.
  const { allowed } = await agent.route("sess-42", 3, ["anthropic", "openai"]);
  const { outcome, text } = await wrap(
    () => fetch(endpoints[allowed[0]!]!, { method: "POST", headers, body }),
    { provider: allowed[0]!, model: "claude-sonnet-4", session: "sess-42", segment: 3, turn: 7 },
  );
  await agent.report(outcome); // status, headers, body, thrown errors: as they were

  // What the bus decides, and the retries it scheduled as they come due
  // (both read from when the Agent was created, so nothing is missed).
  void (async () => {
    for await (const d of await agent.decisions()) console.log(d.outcome_id, d.action, d.reason);
  })();
  for await (const r of await agent.dueRetries()) {
    await agent.started(r.retry_id);
    await callAgain(r.outcome_id);
  }
  return text;
}

// The README's call example, compiled the same way.
export async function readmeCallExample(nc: import("@nats-io/nats-core").NatsConnection, signal: AbortSignal,
  keys: Record<string, string>, messages: import("openai").OpenAI.Chat.ChatCompletionMessageParam[],
  show: (attempt: number, text: string) => void, retract: (partial: string) => void,
  handle: (action: string, cls?: string, rule?: string, reason?: string) => void): Promise<string | undefined> {
  const agent = new Agent(nc, "support-bot-1");
  try {
    const { value } = await call(agent, {
      provider: "openai", model: "gpt-4o", profile: "team", providers: ["openai"],
      session: "sess-42", segment: 3, turn: 7, step: 1, signal,
      onChunk: ({ attempt, text }) => show(attempt, text), // tagged per attempt
      onRestart: ({ partial }) => retract(partial), // never spliced
    }, async (at) => {
      const client = new OpenAI({ apiKey: keys[at.profile!], maxRetries: 0 });
      const stream = await client.chat.completions.create({ model: at.model!, messages, stream: true }, { signal: at.signal });
      let text = "";
      let finish: string | null | undefined;
      for await (const c of stream) {
        const d = c.choices[0]?.delta?.content ?? "";
        if (d) at.emit(d); // output, and a sign of life for the stall watchdog
        text += d;
        finish = c.choices[0]?.finish_reason ?? finish;
      }
      if (finish === "content_filter") at.observe(completionEvidence({ choices: [{ finish_reason: finish }] }, "increment"));
      return text;
    });
    return value;
  } catch (err) {
    if (err instanceof DecisionError) handle(err.action, err.decision.class, err.decision.rule, err.decision.reason);
    else throw err;
    return undefined;
  }
}

// The repository README's TypeScript agent, compiled the same way.
export async function readmeFrontPageExample(messages: import("openai").OpenAI.Chat.ChatCompletionMessageParam[]): Promise<void> {
  const nc = await connect({ servers: "nats://127.0.0.1:4222" }); // `failbus dev`, or your bus
  const agent = new Agent(nc, "support-bot");
  const client = new OpenAI({ maxRetries: 0 }); // the bus decides retries
  try {
    const { value } = await call(agent, { provider: "openai", model: "gpt-4o", session: "sess-42", segment: 1, turn: 7, step: 1 },
      async (at) => {
        const c = await client.chat.completions.create({ model: at.model!, messages }, { signal: at.signal });
        return c.choices[0]?.message.content ?? "";
      });
    console.log(value);
  } catch (err) {
    if (err instanceof DecisionError) console.error(`failbus decided ${err.action}: ${err.decision.reason}`);
    else throw err;
  }
}
