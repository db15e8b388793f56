// The README's example, compiled with the package (never run): if the API
// it shows changes, `npm test` fails to build.

import { Agent, connect, wrap } from "../src/index.js";

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
