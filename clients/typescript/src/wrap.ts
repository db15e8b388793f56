// wrap: turn a fetch-style LLM call into an Outcome without losing evidence.
// The status, every response header (lower-case), the body exactly as
// received, the text of a thrown network error (with its cause's code), a
// stream cut short, a refusal stop reason and a broken stream grammar all
// end up in the record the classifier reads; nothing is interpreted here
// that the classifier can read from the evidence itself.

import { InvariantError, StreamValidator, type StreamEvent } from "./invariants.js";
import type { Outcome } from "./wire.js";

/** What wrap needs of a response: fetch's Response fits. */
export interface ResponseLike {
  status: number;
  headers: Headers | Record<string, string> | Iterable<[string, string]>;
  body?: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array> | null;
  text?(): Promise<string>;
}

/** The call's context: everything of the Outcome that wrap does not observe. provider is required. */
export type CallContext = Omit<Partial<Outcome>, "ok" | "status" | "body" | "headers" | "transport_error"> & {
  provider: string;
};

/** The outcome of a call, ready for Agent.report (it fills id and agent when absent). */
export type CallOutcome = CallContext & {
  ok: boolean;
  status: number;
  at: Date;
  body?: string;
  headers?: Record<string, string>;
  transport_error?: string;
};

/** What a non-streaming call gave. */
export interface Wrapped {
  outcome: CallOutcome;
  /** The response, when one arrived. */
  response?: ResponseLike;
  /** The body as text (complete unless the body stream broke). */
  text?: string;
  /** The thrown error: a network error, or the body stream breaking. */
  error?: unknown;
}

export interface WrapOptions {
  /** Response headers left out of the outcome (credentials). Default: set-cookie. */
  dropHeaders?: string[];
  /** The clock that stamps `at` when the call ends. Default: the system clock. */
  now?: () => Date;
}

/**
 * Stop reasons of a 200 that did not answer: the model or the provider's
 * filter refused (the classifier's stop.refusal rule reads the same words).
 */
export const REFUSAL_STOP_REASONS = [
  "refusal", "content_filter", "content_filtered", "safety", "recitation", "prohibited_content",
  "blocklist", "spii", "image_safety", "guardrail_intervened",
];

/**
 * wrap runs call (a fetch-style LLM call) and reports what happened as an
 * Outcome: a thrown error is status 0 with its text (and its cause's code,
 * e.g. "fetch failed: connect ECONNREFUSED 127.0.0.1:1 (ECONNREFUSED)") as
 * transport_error; a response keeps its status, headers and body exactly as
 * received; a 2xx is ok unless its body is empty or says a refusal stop
 * reason (stop_reason is then set). It never throws for the call's failure:
 * the error is in the result.
 */
export async function wrap(call: () => Promise<ResponseLike>, ctx: CallContext, opts: WrapOptions = {}): Promise<Wrapped> {
  const now = opts.now ?? (() => new Date());
  let res: ResponseLike;
  try {
    res = await call();
  } catch (error) {
    return { outcome: { ...ctx, ok: false, status: 0, transport_error: errorText(error), at: now() }, error };
  }
  const hdrs = headerRecord(res.headers, opts.dropHeaders);
  let text = "";
  let error: unknown;
  try {
    await readAll(res, (chunk) => {
      text += chunk;
    });
  } catch (err) {
    error = err; // text holds what arrived before the break
  }
  const outcome: CallOutcome = { ...ctx, ok: false, status: res.status, headers: hdrs, body: text, at: now() };
  if (error !== undefined) {
    outcome.transport_error = `response body cut after ${byteLength(text)} bytes: ${errorText(error)}`;
  } else if (res.status >= 200 && res.status < 300) {
    const stop = refusal(ctx.stop_reason) ?? refusalStopReason(text);
    outcome.ok = text.trim() !== "" && !stop;
    if (stop) outcome.stop_reason = stop;
  }
  // A stop reason is for a 2xx that did not answer (CONTRACT.md): an ok
  // call carries none, or the classifier would look for what went wrong.
  if (outcome.ok) delete outcome.stop_reason;
  return { outcome, response: res, text, ...(error !== undefined ? { error } : {}) };
}

