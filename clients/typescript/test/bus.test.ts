// The client against a real `failbus dev` (built from this repository):
// what a TypeScript agent reports is classified and decided by the Go
// services, and what they send back reaches it.

import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer as createHTTPServer } from "node:http";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { decode } from "@msgpack/msgpack";
import { DeliverPolicy, jetstream, jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/nats-core";

import { Agent, connect, InvariantError, requestRoute, Rules, RouteServiceError, Subject, wrap, type Decision, type Reader } from "../src/index.js";
import { startDev, until, type Dev } from "./dev.js";

let dev: Dev;
let nc: NatsConnection;
let jsm: JetStreamManager;

before(async () => {
  // Recovery from an outage needs 3 successes in a row spanning at least
  // recovery_min_time (2m by default); 1ms keeps the outage test short.
  const pol = join(mkdtempSync(join(tmpdir(), "failbus-ts-policy-")), "policy.yaml");
  writeFileSync(pol, "scope:\n  recovery_min_time: 1ms\n");
  dev = await startDev(["--policy", pol]);
  nc = await connect({ servers: dev.url });
  jsm = await jetstreamManager(nc);
});

after(async () => {
  await nc?.close();
  const code = await dev?.stop();
  assert.equal(code, 0, `failbus dev exited ${code} after SIGTERM\n${dev?.log()}`);
});

/** next reads one value from a reader, failing after timeoutMs. */
async function next<T>(r: Reader<T> | AsyncIterator<T>, what: string, timeoutMs = 30_000): Promise<T> {
  const it = Symbol.asyncIterator in r ? (r as Reader<T>)[Symbol.asyncIterator]() : (r as AsyncIterator<T>);
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no ${what} within ${timeoutMs} ms\n${dev.log().slice(-2000)}`)), timeoutMs);
  });
  try {
    const res = await Promise.race([it.next(), timeout]);
    assert.ok(!res.done, `${what}: the reader ended`);
    return res.value;
  } finally {
    clearTimeout(timer);
  }
}

/** readAll reads every message on subject in stream with an ordered consumer, msgpack-decoded. */
async function readAll(stream: string, subject: string): Promise<Record<string, unknown>[]> {
  const js = jetstream(nc);
  const c = await js.consumers.get(stream, { filter_subjects: [subject], deliver_policy: DeliverPolicy.All });
  const out: Record<string, unknown>[] = [];
  const info = await c.info(true);
  if (info.num_pending === 0) return out;
  const batch = await c.fetch({ max_messages: info.num_pending, expires: 5000 });
  for await (const m of batch) {
    out.push(decode(m.data) as Record<string, unknown>);
    if (out.length === info.num_pending) break;
  }
  await c.delete().catch(() => {});
  return out;
}

const unique = (p: string) => `${p}-${process.pid}-${Math.random().toString(36).slice(2, 8)}`;

describe("outcome → decision → due retry", () => {
  test("a 429 with retry-after-ms is decided retry, comes due once, not early, and started marks the ledger", async () => {
    const agent = new Agent(nc, unique("ts-rt"));
    const decisions = agent.decisions();
    const due = agent.dueRetries();
    const [dr, rr] = await Promise.all([decisions, due]);
    const o = await agent.report({
      provider: "openai", model: "gpt-x", profile: "key-1", turn: 1, step: 1, status: 429,
      headers: { "retry-after-ms": "300" }, body: `{"error":{"type":"rate_limit_error","message":"slow down"}}`,
    });
    assert.ok(o.id && o.at instanceof Date && o.agent === agent.name);
    const d: Decision = await next(dr, "decision");
    assert.equal(d.outcome_id, o.id);
    assert.equal(d.action, "retry");
    assert.equal(d.class, "rate_limit");
    assert.equal(d.delay_ms, 300);
    assert.equal(d.retry, 1);
    assert.ok(d.retry_id && d.due_at instanceof Date);
    const r = await next(rr, "due retry");
    const received = Date.now();
    assert.equal(r.retry_id, d.retry_id);
    assert.equal(r.outcome_id, o.id);
    assert.equal(r.retry, 1);
    assert.ok(received >= d.due_at!.getTime(), `due retry arrived ${d.due_at!.getTime() - received} ms early`);
    await agent.started(r.retry_id);
    // The scheduler (Go) reads the TypeScript started record: the ledger
    // entry of this retry gets started_at.
    await until("the ledger to show the retry started", async () => {
      const ledger = await readAll("FAILBUS_RETRIES", "failbus.retry.ledger.>");
      return ledger.some((e) => e.retry_id === d.retry_id && e.started_at) ? true : undefined;
    });
    const dues = await readAll("FAILBUS_RETRIES", Subject.retryDue(agent.name));
    assert.equal(dues.length, 1, "the retry came due exactly once");
    // Reporting the same outcome again (a lost ack) changes nothing.
    await agent.report(o);
    await Promise.all([dr.close(), rr.close()]);
    const names: string[] = [];
    for await (const ci of jsm.consumers.list("FAILBUS_DECISIONS")) names.push(ci.name);
    assert.ok(!names.some((n) => n.includes(agent.name)), "a closed ordered reader leaves no consumer behind");
  });

  test("a durable reader keeps its position across a restart and leaves no lease behind", async () => {
    const name = unique("ts-durable");
    const first = new Agent(nc, name, { durable: true });
    const r1 = await first.decisions();
    assert.equal(r1.consumer, `agent-${name}-decisions`);
    const a = await first.report({ provider: "openai", status: 401, body: `{"error":{"message":"invalid api key"}}` });
    assert.equal((await next(r1, "first decision")).outcome_id, a.id);
    // A decision published while the reader is closed is read by the next
    // process of the same agent, at once (not after the 30 s AckWait).
    const b = await first.report({ provider: "openai", status: 401, body: `{"error":{"message":"invalid api key"}}` });
    await until("the second decision to be stored", async () => {
      const all = await readAll("FAILBUS_DECISIONS", Subject.decision(name));
      return all.some((d) => d.outcome_id === b.id) ? true : undefined;
    });
    await r1.close();
    const info = await jsm.consumers.info("FAILBUS_DECISIONS", r1.consumer);
    assert.equal(info.config.max_ack_pending, 1);
    const second = new Agent(nc, name, { durable: true });
    const r2 = await second.decisions();
    const started = Date.now();
    assert.equal((await next(r2, "decision after restart", 10_000)).outcome_id, b.id);
    assert.ok(Date.now() - started < 10_000);
    await r2.close();
    assert.equal((await jsm.consumers.info("FAILBUS_DECISIONS", r2.consumer)).num_ack_pending, 0);
    await jsm.consumers.delete("FAILBUS_DECISIONS", r2.consumer);
  });
});

describe("refusal route", () => {
  test("a refused segment's provider is skipped with a reason and a re-probe time; a boundary starts afresh", async () => {
    const agent = new Agent(nc, unique("ts-route"));
    const dr = await agent.decisions();
    const session = unique("sess");
    const o = await agent.report({
      provider: "anthropic", session, segment: 1, status: 200, stop_reason: "refusal", refusal_scope: "history",
      body: `{"stop_reason":"refusal","content":[]}`,
    });
    const d = await next(dr, "refusal decision");
    assert.equal(d.outcome_id, o.id);
    assert.equal(d.action, "skip_provider");
    const ans = await until("the route to skip anthropic", async () => {
      const a = await agent.route(session, 1, ["anthropic", "openai"]);
      return a.skipped.length > 0 ? a : undefined;
    });
    assert.deepEqual(ans.allowed, ["openai"]);
    assert.equal(ans.skipped[0]!.provider, "anthropic");
    assert.ok(ans.skipped[0]!.reason.length > 0);
    assert.ok(ans.skipped[0]!.next_probe_at instanceof Date && ans.skipped[0]!.next_probe_at > ans.at);
    assert.equal(ans.session, session);
    await agent.boundary({ session, segment: 2, reason: "compaction" });
    const fresh = await agent.route(session, 2, ["anthropic", "openai"]);
    assert.deepEqual(fresh.allowed, ["anthropic", "openai"]);
    await dr.close();
  });

  test("a request the service cannot use is a RouteServiceError naming the problem", async () => {
    await assert.rejects(requestRoute(nc, { agent: "", session: "s", segment: 1, providers: ["p"] }),
      (err) => err instanceof RouteServiceError && err.code === "400" && /agent and at least one provider/.test(err.description));
  });
});

describe("stream invariants on the bus", () => {
  test("each rule's violation outcome is classified invariant by the classifier", async () => {
    const agent = new Agent(nc, unique("ts-inv"));
    const provider = unique("grammarless");
    const ids = new Map<string, string>();
    for (const rule of Rules) {
      const err = new InvariantError(rule, 3, `fixture for ${rule}`);
      const o = await agent.report(err.toOutcome({ provider, model: "m", status: 200 }));
      ids.set(o.id, rule);
    }
    const got = await until("all violations classified", async () => {
      const cs = await readAll("FAILBUS_CLASSIFIED", `failbus.classified.${provider}.>`);
      return cs.length >= Rules.length ? cs : undefined;
    });
    for (const c of got) {
      assert.equal(c.class, "invariant", `outcome for ${ids.get(c.outcome_id as string)} classified ${String(c.class)} by ${String(c.rule)}`);
      assert.equal(c.retryable, false);
      assert.ok(ids.has(c.outcome_id as string));
    }
    assert.equal(new Set(got.map((c) => c.outcome_id)).size, Rules.length);
  });
});

/** A loopback port nothing listens on: a call to it is refused. */
async function closedPort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

describe("wrap on the bus", () => {
  test("what wrap records of real calls is classified by its evidence", async () => {
    const http = createHTTPServer((req, res) => {
      switch (req.url) {
        case "/429":
          res.writeHead(429, { "retry-after": "3" }).end(`{"error":{"type":"rate_limit_error","message":"Too many requests"}}`);
          break;
        case "/401":
          res.writeHead(401).end(`{"error":{"type":"authentication_error","message":"invalid x-api-key"}}`);
          break;
        case "/empty":
          res.writeHead(200).end("");
          break;
        case "/refusal":
          res.writeHead(200).end(`{"stop_reason":"refusal","content":[]}`);
          break;
        case "/ok":
          res.writeHead(200).end(`{"content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn"}`);
          break;
        case "/cut":
          res.writeHead(200, { "content-length": "500" });
          res.write(`{"content":[`);
          setTimeout(() => res.socket?.destroy(), 20);
          break;
        case "/slow":
          setTimeout(() => res.writeHead(200).end("{}"), 2000).unref();
          break;
      }
    });
    await new Promise<void>((r) => http.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(http.address() as { port: number }).port}`;
    try {
      const agent = new Agent(nc, unique("ts-wrap"));
      const provider = unique("wrapped");
      const want = new Map<string, string>();
      const call = async (path: string, cls: string, init: RequestInit = {}) => {
        const w = await wrap(() => fetch(path.startsWith("http") ? path : url + path, init), { provider, model: "m" });
        want.set((await agent.report(w.outcome)).id, `${path} → ${cls}`);
      };
      await call("/429", "rate_limit");
      await call("/401", "auth");
      await call("/empty", "empty_response");
      await call("/refusal", "content_refusal");
      await call("/ok", "ok");
      await call("/cut", "transport");
      await call("/slow", "timeout", { signal: AbortSignal.timeout(100) });
      await call(`http://127.0.0.1:${await closedPort()}/`, "transport");
      const got = await until("every wrapped outcome classified", async () => {
        const cs = await readAll("FAILBUS_CLASSIFIED", `failbus.classified.${provider}.>`);
        return cs.length >= want.size ? cs : undefined;
      });
      const seen = got.map((c) => `${want.get(c.outcome_id as string)?.split(" → ")[0]} → ${String(c.class)}`).sort();
      assert.deepEqual(seen, [...want.values()].sort());
    } finally {
      http.closeAllConnections();
      await new Promise<void>((r) => http.close(() => r()));
    }
  });
});

