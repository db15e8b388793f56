// wrap and wrapStream against a real HTTP server (node:http) and real
// fetch: what the call gave reaches the Outcome unchanged.

import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { after, before, describe, test } from "node:test";

import { InvariantError, grammars, wrap, wrapStream, type SSEEvent } from "../src/index.js";

type Handler = (req: IncomingMessage, res: ServerResponse) => void;
const routes = new Map<string, Handler>();
let server: Server;
let base = "";

before(async () => {
  server = createServer((req, res) => {
    const h = routes.get(req.url ?? "");
    if (!h) {
      res.writeHead(404).end();
      return;
    }
    h(req, res);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  base = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
});
after(() => new Promise<void>((r) => server.close(() => r())));

const ctx = { provider: "anthropic", model: "claude-x", session: "s", segment: 1, turn: 2, step: 1 };

const sseBody = (events: [string, unknown][]) =>
  events.map(([ev, data]) => `event: ${ev}\ndata: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`).join("");

describe("wrap", () => {
  test("a 429 keeps status, every header lower-cased and the body exactly", async () => {
    const body = `{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}`;
    routes.set("/429", (_q, res) => {
      res.writeHead(429, { "Retry-After": "7", "X-Should-Retry": "true", "Set-Cookie": "session=secret", "Content-Type": "application/json" });
      res.end(body);
    });
    const w = await wrap(() => fetch(base + "/429", { method: "POST" }), ctx);
    assert.equal(w.outcome.ok, false);
    assert.equal(w.outcome.status, 429);
    assert.equal(w.outcome.body, body);
    assert.equal(w.outcome.headers?.["retry-after"], "7");
    assert.equal(w.outcome.headers?.["x-should-retry"], "true");
    assert.equal(w.outcome.headers?.["set-cookie"], undefined, "credentials are not evidence");
    assert.equal(w.outcome.transport_error, undefined);
    assert.equal(w.outcome.provider, "anthropic");
    assert.equal(w.outcome.turn, 2);
    assert.ok(w.outcome.at instanceof Date);
  });

  test("a 200 with an answer is ok; empty or a refusal stop reason is not", async () => {
    routes.set("/ok", (_q, res) => res.writeHead(200).end(`{"content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn"}`));
    routes.set("/empty", (_q, res) => res.writeHead(200).end(""));
    routes.set("/refused", (_q, res) => res.writeHead(200).end(`{"choices":[{"finish_reason":"content_filter","message":{"content":null}}]}`));
    const ok = await wrap(() => fetch(base + "/ok"), ctx);
    assert.equal(ok.outcome.ok, true);
    assert.equal(ok.outcome.stop_reason, undefined);
    const empty = await wrap(() => fetch(base + "/empty"), ctx);
    assert.equal(empty.outcome.ok, false);
    assert.equal(empty.outcome.status, 200);
    assert.equal(empty.outcome.body, "");
    const refused = await wrap(() => fetch(base + "/refused"), ctx);
    assert.equal(refused.outcome.ok, false);
    assert.equal(refused.outcome.stop_reason, "content_filter");
  });

  test("a thrown network error is status 0 with its cause's code", async () => {
    const closed = await new Promise<number>((r) => {
      const s = createServer();
      s.listen(0, "127.0.0.1", () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => r(p));
      });
    });
    const w = await wrap(() => fetch(`http://127.0.0.1:${closed}/`), ctx);
    assert.equal(w.outcome.ok, false);
    assert.equal(w.outcome.status, 0);
    assert.match(w.outcome.transport_error!, /fetch failed/);
    assert.match(w.outcome.transport_error!, /ECONNREFUSED/);
    assert.ok(w.error instanceof Error);
  });

  test("a body cut mid-way keeps what arrived and says so", async () => {
    routes.set("/cut", (_q, res) => {
      res.writeHead(200, { "Content-Length": "1000" });
      res.write(`{"partial":`);
      setTimeout(() => res.socket?.destroy(), 20);
    });
    const w = await wrap(() => fetch(base + "/cut"), ctx);
    assert.equal(w.outcome.ok, false);
    assert.equal(w.outcome.status, 200);
    assert.equal(w.outcome.body, `{"partial":`);
    assert.match(w.outcome.transport_error!, /response body cut after 11 bytes/);
  });
});

const anthropicOK: [string, unknown][] = [
  ["message_start", { type: "message_start", message: { usage: { input_tokens: 10 } } }],
  ["content_block_start", { index: 0, content_block: { type: "text", text: "" } }],
  ["ping", { type: "ping" }],
  ["content_block_delta", { index: 0, delta: { type: "text_delta", text: "Hel" } }],
  ["content_block_delta", { index: 0, delta: { type: "text_delta", text: "lo" } }],
  ["content_block_stop", { index: 0 }],
  ["message_delta", { delta: { stop_reason: "end_turn" }, usage: { output_tokens: 2 } }],
  ["message_stop", { type: "message_stop" }],
];