/** One Server-Sent Event of a streaming response. */
export interface SSEEvent {
  /** The `event:` field, "message" when absent. */
  event: string;
  /** The `data:` lines, joined by "\n". */
  data: string;
  /** data parsed as JSON, when it is JSON. */
  json?: unknown;
}

export interface WrapStreamOptions<E> extends WrapOptions {
  /**
   * Parses the body into the provider's events. Default: Server-Sent Events
   * (SSEEvent), which is how the OpenAI, Anthropic and Gemini APIs stream.
   */
  parse?: (text: AsyncIterable<string>) => AsyncIterable<E>;
  /**
   * Maps a provider event onto the stream grammar: one event, several, or
   * undefined for an event outside it (a ping). Without it the provider's
   * events are not checked. See grammars.anthropic and grammars.openai.
   */
  grammar?: (e: E) => StreamEvent | StreamEvent[] | undefined;
  /** Reads a refusal stop reason from a provider event, if it carries one. */
  stopReason?: (e: E) => string | undefined;
  /** Keep at most this many bytes of a failed stream's body as evidence. Default 65536. */
  maxBodyBytes?: number;
}

/**
 * A streaming call in progress: iterate its events (checked against the
 * grammar before you see them), then report outcome(). Iteration throws the
 * call's error: the network error, the body stream breaking, or the first
 * InvariantError (fail fast: the offending event is never yielded).
 */
export interface WrappedStream<E> extends AsyncIterable<E> {
  /** The outcome; it resolves once the iteration has ended (completely, by an error, or by break). It never rejects. */
  outcome(): Promise<CallOutcome>;
  /** The response, once it arrived. */
  response?: ResponseLike;
}

/**
 * wrapStream runs a streaming call. Its outcome is ok when the response was
 * 2xx, the stream finished by its grammar (or simply ended, without a
 * grammar) and said no refusal; a violation is reported as its
 * InvariantError's outcome (class `invariant`); a stream cut short keeps
 * the text received as body and the error as transport_error.
 */
export function wrapStream<E = SSEEvent>(call: () => Promise<ResponseLike>, ctx: CallContext,
  opts: WrapStreamOptions<E> = {}): WrappedStream<E> {
  const now = opts.now ?? (() => new Date());
  const limit = opts.maxBodyBytes ?? 65536;
  const parse = opts.parse ?? (sse as unknown as (t: AsyncIterable<string>) => AsyncIterable<E>);
  let resolve!: (o: CallOutcome) => void;
  const done = new Promise<CallOutcome>((r) => (resolve = r));
  let started = false;
  const w: WrappedStream<E> = {
    outcome: () => done,
    async *[Symbol.asyncIterator]() {
      if (started) throw new Error("failbus wrapStream: a call's stream can be read once");
      started = true;
      let res: ResponseLike;
      try {
        res = await call();
      } catch (error) {
        resolve({ ...ctx, ok: false, status: 0, transport_error: errorText(error), at: now() });
        throw error;
      }
      w.response = res;
      const base = { ...ctx, status: res.status, headers: headerRecord(res.headers, opts.dropHeaders) };
      let body = "";
      const keep = (chunk: string) => {
        if (byteLength(body) < limit) body += chunk;
      };
      if (res.status < 200 || res.status >= 300) {
        // An error answer is not a stream: its body is the evidence.
        try {
          await readAll(res, keep);
          resolve({ ...base, ok: false, body, at: now() });
        } catch (error) {
          resolve({ ...base, ok: false, body, transport_error: `response body cut after ${byteLength(body)} bytes: ${errorText(error)}`, at: now() });
        }
        return;
      }
      const v = opts.grammar ? new StreamValidator() : undefined;
      let stop: string | undefined = refusal(ctx.stop_reason);
      let complete = false;
      try {
        for await (const e of parse(chunks(res, keep))) {
          if (v) {
            const g = opts.grammar!(e);
            if (g === undefined) v.skip();
            else for (const one of Array.isArray(g) ? g : [g]) v.check(one, e);
          }
          stop ??= refusal(opts.stopReason?.(e));
          yield e;
        }
        v?.end();
        complete = true;
      } catch (error) {
        if (error instanceof InvariantError) {
          resolve({ ...error.toOutcome(base), body: trim(body, limit), at: now() } as CallOutcome);
        } else {
          resolve({ ...base, ok: false, body: trim(body, limit), transport_error: `stream cut short after ${byteLength(body)} bytes: ${errorText(error)}`, at: now() });
        }
        throw error;
      } finally {
        if (!complete) {
          // The loop broke out early: the call did not fail, the reader left.
          resolve(settled(base, body, stop, limit, now()));
        }
      }
      resolve(settled(base, body, stop, limit, now()));
    },
  };
  return w;
}

