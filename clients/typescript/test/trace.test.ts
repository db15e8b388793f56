// The trace context helper: W3C traceparent read and written as the Go
// side (internal/tracing, OpenTelemetry's propagator) does.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { headers } from "@nats-io/nats-core";

import { childSpan, formatTraceparent, newTrace, parseTraceparent, setTraceHeaders, traceFromHeaders } from "../src/index.js";

// The W3C recommendation's own example.
const example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

describe("trace context", () => {
  test("reads and writes the W3C example", () => {
    const tc = parseTraceparent(example, "rojo=00f067aa0ba902b7");
    assert.deepEqual(tc, { traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", sampled: true, traceState: "rojo=00f067aa0ba902b7" });
    assert.equal(formatTraceparent(tc!), example);
  });

  test("refuses what a propagator must ignore", () => {
    for (const bad of [
      undefined, "", "garbage",
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero span id
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // upper case
      example + "-extra", // version 00 has no more fields
    ]) {
      assert.equal(parseTraceparent(bad), undefined, String(bad));
    }
    // A later version may add fields.
    assert.ok(parseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more"));
  });

  test("a child keeps the trace, a new trace is valid", () => {
    const root = newTrace();
    assert.ok(parseTraceparent(formatTraceparent(root)));
    const a = childSpan(root), b = childSpan(root);
    assert.equal(a.traceId, root.traceId);
    assert.notEqual(a.spanId, b.spanId);
    assert.notEqual(newTrace().traceId, root.traceId);
    assert.equal(formatTraceparent(newTrace(false)).slice(-2), "00");
  });

  test("headers round trip", () => {
    const h = headers();
    const tc = childSpan(newTrace());
    tc.traceState = "vendor=x";
    setTraceHeaders(h, tc);
    assert.equal(h.get("traceparent"), formatTraceparent(tc));
    assert.deepEqual(traceFromHeaders(h), tc);
    assert.equal(traceFromHeaders(headers()), undefined);
    assert.equal(traceFromHeaders(undefined), undefined);
  });
});
