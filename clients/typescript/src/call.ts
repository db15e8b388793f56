// call: one logical LLM call run to completion under the bus, as
// CONTRACT.md "What an agent does with each action" says. The TypeScript
// twin of Go's agent.Call (pkg/agent/call.go): the same actions, waits and
// errors, on the same shared scenario file (testdata/call/scenarios.json).

import { nuid } from "@nats-io/nats-core";

import type { Agent } from "./agent.js";
import type { Wait } from "./router.js";
import { type Describer, type Evidence, evidenceFields, evidenceOf } from "./evidence.js";
import type { Control, Decision, Origin, Outcome } from "./wire.js";
import { segmentKey } from "./wire.js";

/**
 * An attempt silent this long (no answer, no streamed chunk) is ended and
 * reported as a timeout: a hung stream becomes a decided, retried failure
 * instead of a session frozen for an hour. 2 minutes.
 */
export const DEFAULT_STALL_AFTER_MS = 2 * 60_000;
/** The bound of the wait for the bus's decision on a failed attempt: 30 s; past it call throws NoDecisionError. */
export const DEFAULT_DECISION_TIMEOUT_MS = 30_000;
/**
 * The calls a provider's recovery releases each wait a random time up to
 * this before calling again, so a provider that just came back is not hit
 * by every held call in the same second: 10 s.
 */
export const DEFAULT_RESUME_WINDOW_MS = 10_000;
/** The bound of one call's attempts (the bus's retry budget bounds retries; this bounds switches too): 32. */
export const DEFAULT_MAX_ATTEMPTS = 32;

/** How long a cancelled call waits for the bus to take its `cancel` of a pending retry. */
const CANCEL_TIMEOUT_MS = 5_000;
/** How long an attempt the watchdog ended may take to return before it is left behind. */
const STALL_GRACE_MS = 1_000;

/** Where an attempt goes: the provider, model and auth profile the call function uses. */
export interface Target {
  provider: string;
  model?: string;
  profile?: string;
}

/** One logical LLM call run under the bus. provider is required; every other field has a sensible default. */
export interface CallRequest {
  /** The first attempt's target. */
  provider: string;
  model?: string;
  profile?: string;
  /**
   * When the call names a session: the providers the segment may go to, in
   * order of preference (default: provider alone). Before the first
   * attempt, and after a provider switch, the refusal route is asked, and a
   * provider it excludes for this segment is left out; when it allows none
   * and skips one for an outage, the call holds on that one as on
   * wait_provider, then asks again.
   */
  providers?: string[];
  /** session and segment key the context segment (`<session>#<segment>`) for the refusal tiers. */
  session?: string;
  segment?: number;
  /** turn and step key the retry budget; without them the bus counts retries per episode instead. */
  turn?: number;
  step?: number;
  requestTokens?: number;
  /** contextWindow and maxOutputTokens let the classifier check a claimed context overflow against the real sizes. */
  contextWindow?: number;
  maxOutputTokens?: number;
  /** What work made the call (chat, cron, subagent, task). */
  origin?: Origin;
  /**
   * Reads the errors of the SDK the call function uses. Errors it does not
   * know are read by call itself (evidenceOf): HTTPError, the openai and
   * Anthropic SDKs' APIError, any other error as a transport error.
   */
  describe?: Describer;
  /** Receives every chunk an attempt streams (attempt.emit), tagged with its attempt. */
  onChunk?: (c: Chunk) => void;
  /**
   * Told before an attempt starts when an earlier one streamed output and
   * then failed: the stream restarts, and partial is what the failed attempt
   * produced. Chunks of two attempts are never passed on as one stream.
   */
  onRestart?: (r: Restart) => void;
  /**
   * Told of each attempt once the bus was told of it (a success) or has
   * decided it, before call acts on the decision: the trail as it grows
   * (progress, metrics, a log of what the bus said).
   */
  onStep?: (s: Step) => void;
  /** Ends an attempt silent this long and reports it as a timeout. Default DEFAULT_STALL_AFTER_MS. */
  stallAfterMs?: number;
  /** Bounds the wait for a decision. Default DEFAULT_DECISION_TIMEOUT_MS. */
  decisionTimeoutMs?: number;
  /** Spreads the resumption after a wait_provider. Default DEFAULT_RESUME_WINDOW_MS; negative resumes at once. */
  resumeWindowMs?: number;
  /** Bounds the attempts. Default DEFAULT_MAX_ATTEMPTS. */
  maxAttempts?: number;
  /** Ends every wait (and the attempt in progress): call then rejects with its reason. */
  signal?: AbortSignal;
}

