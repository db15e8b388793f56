// call against a real `failbus dev` started with the shared scenario file's
// policy: every scenario of testdata/call/scenarios.json, as Go's
// pkg/agent/scenario_test.go runs them, then what the file does not cover
// (a failure the bus never decides, a cancelled retry wait, the SDKs'
// errors read as evidence).

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import type { NatsConnection } from "@nats-io/nats-core";
import OpenAI from "openai";

import {
  Agent, type Attempt, call, type CallRequest, completionEvidence, connect, DecisionError, evidenceOf, HTTPError,
  NoDecisionError, type Restart, sdkErrorEvidence, type Step, Subject, wrap,
} from "../src/index.js";
import { repoRoot, startDev, until, type Dev } from "./dev.js";

interface ScriptAttempt {
  ok?: boolean;
  result?: string;
  chunks?: string[];
  status?: number;
  body?: string;
  headers?: Record<string, string>;
  transport_error?: string;
  stall?: boolean;
  stop_reason?: string;
  refusal_scope?: "increment" | "history";
}

interface ScenarioCall {
  request: {
    provider: string; model?: string; providers?: string[]; session?: string; segment?: number;
    turn?: number; step?: number; stall_after_ms?: number; resume_window_ms?: number;
  };
  attempts?: ScriptAttempt[];
  down?: ScriptAttempt;
  up_after_probes?: number;
  up?: ScriptAttempt;
  expect: {
    actions?: string[]; contains_action?: string; result?: string; error_action?: string; error_class?: string;
    classes?: string[]; transport_error_contains?: string; chunks?: [number, string][];
    restarts?: { attempt: number; previous: number; partial: string }[];
    started?: number; after_due?: boolean; min_probes?: number; calls_while_held?: number; targets?: string[];
  };
}

interface ScenarioFile {
  policy: string;
  scenarios: { name: string; calls: ScenarioCall[] }[];
}

const file: ScenarioFile = JSON.parse(readFileSync(join(repoRoot(), "testdata", "call", "scenarios.json"), "utf8"));

let dev: Dev;
let nc: NatsConnection;
let jsm: JetStreamManager;

before(async () => {
  const pol = join(mkdtempSync(join(tmpdir(), "failbus-ts-call-")), "policy.yaml");
  writeFileSync(pol, file.policy);
  dev = await startDev(["--policy", pol]);
  nc = await connect({ servers: dev.url });
  jsm = await jetstreamManager(nc);
});

after(async () => {
  await nc?.close();
  const code = await dev?.stop();
  assert.equal(code, 0, `failbus dev exited ${code} after SIGTERM\n${dev?.log()}`);
});

/** play runs one scripted attempt as a call function would. */
async function play(s: ScriptAttempt, at: Attempt): Promise<string> {
  for (const c of s.chunks ?? []) at.emit(c);
  if (s.stall) {
    await new Promise((_, reject) => at.signal.addEventListener("abort", () => reject(at.signal.reason), { once: true }));
  }
  if (s.ok) return s.result ?? "";
  if (s.transport_error) throw new Error(s.transport_error);
  if (s.stop_reason) {
    at.observe({ status: s.status, stop_reason: s.stop_reason, ...(s.refusal_scope ? { refusal_scope: s.refusal_scope } : {}) });
    return "";
  }
  throw new HTTPError(s.status ?? 0, s.body ?? "", s.headers ?? {});
}

/** stored counts the messages on subject in stream. */
async function stored(stream: string, subject: string): Promise<number> {
  const info = await jsm.streams.info(stream, { subjects_filter: subject });
  return Object.values(info.state.subjects ?? {}).reduce((a, b) => a + b, 0);
}

function newAgent(name: string): { agent: Agent; errors: Error[] } {
  const errors: Error[] = [];
  return { agent: new Agent(nc, name, { onError: (e) => errors.push(e) }), errors };
}