/** settled is the outcome of a 2xx stream that ended without an error. */
function settled(base: CallContext & { status: number; headers: Record<string, string> }, body: string,
  stop: string | undefined, limit: number, at: Date): CallOutcome {
  const ok = body.trim() !== "" && !stop;
  const { stop_reason: _, ...rest } = base;
  return { ...rest, ok, ...(stop ? { stop_reason: stop } : {}), ...(ok ? {} : { body: trim(body, limit) }), at };
}

/** sse parses Server-Sent Events from text chunks (the WHATWG event-stream format). */
export async function* sse(text: AsyncIterable<string>): AsyncGenerator<SSEEvent> {
  let buf = "";
  let event = "";
  let data: string[] = [];
  const emit = (): SSEEvent | undefined => {
    if (data.length === 0) {
      event = "";
      return undefined;
    }
    const e: SSEEvent = { event: event || "message", data: data.join("\n") };
    try {
      e.json = JSON.parse(e.data);
    } catch {
      // not JSON ([DONE], plain text): data only
    }
    event = "";
    data = [];
    return e;
  };
  const line = (l: string): SSEEvent | undefined => {
    if (l === "") return emit();
    if (l.startsWith(":")) return undefined;
    const i = l.indexOf(":");
    const field = i < 0 ? l : l.slice(0, i);
    let value = i < 0 ? "" : l.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
    return undefined;
  };
  for await (const chunk of text) {
    buf += chunk;
    let nl: number;
    while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
      const l = buf.slice(0, nl);
      buf = buf.slice(buf[nl] === "\r" && buf[nl + 1] === "\n" ? nl + 2 : nl + 1);
      const e = line(l);
      if (e) yield e;
    }
  }
  if (buf !== "") line(buf);
  const e = emit();
  if (e) yield e;
}

type J = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

/** Grammar mappings for the common providers' streaming APIs. */
export const grammars = {
  /**
   * Anthropic Messages streaming: content_block_start/delta/stop per index,
   * message_delta carries the usage, message_stop finishes; message_start
   * and ping are outside the grammar. An `error` event is not mapped: the
   * stream then ends without finish.
   */
  anthropic(e: SSEEvent): StreamEvent | undefined {
    const d = (e.json ?? {}) as J;
    switch (e.event) {
      case "content_block_start":
        return { type: "block_start", index: d.index ?? 0, block: d.content_block?.type };
      case "content_block_delta":
        return { type: "delta", index: d.index ?? 0 };
      case "content_block_stop":
        return { type: "block_end", index: d.index ?? 0 };
      case "message_delta":
        return d.usage ? { type: "usage" } : undefined;
      case "message_stop":
        return { type: "finish" };
    }
    return undefined;
  },
  /** The stop reason of an Anthropic message_delta. */
  anthropicStopReason(e: SSEEvent): string | undefined {
    return e.event === "message_delta" ? ((e.json as J)?.delta?.stop_reason ?? undefined) : undefined;
  },
  /**
   * OpenAI Chat Completions streaming: deltas carry no block boundaries, so
   * the mapping opens a text block (index 0) or a tool-call block (index
   * 1 + the call's index) at its first delta, closes them all at the
   * choice's finish_reason, counts the usage chunk, and finishes at [DONE].
   * Returns a fresh, stateful mapping for one stream.
   */
  openai(): (e: SSEEvent) => StreamEvent[] | undefined {
    const open = new Set<number>();
    return (e) => {
      if (e.data === "[DONE]") return [{ type: "finish" }];
      const d = e.json as J | undefined;
      if (!d) return undefined;
      const out: StreamEvent[] = [];
      const choice = d.choices?.[0];
      const delta = choice?.delta ?? {};
      const into = (index: number, block: string) => {
        if (!open.has(index)) {
          open.add(index);
          out.push({ type: "block_start", index, block });
        }
        out.push({ type: "delta", index });
      };
      if (typeof delta.content === "string" && delta.content !== "") into(0, "text");
      for (const tc of delta.tool_calls ?? []) into(1 + (tc.index ?? 0), "tool_call");
      if (choice?.finish_reason) {
        for (const i of [...open].sort((a, b) => a - b)) out.push({ type: "block_end", index: i });
        open.clear();
      }
      if (d.usage) out.push({ type: "usage" });
      return out.length ? out : undefined;
    };
  },
  /** The finish reason of an OpenAI chunk. */
  openaiStopReason(e: SSEEvent): string | undefined {
    return (e.json as J | undefined)?.choices?.[0]?.finish_reason ?? undefined;
  },
};