/** One piece of an attempt's streamed output. */
export interface Chunk {
  attempt: number;
  text: string;
}

/** Attempt `attempt` starts over after `previous` failed having streamed `partial`. */
export interface Restart {
  attempt: number;
  previous: number;
  partial: string;
  reason: string;
}

/** One attempt in a call's trail: where it went, what the bus was told, and what it decided (absent for a success). */
export interface Step {
  target: Target;
  outcome: Outcome;
  decision?: Decision;
}

/** What call returns: the call function's result and every attempt, in order. */
export interface CallResult<T> {
  value: T;
  trail: Step[];
}

/** The errors call throws (other than the signal's reason) carry the trail so far. */
export class CallError extends Error {
  constructor(
    message: string,
    readonly trail: Step[],
    options?: ErrorOptions,
  ) {
    super(message, options);
    this.name = "CallError";
  }
}

/**
 * DecisionError: a decision only the caller can carry out — rerender
 * (quarantine or re-render the refused increment), skip_provider (the
 * segment may not go to this provider now), compact, give_up. It carries
 * the decision (class, rule, reason) and the outcome it is about.
 */
export class DecisionError extends CallError {
  constructor(
    readonly decision: Decision,
    readonly outcome: Outcome,
    trail: Step[],
  ) {
    const d = decision;
    super(`failbus decided ${d.action} for outcome ${d.outcome_id} (${d.class ?? ""}, rule ${d.rule ?? ""}): ${d.reason ?? ""}`, trail);
    this.name = "DecisionError";
  }

  /** The decision's action. */
  get action(): Decision["action"] {
    return this.decision.action;
  }
}

/** NoDecisionError: a failed attempt got no decision within decisionTimeoutMs. No scheduler runs, or it is far behind (failbus lag says which). */
export class NoDecisionError extends CallError {
  constructor(message: string, trail: Step[]) {
    super(message, trail);
    this.name = "NoDecisionError";
  }
}

/** TooManyAttemptsError: a call reached maxAttempts. */
export class TooManyAttemptsError extends CallError {
  constructor(message: string, trail: Step[]) {
    super(message, trail);
    this.name = "TooManyAttemptsError";
  }
}

/**
 * NoProviderError: every provider of a segment is excluded by the refusal
 * tiers now (each skipped, or frozen until a boundary). A provider the
 * route skips for an outage is not a refusal: call holds on it instead.
 */
export class NoProviderError extends CallError {
  constructor(message: string, trail: Step[]) {
    super(message, trail);
    this.name = "NoProviderError";
  }
}

/** StallError is the reason an attempt's signal aborts when it produced nothing for stallAfterMs. */
export class StallError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StallError";
  }
}

/** Attempt is one attempt of a call, handed to the call function. */
export class Attempt implements Target {
  readonly provider: string;
  readonly model?: string;
  readonly profile?: string;
  /**
   * Ends when the attempt must stop: the caller's signal aborted, or the
   * stall watchdog ended it (its reason is then a StallError). Pass it to
   * the SDK (`{ signal: attempt.signal }`) or to fetch.
   */
  readonly signal: AbortSignal;
  /** @internal */
  partial = "";
  /** @internal */
  observed?: Evidence;
  /** @internal */
  touched: () => void = () => {};

  constructor(
    target: Target,
    /** The attempt's number, from 1 (0 for a probe). */
    readonly n: number,
    /**
     * True for an attempt that answers the bus's probe of a provider in an
     * outage: its result only tells the bus whether the provider is back.
     */
    readonly probe: boolean,
    signal: AbortSignal,
    private readonly chunk?: (c: Chunk) => void,
  ) {
    this.provider = target.provider;
    if (target.model) this.model = target.model;
    if (target.profile) this.profile = target.profile;
    this.signal = signal;
  }