async function runScenarioCall(agent: Agent, c: ScenarioCall): Promise<void> {
  const r = c.request;
  const chunks: [number, string][] = [];
  const restarts: Restart[] = [];
  const targets: string[] = [];
  const times: number[] = [];
  let probes = 0;
  let held = 0;
  let up = false;
  let n = 0;
  const req: CallRequest = {
    provider: r.provider, model: r.model, providers: r.providers, session: r.session, segment: r.segment, turn: r.turn, step: r.step,
    stallAfterMs: r.stall_after_ms, resumeWindowMs: r.resume_window_ms,
    onChunk: (ch) => chunks.push([ch.attempt, ch.text]),
    onRestart: (rs) => restarts.push(rs),
    signal: AbortSignal.timeout(90_000),
  };
  let res: string | undefined;
  let trail: Step[] = [];
  let err: unknown;
  try {
    ({ value: res, trail } = await call(agent, req, async (at) => {
      targets.push(at.provider);
      times.push(Date.now());
      if (c.down) {
        if (at.probe) {
          if (++probes > (c.up_after_probes ?? 0)) up = true;
        } else if (probes > 0 && !up) {
          held++;
        }
        return play(up ? c.up! : c.down, at);
      }
      const k = n++;
      if (k >= (c.attempts ?? []).length) throw new Error(`attempt ${k + 1}: the script has ${(c.attempts ?? []).length}`);
      return play(c.attempts![k]!, at);
    }));
  } catch (e) {
    err = e;
    trail = (e as { trail?: Step[] }).trail ?? [];
  }
  const e = c.expect;
  const decided = trail.filter((s) => s.decision);
  const actions = decided.map((s) => s.decision!.action);
  const classes = decided.map((s) => s.decision!.class);
  if (e.actions) assert.deepEqual(actions, e.actions, `decisions (err ${String(err)})`);
  if (e.contains_action) assert.ok(actions.includes(e.contains_action as never), `decisions ${actions}, want one ${e.contains_action} (err ${String(err)})`);
  if (e.classes) assert.deepEqual(classes, e.classes, "classes");
  if (e.result !== undefined) {
    assert.equal(err, undefined, `call threw ${String(err)}`);
    assert.equal(res, e.result);
  }
  if (e.error_action) {
    assert.ok(err instanceof DecisionError, `err ${String(err)}, want a DecisionError`);
    assert.equal(err.action, e.error_action);
    assert.equal(err.decision.class, e.error_class);
    assert.ok(err.decision.rule, "the decision carries its rule");
    assert.ok(err.decision.reason, "the decision carries its reason");
  }
  if (e.transport_error_contains) {
    assert.ok(trail[0]?.outcome.transport_error?.includes(e.transport_error_contains),
      `first outcome's transport error ${trail[0]?.outcome.transport_error}, want it to say ${e.transport_error_contains}`);
  }
  if (e.chunks) assert.deepEqual(chunks, e.chunks, "chunks, tagged by attempt");
  if (e.restarts) {
    assert.deepEqual(restarts.map(({ attempt, previous, partial }) => ({ attempt, previous, partial })), e.restarts, "restarts");
    for (const rs of restarts) assert.ok(rs.reason, "a restart says why");
  }
  if (e.started) assert.equal(await stored("FAILBUS_RETRIES", Subject.retryStarted(agent.name)), e.started, "started records");
  if (e.after_due) {
    trail.forEach((s, i) => {
      if (s.decision?.action === "retry" && i + 1 < times.length) {
        assert.ok(times[i + 1]! >= s.decision.due_at!.getTime(), `attempt ${i + 2} came ${s.decision.due_at!.getTime() - times[i + 1]!} ms before its retry was due`);
      }
    });
  }
  assert.ok(probes >= (e.min_probes ?? 0), `${probes} probes answered, want at least ${e.min_probes}`);
  if (e.calls_while_held !== undefined) assert.equal(held, e.calls_while_held, "calls that reached the provider while held");
  if (e.targets) assert.deepEqual(targets, e.targets, "where the attempts went");
}

