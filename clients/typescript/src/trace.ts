// W3C trace context in failbus message headers: the same `traceparent`
// and `tracestate` headers the Go services and pkg/agent carry from an
// agent's outcome through its classification, decision, due retry and
// dispatch, so one LLM call is one trace (docs/OPERATORS.md "Follow one
// call: its trace"). A small helper with no tracing SDK behind it: an
// agent that runs OpenTelemetry passes its span's ids; one that does not
// can still start a trace here and continue the bus's.

import type { MsgHdrs } from "@nats-io/nats-core";

/** Header names, as failbus writes them (lower case, per W3C). */
export const HEADER_TRACEPARENT = "traceparent";
export const HEADER_TRACESTATE = "tracestate";

/** One span's position in a trace: what a traceparent header carries. */
export interface TraceContext {
  /** 32 lower-case hex digits, not all zero. */
  traceId: string;
  /** 16 lower-case hex digits, not all zero: the parent of what follows. */
  spanId: string;
  /** Whether the trace is being recorded (trace-flags bit 0). */
  sampled: boolean;
  /** The tracestate header, passed on untouched. */
  traceState?: string;
}

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-.*)?$/;

/**
 * Reads a traceparent header value; undefined when it is missing or
 * malformed (as the W3C recommendation says: then start a new trace).
 */
export function parseTraceparent(value: string | undefined, traceState?: string): TraceContext | undefined {
  const m = TRACEPARENT.exec((value ?? "").trim());
  if (!m) return undefined;
  const [, version, traceId, spanId, flags] = m;
  if (version === "ff" || (version === "00" && value!.trim().length !== 55)) return undefined;
  if (/^0+$/.test(traceId) || /^0+$/.test(spanId)) return undefined;
  const tc: TraceContext = { traceId, spanId, sampled: (parseInt(flags, 16) & 1) === 1 };
  if (traceState) tc.traceState = traceState;
  return tc;
}

/** Writes tc as a traceparent header value (version 00). */
export function formatTraceparent(tc: TraceContext): string {
  return `00-${tc.traceId}-${tc.spanId}-${tc.sampled ? "01" : "00"}`;
}

function randomHex(bytes: number): string {
  const b = new Uint8Array(bytes);
  do {
    globalThis.crypto.getRandomValues(b);
  } while (b.every((x) => x === 0));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** Starts a new trace (a root span id), sampled unless told otherwise. */
export function newTrace(sampled = true): TraceContext {
  return { traceId: randomHex(16), spanId: randomHex(8), sampled };
}

/**
 * A new span in tc's trace: what an agent puts on each outcome of one
 * call (every attempt is a child of the call's context), so the call's
 * records share one trace id.
 */
export function childSpan(tc: TraceContext): TraceContext {
  const out: TraceContext = { traceId: tc.traceId, spanId: randomHex(8), sampled: tc.sampled };
  if (tc.traceState) out.traceState = tc.traceState;
  return out;
}

/** Sets traceparent (and tracestate) on h. */
export function setTraceHeaders(h: MsgHdrs, tc: TraceContext): void {
  h.set(HEADER_TRACEPARENT, formatTraceparent(tc));
  if (tc.traceState) h.set(HEADER_TRACESTATE, tc.traceState);
}

/**
 * The trace context a message carries (a decision, a due retry, a
 * dispatch): continue the call's trace from it. Undefined when it has
 * none.
 */
export function traceFromHeaders(h: MsgHdrs | undefined): TraceContext | undefined {
  if (!h) return undefined;
  return parseTraceparent(h.get(HEADER_TRACEPARENT) || undefined, h.get(HEADER_TRACESTATE) || undefined);
}
