// The drill, small (6 agents × 5 tasks × 4 calls, the sample timeline at
// scale 0.01: three seconds), the `call` strategy only: its promises are
// asserted. No deadline is one: a machine busy with other tests slows the
// fleet, and the run waits up to two minutes for the last task (it ends
// when every task has). `npm run drill` prints the baselines beside it.

import assert from "node:assert/strict";
import { test } from "node:test";

import { defaults, drill, table } from "./drill.js";

test("the fleet under call loses no task, holds off a provider in its outage and never re-sends a refused segment", async (t) => {
  const lines: string[] = [];
  const r = await drill({ ...defaults(), strategies: ["call"], graceMs: 120_000, progress: (l) => lines.push(l) });
  // One diagnostic a line: `go test -v ./test -run TestTypeScriptClient` shows them.
  for (const l of [...lines, ...table(r).split("\n")]) t.diagnostic(l);
  const row = r.rows.find((x) => x.strategy === "call");
  assert.ok(row?.call, "a call row");
  // The timeline did to this fleet what the promises are about. Its
  // outage lasts under a second at this scale: a fleet that a busy machine
  // slows may see too few failures in it for the bus to declare it; then
  // the hold is not exercised, and the diagnostic says so.
  if (row.call.outage_declared_ms !== null) {
    assert.ok((row.call.decisions.wait_provider ?? 0) > 0, "calls were told to wait for the provider");
    assert.ok(row.probes > 0, "the bus probed the provider through the fleet");
  } else {
    t.diagnostic("the bus did not declare the outage in this run: holding through it was not exercised");
  }
  assert.ok((row.call.decisions.rerender ?? 0) + (row.call.decisions.skip_provider ?? 0) > 0, "segments were refused");
  // The promises.
  assert.equal(row.lost, 0, `tasks lost under call: ${JSON.stringify(row.lost_by)}`);
  assert.equal(row.completed, row.tasks);
  assert.equal(row.call.calls_while_held, 0, "calls to the provider, other than probes, while the fleet held on it");
  assert.equal(row.wasted.refused_resent, 0, "refused segments re-sent to the provider that refused them");
});