describe("wrapStream", () => {
  test("an Anthropic stream that keeps the grammar is ok and every event reaches the consumer", async () => {
    routes.set("/sse-ok", (_q, res) => res.writeHead(200, { "Content-Type": "text/event-stream" }).end(sseBody(anthropicOK)));
    const s = wrapStream<SSEEvent>(() => fetch(base + "/sse-ok"), ctx, { grammar: grammars.anthropic, stopReason: grammars.anthropicStopReason });
    const seen: string[] = [];
    for await (const e of s) seen.push(e.event);
    assert.deepEqual(seen, anthropicOK.map(([e]) => e));
    const o = await s.outcome();
    assert.equal(o.ok, true);
    assert.equal(o.status, 200);
    assert.equal(o.body, undefined, "an ok stream's body is not kept");
  });

  test("a delta into a closed block fails fast with the rule, and the outcome carries it", async () => {
    const broken = [...anthropicOK];
    broken.splice(6, 0, ["content_block_delta", { index: 0, delta: { type: "text_delta", text: "late" } }]);
    routes.set("/sse-broken", (_q, res) => res.writeHead(200, { "Content-Type": "text/event-stream", "Request-Id": "req_9" }).end(sseBody(broken)));
    const s = wrapStream<SSEEvent>(() => fetch(base + "/sse-broken"), ctx, { grammar: grammars.anthropic });
    const seen: string[] = [];
    await assert.rejects(async () => {
      for await (const e of s) seen.push(e.event);
    }, (err) => err instanceof InvariantError && err.rule === "delta_in_open_block" && err.at === 6);
    assert.equal(seen.length, 6, "the offending event never reaches the consumer");
    const o = await s.outcome();
    assert.equal(o.ok, false);
    assert.equal(o.status, 200);
    assert.equal(o.upstream_code, "INVARIANT");
    assert.match(o.transport_error!, /delta_in_open_block at event 6/);
    assert.equal(o.headers?.["request-id"], "req_9");
    assert.match(o.body!, /"late"/, "what arrived is kept as evidence");
  });

  test("an OpenAI stream: blocks from deltas, usage after finish_reason, finish at [DONE]", async () => {
    const chunk = (delta: object, finish: string | null = null, usage?: object) =>
      ["message", { choices: usage ? [] : [{ index: 0, delta, finish_reason: finish }], ...(usage ? { usage } : {}) }] as [string, unknown];
    const ok = [chunk({ role: "assistant", content: "" }), chunk({ content: "Hi" }), chunk({ tool_calls: [{ index: 0, function: { name: "f" } }] }),
      chunk({}, "tool_calls"), chunk({}, null, { prompt_tokens: 3 }), ["message", "[DONE]"] as [string, unknown]];
    routes.set("/openai-ok", (_q, res) => res.writeHead(200).end(ok.map(([, d]) => `data: ${typeof d === "string" ? d : JSON.stringify(d)}\n\n`).join("")));
    const s = wrapStream<SSEEvent>(() => fetch(base + "/openai-ok"), { ...ctx, provider: "openai" }, { grammar: grammars.openai(), stopReason: grammars.openaiStopReason });
    let n = 0;
    for await (const _ of s) n++;
    assert.equal(n, ok.length);
    assert.equal((await s.outcome()).ok, true);

    // Cut before [DONE]: the stream did not finish.
    routes.set("/openai-unfinished", (_q, res) => res.writeHead(200).end(ok.slice(0, 4).map(([, d]) => `data: ${JSON.stringify(d)}\n\n`).join("")));
    const u = wrapStream<SSEEvent>(() => fetch(base + "/openai-unfinished"), { ...ctx, provider: "openai" }, { grammar: grammars.openai() });
    await assert.rejects(async () => {
      for await (const _ of u) void _;
    }, (err) => err instanceof InvariantError && err.rule === "finish_exactly_once");
    assert.equal((await u.outcome()).upstream_code, "INVARIANT");
  });

  test("a refusal mid-stream is not ok and names the stop reason", async () => {
    const refused = anthropicOK.map(([e, d]) => (e === "message_delta" ? [e, { delta: { stop_reason: "refusal" }, usage: { output_tokens: 1 } }] : [e, d])) as [string, unknown][];
    routes.set("/sse-refusal", (_q, res) => res.writeHead(200).end(sseBody(refused)));
    const s = wrapStream<SSEEvent>(() => fetch(base + "/sse-refusal"), ctx, { grammar: grammars.anthropic, stopReason: grammars.anthropicStopReason });
    for await (const _ of s) void _;
    const o = await s.outcome();
    assert.equal(o.ok, false);
    assert.equal(o.stop_reason, "refusal");
  });

  test("a stream cut by the network is a transport error with the text received", async () => {
    routes.set("/sse-cut", (_q, res) => {
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      res.write(sseBody(anthropicOK.slice(0, 3)));
      setTimeout(() => res.socket?.destroy(), 20);
    });
    const s = wrapStream<SSEEvent>(() => fetch(base + "/sse-cut"), ctx, { grammar: grammars.anthropic });
    const seen: string[] = [];
    await assert.rejects(async () => {
      for await (const e of s) seen.push(e.event);
    }, (err) => !(err instanceof InvariantError));
    assert.deepEqual(seen, ["message_start", "content_block_start", "ping"]);
    const o = await s.outcome();
    assert.equal(o.ok, false);
    assert.equal(o.upstream_code, undefined);
    assert.match(o.transport_error!, /stream cut short after \d+ bytes: .*terminated/);
    assert.match(o.body!, /content_block_start/);
  });

  test("an error status is not a stream: its body is the evidence", async () => {
    routes.set("/sse-529", (_q, res) => res.writeHead(529).end(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`));
    const s = wrapStream<SSEEvent>(() => fetch(base + "/sse-529"), ctx, { grammar: grammars.anthropic });
    let n = 0;
    for await (const _ of s) n++;
    assert.equal(n, 0);
    const o = await s.outcome();
    assert.equal(o.status, 529);
    assert.match(o.body!, /overloaded_error/);
  });
});
