// The seven stream rules against the fixtures Go's pkg/invariant runs too
// (testdata/invariants at the repository root).

import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import { InvariantError, Rules, StreamValidator, validateStream, type StreamEvent } from "../src/index.js";
import { repoRoot } from "./dev.js";

interface Fixture {
  rule: string;
  cases: { name: string; violation_at?: number; events: StreamEvent[] }[];
}

const dir = join(repoRoot(), "testdata", "invariants");
const fixtures = new Map<string, Fixture>(
  readdirSync(dir)
    .filter((f) => f.endsWith(".json"))
    .map((f) => [f.replace(/\.json$/, ""), JSON.parse(readFileSync(join(dir, f), "utf8")) as Fixture]),
);

test("every rule has a fixture file with cases, and valid.json has streams", () => {
  for (const rule of Rules) {
    const f = fixtures.get(rule);
    assert.ok(f && f.rule === rule && f.cases.length > 0, `no fixture cases for ${rule}`);
  }
  assert.ok((fixtures.get("valid")?.cases.length ?? 0) > 0);
});

async function* provider<E>(events: E[]): AsyncGenerator<E> {
  for (const e of events) yield e;
}

for (const [file, f] of fixtures) {
  describe(file, () => {
    for (const c of f.cases) {
      test(c.name, async () => {
        assert.equal(f.rule === "", c.violation_at === undefined, "violation_at is named exactly when the file names a rule");
        // Event by event.
        const v = new StreamValidator();
        let got: unknown;
        try {
          for (const e of c.events) v.check(e);
          v.end();
        } catch (err) {
          got = err;
        }
        // Wrapped around a provider's stream: fail fast.
        const passed: StreamEvent[] = [];
        let streamErr: unknown;
        try {
          for await (const e of validateStream(provider(c.events))) passed.push(e);
        } catch (err) {
          streamErr = err;
        }
        if (f.rule === "") {
          assert.equal(got, undefined);
          assert.equal(streamErr, undefined);
          assert.equal(passed.length, c.events.length);
          return;
        }
        for (const err of [got, streamErr]) {
          assert.ok(err instanceof InvariantError, `want an InvariantError, got ${String(err)}`);
          assert.equal(err.rule, f.rule);
          assert.equal(err.at, c.violation_at);
          assert.match(err.message, new RegExp(`stream invariant violated: ${f.rule} at event ${c.violation_at}`));
        }
        assert.equal(passed.length, Math.min(c.violation_at!, c.events.length), "nothing from the offending event on reaches the consumer");
        const o = (streamErr as InvariantError).toOutcome({ provider: "p", status: 200, headers: { "request-id": "r1" } });
        assert.equal(o.ok, false);
        assert.equal(o.status, 200);
        assert.equal(o.upstream_code, "INVARIANT");
        assert.deepEqual(o.headers, { "request-id": "r1" });
        assert.match(o.transport_error, new RegExp(f.rule));
      });
    }
  });
}

test("a source that throws passes its error through, not as a violation", async () => {
  const cut = new Error("read ECONNRESET");
  async function* broken() {
    yield { type: "block_start", index: 0, block: "text" } as StreamEvent;
    throw cut;
  }
  await assert.rejects(async () => {
    for await (const _ of validateStream(broken())) void _;
  }, (err) => err === cut);
});

test("events outside the grammar pass unchecked and count for positions", async () => {
  const src = [{ kind: "ping" }, { kind: "delta" }];
  const passed: string[] = [];
  await assert.rejects(async () => {
    for await (const e of validateStream(provider(src), (e) => (e.kind === "ping" ? undefined : { type: "delta", index: 0 }))) {
      passed.push(e.kind);
    }
  }, (err) => err instanceof InvariantError && err.rule === "delta_in_open_block" && err.at === 1 && (err.event as { kind: string }).kind === "delta");
  assert.deepEqual(passed, ["ping"]);
});
