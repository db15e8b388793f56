// The client under `failbus dev --auth`: the users of `failbus auth init`,
// each allowed only its own subjects and its own reply inbox. A TypeScript
// agent connects as the agent user with connectAs and does what an agent
// does; without credentials it is refused.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { fromSeed } from "@nats-io/nkeys";
import type { NatsConnection } from "@nats-io/nats-core";

import { Agent, call, connect, connectAs, HTTPError, inboxPrefixFor } from "../src/index.js";
import { startDev, until, type Dev } from "./dev.js";

let dev: Dev;
let seedFile: string;

before(async () => {
  dev = await startDev(["--auth"]);
  seedFile = join(dev.dataDir, "auth", "agent.nk");
});

after(async () => {
  const code = await dev?.stop();
  assert.equal(code, 0, `failbus dev --auth exited ${code} after SIGTERM\n${dev?.log()}`);
});

test("a connection without credentials is refused", async () => {
  await assert.rejects(connect({ servers: dev.url, reconnect: false }), /authorization|auth/i);
});

test("inboxPrefixFor is _INBOX. and the seed's public key", () => {
  const seed = readFileSync(seedFile, "utf8").trim();
  const kp = fromSeed(new TextEncoder().encode(seed));
  assert.equal(inboxPrefixFor(seed), `_INBOX.${kp.getPublicKey()}`);
  assert.throws(() => inboxPrefixFor("not a seed"));
});

test("connectAs names a missing or bad seed", async () => {
  await assert.rejects(connectAs({ servers: dev.url, seedFile: join(dev.dataDir, "auth", "nope.nk") }), /read the nkey seed .*nope\.nk/);
  await assert.rejects(connectAs({ servers: dev.url, seed: "SUnotaseed" }), /not a user nkey seed/);
  await assert.rejects(connectAs({ servers: dev.url }), /needs seed or seedFile/);
});

test("as the agent user: an outcome is decided, its retry comes due, the refusal route answers, a durable reader reads", async () => {
  let nc: NatsConnection | undefined;
  try {
    nc = await connectAs({ servers: dev.url, seedFile });
    const agent = new Agent(nc, `ts-auth-${process.pid}`);
    const [dr, rr] = await Promise.all([agent.decisions(), agent.dueRetries()]);
    const o = await agent.report({
      provider: "openai", model: "gpt-x", turn: 1, step: 1, status: 429,
      headers: { "retry-after-ms": "200" }, body: `{"error":{"type":"rate_limit_error","message":"slow down"}}`,
    });
    const d = await nextOf(dr, "decision");
    assert.equal(d.outcome_id, o.id);
    assert.equal(d.action, "retry");
    const r = await nextOf(rr, "due retry");
    assert.equal(r.retry_id, d.retry_id);
    await agent.started(r.retry_id);
    const ans = await until("the refusal route", async () => agent.route(`s-${process.pid}`, 1, ["openai"]));
    assert.deepEqual(ans.allowed, ["openai"]);
    await Promise.all([dr.close(), rr.close()]);

    // A durable reader (agent-<name>-decisions) works under the same user.
    const durable = new Agent(nc, `ts-auth-durable-${process.pid}`, { durable: true });
    const ddr = await durable.decisions();
    const o2 = await durable.report({ provider: "openai", turn: 1, step: 1, status: 401, body: `{"error":{"type":"authentication_error"}}` });
    const d2 = await nextOf(ddr, "durable decision");
    assert.equal(d2.outcome_id, o2.id);
    assert.equal(d2.action, "give_up");
    await ddr.close();
  } finally {
    await nc?.close();
  }
});

test("as the agent user: call carries a 429 through its due retry, and a held call may read the provider's health", async () => {
  let nc: NatsConnection | undefined;
  try {
    nc = await connectAs({ servers: dev.url, seedFile });
    const agent = new Agent(nc, `ts-auth-call-${process.pid}`);
    let n = 0;
    const { value, trail } = await call(agent, { provider: "openai", turn: 1, step: 1, session: `s-call-${process.pid}`, segment: 1 }, async () => {
      if (++n === 1) throw new HTTPError(429, `{"error":{"type":"rate_limit_error","message":"slow down"}}`, { "retry-after-ms": "100" });
      return "answered";
    });
    assert.equal(value, "answered");
    assert.deepEqual(trail.map((s) => s.decision?.action), ["retry", undefined]);
    // What a held call reads: the provider's health, with a consumer of its
    // own. It resolves (the provider is healthy) or waits until the signal
    // ends it; a permission the role lacks would be another error.
    const stop = new AbortController();
    const enough = new Error("waited long enough");
    const timer = setTimeout(() => stop.abort(enough), 1500);
    await agent.callRouter().waitHealthy("openai", stop.signal).then(
      (h) => assert.ok(h.state === "healthy" || h.state === "recovered"),
      (err: unknown) => assert.equal(err, enough, `the health read failed: ${String(err)}`),
    );
    clearTimeout(timer);
  } finally {
    await nc?.close();
  }
});

/** nextOf reads one value from an async iterable, failing after 30 s. */
async function nextOf<T>(r: AsyncIterable<T>, what: string): Promise<T> {
  const it = r[Symbol.asyncIterator]();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no ${what} within 30 s\n${dev.log().slice(-2000)}`)), 30_000);
  });
  try {
    const res = await Promise.race([it.next(), timeout]);
    assert.ok(!res.done, `${what}: the reader ended`);
    return res.value;
  } finally {
    clearTimeout(timer);
  }
}