describe("call: the shared scenarios", () => {
  file.scenarios.forEach((sc, i) => {
    test(sc.name, async () => {
      const { agent, errors } = newAgent(`ts-scenario-${i}`);
      for (const c of sc.calls) await runScenarioCall(agent, c);
      assert.deepEqual(errors.map(String), [], "agent errors");
    });
  });
});

describe("call", () => {
  test("a failure the bus never decides ends in NoDecisionError, in time, naming the scheduler", async () => {
    // The bus refuses an outcome whose model looks like a credential (it
    // dead-letters it): no decision ever comes, as when no scheduler runs.
    const { agent } = newAgent("ts-undecided");
    const started = Date.now();
    await assert.rejects(
      call(agent, { provider: "openai", model: "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD", decisionTimeoutMs: 500 },
        async () => { throw new HTTPError(503); }),
      (err) => err instanceof NoDecisionError && /scheduler/.test(err.message) && err.trail.length === 0,
    );
    assert.ok(Date.now() - started < 10_000, "the wait is bounded");
  });

  test("a call cancelled while it waits for a retry cancels the retry: a cancel record, no started record", async () => {
    const { agent } = newAgent("ts-quitter");
    const ac = new AbortController();
    const reason = new Error("the user left");
    const req: CallRequest = {
      provider: "openai", turn: 1, step: 1, signal: ac.signal,
      // The retry is decided; the caller leaves before it comes due.
      onStep: (s) => s.decision?.action === "retry" && ac.abort(reason),
    };
    await assert.rejects(call(agent, req, async () => {
      throw new HTTPError(429, "", { "retry-after": "2" });
    }), (err) => err === reason);
    await until("the cancel record", async () => ((await stored("FAILBUS_RETRIES", Subject.retryCancel(agent.name))) === 1 ? true : undefined), 10_000);
    assert.equal(await stored("FAILBUS_RETRIES", Subject.retryStarted(agent.name)), 0, "no started record");
  });

  test("a segment's call started during an outage holds until the provider recovered, where the route skips it", async () => {
    // One agent's call finds the provider down and holds on wait_provider,
    // answering the bus's probes; then another agent starts a call for a
    // segment: the route skips the provider for the outage, and the call
    // holds too (Go's Call returns ErrNoProvider here) and resumes after.
    const provider = "ts-route-down";
    let up = false;
    let probes = 0;
    const first = newAgent("ts-route-first");
    let told!: () => void;
    const waiting = new Promise<void>((r) => (told = r));
    const held = call(first.agent, {
      provider, turn: 1, step: 1, resumeWindowMs: 100, signal: AbortSignal.timeout(60_000),
      onStep: (s) => s.decision?.action === "wait_provider" && told(),
    }, async (at) => {
      if (at.probe && ++probes > 2) up = true;
      if (up) return "back";
      throw new Error("dial tcp 10.0.0.1:443: connect: connection refused");
    });
    await waiting;
    const second = newAgent("ts-route-second");
    const skip = await until("the route to skip the provider for its outage", async () => {
      const a = await second.agent.route("s-route", 1, [provider]);
      return a.allowed.length === 0 ? a.skipped[0] : undefined;
    }, 10_000);
    assert.ok(!skip.next_probe_at && !skip.frozen, `an outage skip, not a refusal: ${JSON.stringify(skip)}`);
    let early = 0;
    const { value, trail } = await call(second.agent, {
      provider, providers: [provider], session: "s-route", segment: 1, turn: 1, step: 1, resumeWindowMs: 100, signal: AbortSignal.timeout(60_000),
    }, async () => {
      if (!up) early++;
      return "back";
    });
    assert.equal(value, "back");
    assert.equal(early, 0, "attempts of the second call before the provider was back");
    assert.equal(trail.length, 1);
    assert.equal((await held).value, "back");
    assert.ok(probes > 2);
    assert.deepEqual([...first.errors, ...second.errors].map(String), []);
  });

  test("wrap's outcome is an attempt's evidence: a 503 is decided, the answer after it returned", async () => {
    const srv = await serve((n, res) => {
      if (n === 1) {
        res.writeHead(503, { "content-type": "application/json" }).end(`{"error":{"message":"upstream busy","type":"server_error"}}`);
      } else {
        res.writeHead(200, { "content-type": "application/json" }).end(`{"choices":[{"message":{"content":"hi"},"finish_reason":"stop"}]}`);
      }
    });
    try {
      const { agent } = newAgent("ts-wrapped");
      const { value, trail } = await call(agent, { provider: "wrapped", turn: 1, step: 1 }, async (at) => {
        const w = await wrap(() => fetch(srv.url, { method: "POST", signal: at.signal }), { provider: at.provider });
        at.observe(w.outcome);
        return w.text;
      });
      assert.match(value ?? "", /"hi"/);
      assert.equal(trail.length, 2);
      assert.equal(trail[0]!.outcome.status, 503);
      assert.match(trail[0]!.outcome.body ?? "", /upstream busy/);
      assert.equal(trail[0]!.decision?.action, "retry");
      assert.equal(trail[0]!.decision?.class, "server_error");
      assert.ok(trail[1]!.outcome.ok && !trail[1]!.decision);
    } finally {
      srv.close();
    }
  });
});

