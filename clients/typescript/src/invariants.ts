// validateStream: seven grammar rules wrapped around a
// provider's event stream, before any consumer sees an event. The same rules
// and fixtures (testdata/invariants) as Go's pkg/invariant.
//
//  1. usage_at_most_once — usage is reported at most once.
//  2. usage_before_finish — usage comes before finish.
//  3. nothing_after_finish — no event after finish.
//  4. block_paired — block start and end are paired per index: started
//     before it ends, not started again while open, closed before finish.
//  5. delta_in_open_block — a delta goes into an open block.
//  6. block_end_type — a block end that names its type names its start's.
//  7. finish_exactly_once — finish comes exactly once.
//
// When one event breaks several rules the most specific is named: after
// finish a usage is usage_before_finish, a second finish
// finish_exactly_once, anything else nothing_after_finish. A stream that
// throws (the network cut it) is not a grammar violation: the error passes
// through as it is.

import type { Outcome } from "./wire.js";

/** The rule ids, in the seed's order. Public: never renamed. */
export const Rules = [
  "usage_at_most_once",
  "usage_before_finish",
  "nothing_after_finish",
  "block_paired",
  "delta_in_open_block",
  "block_end_type",
  "finish_exactly_once",
] as const;
export type Rule = (typeof Rules)[number];

/** A grammar event. A provider's events are mapped onto these by a grammar function. */
export type StreamEvent =
  | { type: "block_start"; index?: number; block?: string }
  | { type: "delta"; index?: number }
  | { type: "block_end"; index?: number; block?: string }
  | { type: "usage" }
  | { type: "finish" };

/** The upstream_code a violation's outcome carries (INVARIANT, the code a stream validator throws). */
export const INVARIANT_CODE = "INVARIANT";

/** InvariantError is the first broken rule of a stream. */
export class InvariantError extends Error {
  constructor(
    /** The broken rule's id. */
    readonly rule: Rule,
    /** 0-based position of the offending event in the provider's stream; the event count at the end of the stream. */
    readonly at: number,
    /** What happened, in words. */
    readonly detail: string,
    /** The offending provider event; undefined at the end of the stream. */
    readonly event?: unknown,
  ) {
    super(`stream invariant violated: ${rule} at event ${at}: ${detail}`);
    this.name = "InvariantError";
  }

  /**
   * toOutcome reports the call whose stream broke the grammar: base (its id,
   * provider, model, status, headers, body) with ok false, the violation as
   * transport_error and upstream_code INVARIANT. The classifier files it as
   * `invariant` (rule stream.invariant).
   */
  toOutcome<O extends Partial<Outcome>>(base: O): O & { ok: false; transport_error: string; upstream_code: string } {
    return { ...base, ok: false, transport_error: this.message, upstream_code: INVARIANT_CODE };
  }
}

/**
 * StreamValidator checks one stream event by event. After the first
 * violation every call throws it again.
 */
export class StreamValidator {
  private n = 0;
  private usage = false;
  private finished = false;
  private readonly open = new Map<number, string>();
  private err?: InvariantError;

  /** skip counts an event that is not part of the grammar, so positions match the provider's stream. */
  skip(): void {
    this.n++;
  }

  /** check checks the next grammar event; it throws an InvariantError at the first broken rule. `raw` is the provider's event, kept on the error. */
  check(e: StreamEvent, raw: unknown = e): void {
    if (this.err) throw this.err;
    const at = this.n++;
    const fail = (rule: Rule, detail: string): never => {
      this.err = new InvariantError(rule, at, detail, raw);
      throw this.err;
    };
    const index = "index" in e ? (e.index ?? 0) : 0;
    if (this.finished) {
      if (e.type === "usage") fail("usage_before_finish", "usage after finish");
      if (e.type === "finish") fail("finish_exactly_once", "a second finish");
      fail("nothing_after_finish", `${describe(e)} after finish`);
    }
    switch (e.type) {
      case "usage":
        if (this.usage) fail("usage_at_most_once", "a second usage");
        this.usage = true;
        break;
      case "block_start":
        if (this.open.has(index)) fail("block_paired", `block ${index} started again while open (${this.open.get(index)})`);
        this.open.set(index, e.block ?? "");
        break;
      case "delta":
        if (!this.open.has(index)) fail("delta_in_open_block", `delta into block ${index}, which is not open`);
        break;
      case "block_end": {
        const t = this.open.get(index);
        if (t === undefined) fail("block_paired", `end of block ${index}, which is not open`);
        if (e.block && e.block !== t) fail("block_end_type", `block ${index} started as ${t} ends as ${e.block}`);
        this.open.delete(index);
        break;
      }
      case "finish":
        if (this.open.size > 0) {
          const blocks = [...this.open.keys()].sort((a, b) => a - b).map((i) => `block ${i} (${this.open.get(i)})`);
          fail("block_paired", `finish while ${blocks.join(", ")} ${blocks.length === 1 ? "is" : "are"} open`);
        }
        this.finished = true;
        break;
    }
  }

  /** end checks the end of the stream: it must have finished. */
  end(): void {
    if (this.err) throw this.err;
    if (!this.finished) {
      this.err = new InvariantError("finish_exactly_once", this.n, `the stream ended after ${this.n} events without finish`);
      throw this.err;
    }
  }

  /** The first violation so far. */
  get violation(): InvariantError | undefined {
    return this.err;
  }
}

function describe(e: StreamEvent): string {
  return e.type === "block_start" || e.type === "block_end" || e.type === "delta" ? `${e.type} of block ${e.index ?? 0}` : e.type;
}

/**
 * validateStream wraps a provider's event stream: each event is mapped onto
 * the grammar (undefined: not a grammar event, passed on unchecked), checked,
 * and only then passed on. At the first violation it throws an
 * InvariantError instead of yielding the offending event; a stream that ends
 * without finish throws at its end. An error of the source passes through.
 * Without a grammar function the events must be grammar events themselves.
 */
export async function* validateStream<E>(
  source: AsyncIterable<E> | Iterable<E>,
  grammar: (e: E) => StreamEvent | undefined = (e) => e as unknown as StreamEvent,
): AsyncGenerator<E, void, undefined> {
  const v = new StreamValidator();
  for await (const e of source) {
    const g = grammar(e);
    if (g === undefined) v.skip();
    else v.check(g, e);
    yield e;
  }
  v.end();
}
