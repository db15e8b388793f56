// Evidence: what happened on one attempt of an LLM call, as the bus wants
// it — the raw status, body, headers and transport error, not an
// interpretation (the classifier interprets). `call` builds each attempt's
// Outcome from it. The TypeScript twin of Go's pkg/agent/evidence.go, with
// the readers of the `openai` (and Anthropic) SDK errors built in: they are
// recognised by shape, so this package imports no SDK.

import { errorText, type ResponseLike } from "./wrap.js";
import type { Outcome } from "./wire.js";

/**
 * Evidence of one attempt. The field names are the Outcome's, so wrap's
 * `outcome` (a CallOutcome) is Evidence as it is: `attempt.observe(w.outcome)`.
 */
export type Evidence = Pick<Outcome,
  "ok" | "status" | "body" | "headers" | "transport_error" | "upstream_code" | "stop_reason" | "refusal_scope" | "request_tokens">;

/**
 * Describer turns an error a call function threw into Evidence; undefined
 * for an error it does not know (call then reads it itself).
 */
export type Describer = (err: unknown) => Evidence | undefined;

/** An error that carries its own Evidence (HTTPError does). */
export interface Evidencer {
  failbusEvidence(): Evidence;
}

/** The most of an error answer's body an adapter keeps: 64 KiB. */
export const MAX_EVIDENCE_BODY = 64 << 10;

/**
 * HTTPError is a non-2xx answer of a plain fetch call, as `call` wants it:
 * `throw await httpErrorFrom(res)` (or `new HTTPError(status, body,
 * headers)`) from the call function.
 */
export class HTTPError extends Error implements Evidencer {
  constructor(
    readonly status: number,
    readonly body = "",
    readonly headers: Record<string, string> = {},
  ) {
    super(`HTTP ${status}: ${body.length > 200 ? body.slice(0, 200) + "…" : body}`);
    this.name = "HTTPError";
  }

  failbusEvidence(): Evidence {
    return { status: this.status, body: this.body, ...(Object.keys(this.headers).length ? { headers: this.headers } : {}) };
  }
}

/**
 * httpErrorFrom reads a non-2xx response (its body up to 64 KiB) into an
 * HTTPError; a 2xx response gives undefined (the caller reads it).
 */
export async function httpErrorFrom(res: ResponseLike): Promise<HTTPError | undefined> {
  if (res.status >= 200 && res.status < 300) return undefined;
  let body = "";
  try {
    body = res.text ? await res.text() : "";
  } catch {
    // a body cut short: the status and headers are the evidence
  }
  return new HTTPError(res.status, body.slice(0, MAX_EVIDENCE_BODY), headerMap(res.headers));
}

/**
 * sdkErrorEvidence reads the errors of the `openai` npm SDK (and of
 * `@anthropic-ai/sdk`, built the same way): an APIError with a status is
 * that status, the error body as the provider sent it, the headers and the
 * error's code; a connection error (no status) is a transport error with
 * its causes ("Connection error.: fetch failed: … ECONNREFUSED"), a
 * connection timeout one that says timeout. Anything else: undefined.
 */
export function sdkErrorEvidence(err: unknown): Evidence | undefined {
  if (!(err instanceof Error)) return undefined;
  const e = err as Error & { status?: unknown; headers?: unknown; error?: unknown; code?: unknown };
  if (!("status" in e) || !("headers" in e) || !("error" in e)) return undefined;
  if (typeof e.status !== "number") {
    if (e.name === "APIUserAbortError" || e.constructor?.name === "APIUserAbortError") return undefined;
    let text = errorText(err);
    if (e.constructor?.name === "APIConnectionTimeoutError" && !/timeout/i.test(text)) text = "timeout: " + text;
    return { transport_error: text };
  }
  const ev: Evidence = { status: e.status };
  const body = sdkBody(e.status, e.error, e.message);
  if (body !== "") ev.body = body;
  const headers = headerMap(e.headers as ResponseLike["headers"] | undefined);
  if (Object.keys(headers).length) ev.headers = headers;
  if (typeof e.code === "string" && e.code !== "") ev.upstream_code = e.code;
  return ev;
}