describe("evidence of the openai SDK", () => {
  test("an APIError is its status, the body as sent, the headers and the code; retries off, one request", async () => {
    const body = `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`;
    const srv = await serve((_, res) => res.writeHead(429, { "content-type": "application/json", "retry-after": "7" }).end(body));
    try {
      const client = new OpenAI({ baseURL: srv.url, apiKey: "sk-test", maxRetries: 0 });
      const err = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }] }).then(() => undefined, (e: unknown) => e);
      const ev = sdkErrorEvidence(err);
      assert.equal(ev?.status, 429);
      assert.equal(ev?.headers?.["retry-after"], "7");
      assert.equal(ev?.upstream_code, "rate_limit_exceeded");
      assert.deepEqual(JSON.parse(ev?.body ?? ""), JSON.parse(body));
      assert.equal(srv.requests(), 1);
      assert.equal(sdkErrorEvidence(new Error("plain")), undefined, "an error that is no APIError");
    } finally {
      srv.close();
    }
  });

  test("a refused connection is a transport error with its cause's code; a content_filter finish is a refusal", async () => {
    const closed = await serve(() => {});
    closed.close(); // nothing listens on its port now
    const client = new OpenAI({ baseURL: closed.url, apiKey: "sk-test", maxRetries: 0 });
    const err = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }] }).then(() => undefined, (e: unknown) => e);
    const ev = evidenceOf(err);
    assert.equal(ev.status, undefined);
    assert.match(ev.transport_error ?? "", /ECONNREFUSED/);
    assert.deepEqual(completionEvidence({ choices: [{ finish_reason: "content_filter" }] }, "increment"),
      { status: 200, stop_reason: "content_filter", refusal_scope: "increment" });
    assert.deepEqual(completionEvidence({ choices: [{ finish_reason: "stop" }], usage: { prompt_tokens: 12 } }),
      { ok: true, status: 200, request_tokens: 12 });
  });
});

/** serve answers each request with answer(n, res), n from 1. */
async function serve(answer: (n: number, res: import("node:http").ServerResponse) => void):
  Promise<{ url: string; requests: () => number; close: () => void }> {
  let n = 0;
  const s: Server = createServer((req, res) => {
    req.resume();
    req.on("end", () => answer(++n, res));
  });
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const { port } = s.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}/v1`, requests: () => n, close: () => s.close() };
}