  /** The target as a plain value. */
  get target(): Target {
    return { provider: this.provider, ...(this.model ? { model: this.model } : {}), ...(this.profile ? { profile: this.profile } : {}) };
  }

  /** emit hands one chunk of streamed output to the caller (onChunk) and tells the stall watchdog the attempt is alive. */
  emit(text: string): void {
    this.partial += text;
    this.touch();
    this.chunk?.({ attempt: this.n, text });
  }

  /** touch tells the stall watchdog the attempt is alive without output (a keep-alive, a tool call in progress). */
  touch(): void {
    this.touched();
  }

  /**
   * observe sets the attempt's evidence explicitly, for a call that returned
   * without throwing but did not answer (a 200 whose stop reason is a
   * refusal), or a fetch-style call read by wrap: `attempt.observe(w.outcome)`.
   * The outcome is then built from it, whatever the call function returns
   * or throws.
   */
  observe(ev: Evidence): void {
    this.observed = evidenceFields(ev);
  }
}

/**
 * call runs one logical LLM call to completion under the bus: fn makes the
 * real request at the attempt's target with whatever SDK; call reports each
 * attempt's outcome and carries out the bus's decision — retry when the
 * bus's due retry arrives (a durable scheduled message, not a local timer),
 * switch profile, model or provider, hold while the provider is down
 * (answering the bus's probe with one real attempt, resuming spread over
 * resumeWindowMs), and throw a DecisionError for what only the caller can
 * do. It returns fn's result and the trail of attempts. Every wait ends with
 * req.signal, and call then rejects with the signal's reason. A segment
 * whose providers the route all excludes, one of them for an outage, holds
 * (probes answered) until that provider recovered, as Go's agent.Call does.
 *
 * fn must honour attempt.signal: call aborts it when the attempt is silent
 * for stallAfterMs, and goes on without waiting for an fn that ignores it.
 */
export async function call<T>(agent: Agent, req: CallRequest, fn: (attempt: Attempt) => Promise<T>): Promise<CallResult<T>> {
  if (!req.provider) throw new Error("failbus call: a provider is required");
  const r = defaults(req);
  const signal = req.signal ?? new AbortController().signal;
  const router = agent.callRouter();
  await router.start();
  const trail: Step[] = [];
  let target = await route(agent, r, { provider: r.provider, model: r.model, profile: r.profile }, r.providers, trail, fn, signal);
  let last: Attempt | undefined;
  let restart = "";
  for (let n = 1; ; n++) {
    if (n > r.maxAttempts) throw new TooManyAttemptsError(`failbus agent: too many attempts: ${r.maxAttempts} (maxAttempts)`, trail);
    if (last && r.onRestart && last.partial !== "") {
      r.onRestart({ attempt: n, previous: last.n, partial: last.partial, reason: restart });
    }
    const { at, value, ev } = await runAttempt(target, n, false, fn, r, signal, r.onChunk);
    signal.throwIfAborted();
    const o = outcome(agent, r, nuid.next(), target, ev);
    if (ev.ok) {
      const reported = await agent.report(o);
      trail.push({ target, outcome: reported });
      r.onStep?.(trail[trail.length - 1]!);
      return { value: value as T, trail };
    }
    const { decision: d, outcome: reported } = await decide(agent, r, o, signal, trail);
    trail.push({ target, outcome: reported, decision: d });
    r.onStep?.(trail[trail.length - 1]!);
    last = at;
    restart = `${d.action}: ${d.reason ?? ""}`;
    switch (d.action) {
      case "retry":
        await awaitRetry(agent, d, signal);
        // A retry scheduled before its provider's outage was declared
        // comes due into it: hold instead of sending it there.
        if (await router.inOutage(target.provider)) await hold(agent, r, target, fn, signal);
        break;
      case "switch_profile":
        target = { ...target, ...(d.profile ? { profile: d.profile } : { profile: undefined }) };
        break;
      case "switch_model":
        target = { ...target, ...(d.model ? { model: d.model } : { model: undefined }) };
        break;
      case "switch_provider":
        target = await route(agent, r, { provider: d.provider ?? "", model: d.model, profile: d.profile }, [d.provider ?? ""], trail, fn, signal);
        break;
      case "wait_provider":
        await hold(agent, r, target, fn, signal);
        break;
      default:
        throw new DecisionError(d, reported, trail);
    }
    target = clean(target);
  }
}