/**
 * The error body as sent: the OpenAI SDK keeps the body's `error` member
 * (`{"error": …}` is rebuilt around it, as Go's openaievidence does), the
 * Anthropic SDK the whole body (`{"type":"error","error":…}`); a body that
 * was not JSON survives only in the message, after the status.
 */
function sdkBody(status: number, error: unknown, message: string): string {
  if (error !== undefined && error !== null) {
    const whole = typeof error === "object" && "error" in (error as object) && (error as { type?: unknown }).type === "error";
    return JSON.stringify(whole ? error : { error });
  }
  const prefix = `${status} `;
  if (message === `${status} status code (no body)`) return "";
  return message.startsWith(prefix) ? message.slice(prefix.length) : "";
}

/**
 * completionEvidence reads an OpenAI chat completion that returned without
 * an error: a `content_filter` finish is a 200 that did not answer (a
 * refusal; pass refusalScope when you know what was refused), anything else
 * answered, with the prompt tokens the provider counted. Hand it to
 * `attempt.observe`. A streamed call passes the finish reason and usage it
 * saw: `{choices: [{finish_reason}], usage}`.
 */
export function completionEvidence(c: {
  choices?: { finish_reason?: string | null }[];
  usage?: { prompt_tokens?: number } | null;
} | null | undefined, refusalScope?: "increment" | "history"): Evidence {
  const finish = c?.choices?.[0]?.finish_reason ?? undefined;
  if (!c || !c.choices?.length) return { status: 200 };
  if (finish === "content_filter") {
    return { status: 200, stop_reason: finish, ...(refusalScope ? { refusal_scope: refusalScope } : {}) };
  }
  const tokens = c.usage?.prompt_tokens;
  return { ok: true, status: 200, ...(tokens ? { request_tokens: tokens } : {}) };
}

/**
 * evidenceOf is the Evidence of what a call function threw: undefined
 * (nothing thrown) is an answer; then describe's reading, an Evidencer's
 * own, an SDK error's (sdkErrorEvidence), or else the error's text (with its
 * causes' messages and codes) as a transport error, named a timeout when it
 * was one.
 */
export function evidenceOf(err: unknown, describe?: Describer): Evidence {
  if (err === undefined) return { ok: true, status: 200 };
  const d = describe?.(err);
  if (d) return d;
  if (typeof (err as Evidencer | null)?.failbusEvidence === "function") return (err as Evidencer).failbusEvidence();
  const sdk = sdkErrorEvidence(err);
  if (sdk) return sdk;
  let text = errorText(err);
  if (isTimeout(err) && !/timeout/i.test(text)) text = "timeout: " + text;
  return { transport_error: text };
}

const TIMEOUT_CODES = new Set(["ETIMEDOUT", "ESOCKETTIMEDOUT", "UND_ERR_CONNECT_TIMEOUT", "UND_ERR_HEADERS_TIMEOUT", "UND_ERR_BODY_TIMEOUT"]);

function isTimeout(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 5; e = (e as Error & { cause?: unknown }).cause, depth++) {
    const code = (e as Error & { code?: unknown }).code;
    if (e.name === "TimeoutError" || (typeof code === "string" && TIMEOUT_CODES.has(code))) return true;
  }
  return false;
}

/** headerMap is headers with lower-case names, one string each (as an Outcome keeps them). */
export function headerMap(h: ResponseLike["headers"] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  if (!h) return out;
  const entries: Iterable<[string, string]> =
    typeof (h as Headers).entries === "function" && typeof (h as Headers).get === "function"
      ? (h as Headers).entries()
      : Symbol.iterator in Object(h)
        ? (h as Iterable<[string, string]>)
        : Object.entries(h as Record<string, string>);
  for (const [k, v] of entries) out[k.toLowerCase()] = String(v);
  return out;
}

/** evidenceFields keeps only the Evidence of e (wrap's outcome carries more: provider, at, …). */
export function evidenceFields(e: Evidence): Evidence {
  const out: Evidence = {};
  for (const k of ["ok", "status", "body", "headers", "transport_error", "upstream_code", "stop_reason", "refusal_scope", "request_tokens"] as const) {
    if (e[k] !== undefined) (out as Record<string, unknown>)[k] = e[k];
  }
  return out;
}