/** errorText is an error's text with its causes' messages and codes: the evidence a classifier reads. */
export function errorText(err: unknown): string {
  const parts: string[] = [];
  let e: unknown = err;
  for (let depth = 0; e !== undefined && e !== null && depth < 5; depth++) {
    if (e instanceof Error) {
      const code = (e as Error & { code?: unknown }).code;
      let p = e.message || e.name;
      if (e.name && e.name !== "Error" && !p.includes(e.name)) p = `${e.name}: ${p}`;
      if (typeof code === "string" && !p.includes(code)) p += ` (${code})`;
      if (!parts.includes(p)) parts.push(p);
      e = (e as Error & { cause?: unknown }).cause;
    } else {
      parts.push(String(e));
      break;
    }
  }
  return parts.join(": ") || "unknown error";
}

function refusal(reason: string | undefined): string | undefined {
  return reason && REFUSAL_STOP_REASONS.includes(reason.toLowerCase()) ? reason : undefined;
}

/** refusalStopReason reads a refusal stop reason from a JSON body (Anthropic stop_reason, OpenAI finish_reason, Gemini finishReason). */
export function refusalStopReason(body: string): string | undefined {
  let d: J;
  try {
    d = JSON.parse(body);
  } catch {
    return undefined;
  }
  if (!d || typeof d !== "object") return undefined;
  const found = [d.stop_reason, ...(d.choices ?? []).map((c: J) => c?.finish_reason), ...(d.candidates ?? []).map((c: J) => c?.finishReason)];
  for (const r of found) {
    if (typeof r === "string" && refusal(r)) return r;
  }
  return undefined;
}

function headerRecord(h: ResponseLike["headers"], drop: string[] = ["set-cookie"]): Record<string, string> {
  const out: Record<string, string> = {};
  const skip = new Set(drop.map((d) => d.toLowerCase()));
  const entries: Iterable<[string, string]> =
    typeof (h as Headers).forEach === "function" && typeof (h as Headers).get === "function"
      ? (h as Headers).entries()
      : Symbol.iterator in Object(h)
        ? (h as Iterable<[string, string]>)
        : Object.entries(h as Record<string, string>);
  for (const [k, v] of entries) {
    const name = k.toLowerCase();
    if (skip.has(name)) continue;
    out[name] = name in out ? `${out[name]}, ${v}` : String(v);
  }
  return out;
}

async function* chunks(res: ResponseLike, keep: (s: string) => void): AsyncGenerator<string> {
  const dec = new TextDecoder();
  if (!res.body) {
    const t = res.text ? await res.text() : "";
    keep(t);
    if (t) yield t;
    return;
  }
  const body = res.body as ReadableStream<Uint8Array> & AsyncIterable<Uint8Array>;
  if (typeof body.getReader === "function") {
    const reader = body.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        const s = dec.decode(value, { stream: true });
        keep(s);
        yield s;
      }
    } finally {
      reader.releaseLock();
    }
  } else {
    for await (const b of body) {
      const s = dec.decode(b, { stream: true });
      keep(s);
      yield s;
    }
  }
  const rest = dec.decode();
  if (rest) {
    keep(rest);
    yield rest;
  }
}

async function readAll(res: ResponseLike, keep: (s: string) => void): Promise<void> {
  for await (const s of chunks(res, keep)) void s;
}

function byteLength(s: string): number {
  return Buffer.byteLength(s, "utf8");
}

function trim(s: string, limit: number): string {
  if (byteLength(s) <= limit) return s;
  return Buffer.from(s, "utf8").subarray(0, limit).toString("utf8");
}