type Resolved = CallRequest & Required<Pick<CallRequest, "stallAfterMs" | "decisionTimeoutMs" | "resumeWindowMs" | "maxAttempts">>;

function defaults(req: CallRequest): Resolved {
  return {
    ...req,
    stallAfterMs: req.stallAfterMs && req.stallAfterMs > 0 ? req.stallAfterMs : DEFAULT_STALL_AFTER_MS,
    decisionTimeoutMs: req.decisionTimeoutMs && req.decisionTimeoutMs > 0 ? req.decisionTimeoutMs : DEFAULT_DECISION_TIMEOUT_MS,
    resumeWindowMs: req.resumeWindowMs === undefined || req.resumeWindowMs === 0 ? DEFAULT_RESUME_WINDOW_MS : req.resumeWindowMs,
    maxAttempts: req.maxAttempts && req.maxAttempts > 0 ? req.maxAttempts : DEFAULT_MAX_ATTEMPTS,
  };
}

function clean(t: Target): Target {
  return { provider: t.provider, ...(t.model ? { model: t.model } : {}), ...(t.profile ? { profile: t.profile } : {}) };
}

/** runAttempt runs fn under the stall watchdog and reads its evidence. */
async function runAttempt<T>(target: Target, n: number, probe: boolean, fn: (at: Attempt) => Promise<T>, r: Resolved,
  signal: AbortSignal, onChunk?: (c: Chunk) => void): Promise<{ at: Attempt; value?: T; ev: Evidence }> {
  signal.throwIfAborted();
  const ac = new AbortController();
  const forward = () => ac.abort(signal.reason);
  signal.addEventListener("abort", forward, { once: true });
  const at = new Attempt(target, n, probe, ac.signal, onChunk);
  let timer: NodeJS.Timeout | undefined;
  let stalled!: () => void;
  const stall = new Promise<"stall">((resolve) => (stalled = () => resolve("stall")));
  const arm = () => {
    clearTimeout(timer);
    timer = setTimeout(stalled, r.stallAfterMs);
  };
  at.touched = arm;
  let aborted!: () => void;
  const cancelled = new Promise<"abort">((resolve) => (aborted = () => resolve("abort")));
  signal.addEventListener("abort", aborted, { once: true });
  type Settled = { value?: T; err?: unknown; threw: boolean };
  const done: Promise<Settled> = (async () => fn(at))().then(
    (value) => ({ value, threw: false }),
    (err: unknown) => ({ err, threw: true }),
  );
  arm();
  try {
    const first = await Promise.race([done, stall, cancelled]);
    if (first === "abort") return { at, ev: {} };
    if (first === "stall") {
      const ms = goDuration(r.stallAfterMs);
      ac.abort(new StallError(`no output for ${ms} (stall_after)`));
      // fn should return at once; one that ignores its signal is left
      // behind, its attempt reported as stalled.
      const res = await Promise.race([done, sleep(STALL_GRACE_MS)]);
      const text = at.partial !== ""
        ? `timeout: the stream stopped for ${ms} after ${Buffer.byteLength(at.partial, "utf8")} bytes (stall_after); the attempt was ended`
        : `timeout: no output for ${ms} (stall_after); the attempt was ended`;
      // Chunks flowed: the provider answered, then the stream stalled,
      // not the network path to it.
      return { at, value: res ? res.value : undefined, ev: at.partial !== "" ? { status: 200, transport_error: text } : { transport_error: text } };
    }
    const res = first as Settled;
    if (at.observed) return { at, value: res.value, ev: at.observed };
    const ev = evidenceOf(res.threw ? (res.err ?? new Error("the call function threw undefined")) : undefined, r.describe);
    // A stream that broke after chunks flowed had an answer (status 200).
    if (!ev.ok && !ev.status && at.partial !== "") ev.status = 200;
    return { at, value: res.value, ev };
  } finally {
    clearTimeout(timer);
    at.touched = () => {};
    signal.removeEventListener("abort", forward);
    signal.removeEventListener("abort", aborted);
  }
}