describe("recovery", () => {
  test("a task is held while its provider is down and dispatched after it recovered; the checklist's commands arrive", async () => {
    const provider = unique("flaky");
    const agent = new Agent(nc, unique("ts-rec"));
    const [dr, disp, ctl] = await Promise.all([agent.decisions(), agent.dispatches(), agent.controls()]);
    try {
      // Before the outage: a task goes out at once, and a subagent works on
      // it, promising a heartbeat every 10 ms; its last one is a second old.
      // The checklist finds it stale (older than 3 intervals) when the
      // provider recovers, however quickly the bus gets there: with a fresh
      // heartbeat, an outage shorter than 30 ms (the bus is that fast)
      // found the subagent running and, rightly, did not kill it.
      const job = await agent.task({ provider, kind: "job" });
      const d1 = await next(disp, "the job's dispatch");
      assert.deepEqual([d1.task_id, d1.attempt], [job.id, 1]);
      assert.match(d1.reason ?? "", /^submitted/);
      await agent.heartbeat({ subagent: "sub-ts", provider, status: "running", interval_ms: 10, task_id: job.id, at: Date.now() - 1000 });
      // The provider fails at the network layer: real calls to a port
      // nothing listens on, wrapped into outcomes.
      const port = await closedPort();
      for (let turn = 1; turn <= 3; turn++) {
        const w = await wrap(() => fetch(`http://127.0.0.1:${port}/v1/messages`, { method: "POST" }), { provider, model: "m", turn });
        assert.equal(w.outcome.status, 0);
        await agent.report(w.outcome);
      }
      // The bus tells the agent to wait for the provider (an outage, not a
      // reason to switch models).
      for (;;) {
        const d = await next(dr, "a wait_provider decision");
        if (d.action === "wait_provider") break;
        assert.equal(d.action, "retry", `decision ${JSON.stringify(d)}`);
      }
      // During the outage a memory write fails, and a task is submitted.
      await agent.write({ key: "memory/today.md", ok: false, error: "fetch failed", provider });
      const payload = { doc: 42, tags: ["a", "b"], nested: { ok: true } };
      const held = await agent.task({ provider, kind: "summarize", payload });
      // A task for a healthy provider, submitted after it, is dispatched at
      // once; recovery reads tasks one at a time in submission order, so by
      // then the held one was handled, and not dispatched.
      const other = await agent.task({ provider: unique("healthy"), kind: "other" });
      const d2 = await next(disp, "the healthy provider's task");
      assert.deepEqual([d2.task_id, d2.attempt], [other.id, 1]);
      // The provider answers again: successes in a row recover it
      // (recovery_min_time is 1ms: their times are 2 ms apart).
      const t0 = Date.now();
      for (let i = 0; i < 3; i++) {
        await agent.report({ provider, model: "m", ok: true, status: 200, body: `{"content":[{"type":"text","text":"ok"}]}`, at: t0 + 2 * i, turn: 10 + i });
      }
      // After recovery: the killed subagent's task again (attempt 2), and
      // the held task released (attempt 1), its payload untouched.
      const after = new Map<string, (typeof d1)>();
      while (after.size < 2) {
        const d = await next(disp, "the dispatches after recovery", 60_000);
        after.set(`${d.task_id}#${d.attempt}`, d);
      }
      const redone = after.get(`${job.id}#2`);
      const released = after.get(`${held.id}#1`);
      assert.ok(redone && released, `dispatched ${[...after.keys()].join(", ")}`);
      assert.match(redone.reason ?? "", /sub-ts|redispatch|killed/);
      assert.equal(released.kind, "summarize");
      assert.deepEqual(released.payload, payload, "the payload passes through untouched");
      assert.match(released.reason ?? "", /^released/, `dispatched as ${released.reason}, not released after the outage`);
      const states = (await readAll("FAILBUS_HEALTH", `failbus.health.${provider}`)).map((h) => h.state);
      assert.ok(states.includes("outage") && states.at(-1) === "recovered", `health ${states.join(" → ")}`);
      // The checklist's commands reach the agent.
      const commands: Record<string, string> = {};
      while (Object.keys(commands).length < 2) {
        const c = await next(ctl, "recovery's commands");
        if (c.action === "kill") commands.kill = c.subagent!;
        if (c.action === "check_write") commands.check_write = c.key!;
      }
      assert.deepEqual(commands, { kill: "sub-ts", check_write: "memory/today.md" });
      const steps = await until("the checklist to be done", async () => {
        const rs = await readAll("FAILBUS_RECOVERIES", `failbus.recovery.${provider}`);
        return rs.some((r) => r.done) ? rs : undefined;
      });
      assert.equal(steps.find((r) => r.step === "release")?.released, 1);
      // Nothing the agent wrote was dead-lettered.
      const dead = (await readAll("FAILBUS_DLQ", "failbus.dlq.>")).filter((d) => String(d.subject).endsWith(`.${agent.name}`));
      assert.deepEqual(dead.map((d) => d.reason), []);
    } finally {
      await Promise.all([dr.close(), disp.close(), ctl.close()]);
    }
  });
});

test("a reader ends when its connection closes", async () => {
  const other = await connect({ servers: dev.url });
  const agent = new Agent(other, unique("ts-close"));
  const r = await agent.decisions();
  const it = r[Symbol.asyncIterator]();
  const pending = it.next();
  await other.close();
  const res = await Promise.race([pending, new Promise<"hung">((ok) => setTimeout(() => ok("hung"), 10_000).unref())]);
  assert.notEqual(res, "hung", "the loop is still waiting after its connection closed");
  assert.equal((res as IteratorResult<Decision>).done, true);
});