/** decide reports o and waits for the bus's decision on it. */
async function decide(agent: Agent, r: Resolved, o: Outcome, signal: AbortSignal, trail: Step[]): Promise<{ decision: Decision; outcome: Outcome }> {
  const router = agent.callRouter();
  const wait = router.awaitDecision(o.id);
  let reported: Outcome;
  try {
    reported = await agent.report(o);
  } catch (err) {
    wait.cancel();
    throw err;
  }
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), r.decisionTimeoutMs)));
  try {
    const d = await untilAborted(Promise.race([wait.promise, timeout]), signal);
    if (d === "timeout") {
      wait.cancel();
      throw new NoDecisionError(`failbus agent: no decision from the bus for outcome ${o.id} within ${goDuration(r.decisionTimeoutMs)}: ` +
        "is a scheduler running, and caught up? (failbus lag)", trail);
    }
    return { decision: d, outcome: reported };
  } catch (err) {
    if (signal.aborted) {
      // The decision may be on its way: a retry decided now would stay
      // scheduled, so it is waited for a moment and cancelled.
      void cancelLate(agent, wait, o.id);
    } else {
      wait.cancel();
    }
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

/** How long a call cancelled while waiting for its decision still listens for it, to cancel a retry decided meanwhile. */
const LATE_DECISION_WAIT_MS = 5000;

/** cancelLate cancels the retry a decision that arrives after its call was cancelled scheduled. */
async function cancelLate(agent: Agent, wait: Wait<Decision>, outcomeId: string): Promise<void> {
  const late = await Promise.race([wait.promise, sleep(LATE_DECISION_WAIT_MS).then(() => undefined)]);
  if (!late) {
    wait.cancel();
    return;
  }
  if (late.action === "retry" && late.retry_id) {
    await agent.cancel(late.retry_id).catch((err: Error) =>
      agent.onError(new Error(`failbus agent: cancel retry ${late.retry_id} of a cancelled call (outcome ${outcomeId}): ${err.message}`, { cause: err })));
  }
}

/** awaitRetry waits for the due retry of d from the bus and marks it started. A cancelled wait cancels the retry (no started record). */
async function awaitRetry(agent: Agent, d: Decision, signal: AbortSignal): Promise<void> {
  const id = d.retry_id ?? "";
  const wait = agent.callRouter().awaitDue(id);
  try {
    await untilAborted(wait.promise, signal);
  } catch (err) {
    wait.cancel();
    await Promise.race([agent.cancel(id).catch(() => {}), sleep(CANCEL_TIMEOUT_MS)]);
    throw err;
  }
  await agent.started(id);
}

/**
 * hold waits until target's provider is healthy again, answering the bus's
 * probes of it with one real attempt each, then waits a random part of
 * resumeWindowMs.
 */
async function hold<T>(agent: Agent, r: Resolved, target: Target, fn: (at: Attempt) => Promise<T>, signal: AbortSignal): Promise<void> {
  const router = agent.callRouter();
  const holder = router.hold(target.provider);
  const hc = new AbortController();
  const forward = () => hc.abort(signal.reason);
  signal.addEventListener("abort", forward, { once: true });
  const healthy = router.waitHealthy(target.provider, hc.signal).then(() => "healthy" as const);
  healthy.catch(() => {}); // read below, or dropped with the hold
  try {
    for (;;) {
      const got: "healthy" | Control = await untilAborted(Promise.race([healthy, holder.next()]), signal);
      if (got === "healthy") {
        await sleep(spread(r.resumeWindowMs), signal);
        return;
      }
      const { ev } = await runAttempt(target, 0, true, fn, r, signal);
      signal.throwIfAborted();
      const o = outcome(agent, r, "probe-" + nuid.next(), target, ev);
      o.origin = { kind: "probe", ...(got.recovery_id ? { name: got.recovery_id } : {}) };
      await agent.report(o).catch((err: Error) =>
        agent.onError(new Error(`failbus agent ${agent.name}: report the probe of ${target.provider}: ${err.message}`, { cause: err })));
    }
  } finally {
    holder.release();
    signal.removeEventListener("abort", forward);
    hc.abort(new Error("hold ended"));
  }
}

/**
 * route asks the refusal tiers which of candidates may receive the
 * request's segment now and returns target on the first allowed one; a
 * request without a session is not routed. When none is allowed and one
 * of them is skipped for an outage (a skip with neither a re-probe time nor
 * frozen: the route's answer for a provider whose health says outage), the
 * call holds on it as on wait_provider — probes answered, resuming spread
 * after its health says recovered — and asks again; when every one is
 * excluded by the refusal tiers it throws NoProviderError.
 */
async function route<T>(agent: Agent, r: Resolved, target: Target, candidates: string[] | undefined, trail: Step[],
  fn: (at: Attempt) => Promise<T>, signal: AbortSignal): Promise<Target> {
  if (!r.session) return clean(target);
  const list = candidates?.length ? candidates : [target.provider];
  for (;;) {
    const res = await agent.route(r.session, r.segment ?? 0, list);
    if (res.allowed.length > 0) {
      if (res.allowed[0] !== target.provider) return { provider: res.allowed[0]! };
      return clean(target);
    }
    const down = res.skipped.find((s) => !s.next_probe_at && !s.frozen);
    if (!down) {
      const why = res.skipped.map((s) => `${s.provider}: ${s.reason}`).join("; ");
      throw new NoProviderError(`failbus agent: every provider is excluded for this segment: ${segmentKey(r.session, r.segment ?? 0)} of ${agent.name}: ${why}`, trail);
    }
    await hold(agent, r, down.provider === target.provider ? clean(target) : { provider: down.provider }, fn, signal);
  }
}

/** outcome is the Outcome of an attempt with ev at target. */
function outcome(agent: Agent, r: Resolved, id: string, t: Target, ev: Evidence): Outcome {
  const o: Outcome = {
    id, agent: agent.name, provider: t.provider, model: t.model, profile: t.profile,
    session: r.session, segment: r.segment, turn: r.turn, step: r.step,
    ok: ev.ok === true, status: ev.status, body: ev.body, headers: ev.headers, transport_error: ev.transport_error,
    upstream_code: ev.upstream_code, stop_reason: ev.stop_reason, refusal_scope: ev.refusal_scope,
    request_tokens: ev.request_tokens && ev.request_tokens > 0 ? ev.request_tokens : r.requestTokens,
    context_window: r.contextWindow, max_output_tokens: r.maxOutputTokens, origin: r.origin,
  };
  for (const k of Object.keys(o) as (keyof Outcome)[]) {
    if (o[k] === undefined || o[k] === "") delete o[k];
  }
  return o;
}

/** spread is a random wait in [0, window). */
function spread(windowMs: number): number {
  return windowMs <= 0 ? 0 : Math.floor(Math.random() * windowMs);
}

/** sleep waits ms, or rejects with the signal's reason when it aborts first. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (ms <= 0) return signal?.aborted ? Promise.reject(signal.reason) : Promise.resolve();
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", stop);
      resolve();
    }, ms);
    const stop = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", stop, { once: true });
  });
}

/** untilAborted settles as p does, or rejects with the signal's reason when it aborts first. */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const stop = () => reject(signal.reason);
    signal.addEventListener("abort", stop, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener("abort", stop);
        resolve(v);
      },
      (err: unknown) => {
        signal.removeEventListener("abort", stop);
        reject(err);
      },
    );
  });
}

/** goDuration renders ms as Go prints a time.Duration (300ms, 1.5s, 2m0s), so both clients word an outcome alike. */
export function goDuration(ms: number): string {
  if (ms < 1000) return `${ms}ms`;
  const h = Math.floor(ms / 3_600_000);
  const m = Math.floor((ms % 3_600_000) / 60_000);
  const s = (ms % 60_000) / 1000;
  const sec = `${Number.isInteger(s) ? s : String(s)}s`;
  if (h > 0) return `${h}h${m}m${sec}`;
  if (m > 0) return `${m}m${sec}`;
  return sec;
}
