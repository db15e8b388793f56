// The fleet drill of the TypeScript client: the same fleet, on the same
// chaos timeline, three ways — the `openai` npm SDK as it comes (its default
// retries), @mariozechner/pi-ai with the auto-retry of pi's coding agent as
// its settings document it, and the `openai` SDK with its retries off under
// failbus `call` — counted from the chaos provider's side (its request log),
// not from the client's. The TypeScript half of `failbus drill`: its rows
// carry the same figures, so they sit in one table with the Go rows.
//
//   npm run drill -- [--agents 6] [--tasks 5] [--steps 4] [--timeline FILE]
//                    [--scale 0.01] [--grace 10s] [--sequential] [--json]
//                    [--strategy openai,pi,call] [--server nats://…]
//
// The fleet: each agent runs its tasks one after another, as they arrive
// spread over the timeline; a task is a conversation of --steps LLM calls,
// each sending the whole conversation so far (a system prompt, the task,
// then per step the answer and a tool result). Every agent has two
// profiles: `team`, the key every agent shares (sk-capped: the timeline's
// capped key), and its own; its tasks alternate between them. One task in
// five carries content the provider refuses (the timeline's refusal
// marker). Every task reaches the chaos provider under its own path,
// /<agent>.<task>/v1/ (a probe under /<agent>.probe/v1/), so the provider's
// log tells tasks and probes apart; the sample timeline's windows filter on
// no provider, so every path is the same provider to them. The bus knows
// one provider, "openai".
//
// What a strategy does with a failure, beyond its SDK: the baselines' fleet
// loses a task whose call still fails after the SDK's (and pi's) retries;
// a 200 without an answer (a refusal) is not an error to the openai SDK, so
// that fleet goes on with the task's next step, the refused content still
// in the conversation. The fleet under `call` does what only the caller
// can: on rerender it quarantines the refused content and calls again, on
// skip_provider it also starts a new segment, on compact it drops the
// oldest tool results, on give_up for a key (quota, auth) it moves to its
// other profile unless the bus gave up on that key too; and it keeps using
// the profile a call ended on.
//
// Figures, from the provider's log: calls received (probes included);
// wasted calls, each counted once, in this order — sent to the provider in
// an outage (answered by a reset, refuse, unavailable or overloaded window)
// other than the bus's probes, sent to a key past its cap (quota answers
// after the first per key), a refused segment re-sent to the provider that
// refused it (refusals after the first per task), a non-retryable error
// retried (a prompt re-sent unchanged after a quota, overflow or refusal
// answer) — and the prompt tokens they carried; calls per completed task;
// the largest burst (calls within one second of timeline time) in the
// minute after the outage ended; calls that hung past the stall window (an
// answer that took longer than 1.5 × the stall window, 2 minutes of
// timeline time: `call`'s watchdog ends an attempt silent that long). From
// the fleet: tasks completed, and lost (not completed by the end of the
// timeline plus --grace, whatever the reason).
//
// Times: the timeline and the bus's policy (retry delays, fault-scope
// window, recovery probes and time) run at --scale, as do `call`'s stall
// and resume windows; the SDKs' own backoffs are their constants (0.5 s ·
// 2ⁿ for openai, 2 s · 2ⁿ for pi), as docs/CHAOS.md says of any client.

import { spawn, type ChildProcess } from "node:child_process";
import { setMaxListeners } from "node:events";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { pathToFileURL } from "node:url";

import { DeliverPolicy, jetstream } from "@nats-io/jetstream";
import { type Api, complete, type Context, isContextOverflow, type Message, type Model } from "@mariozechner/pi-ai";
import OpenAI from "openai";

import {
  Agent, type Attempt, call, CallError, type CallRequest, completionEvidence, connect, decodeRecord, DecisionError, type Health, Schema, type Step, Subject,
} from "../src/index.js";
import { failbusBinary, repoRoot, startDev, type Dev } from "./dev.js";

/** The strategies, in table order. */
export const STRATEGIES = ["openai", "pi", "call"] as const;
export type Strategy = (typeof STRATEGIES)[number];

const LABELS: Record<Strategy, string> = {
  openai: "ts: openai SDK, default retries",
  pi: "ts: pi-ai, pi's auto-retry",
  call: "ts: openai SDK, retries off, failbus call",
};

/** What a drill runs. */
export interface DrillOptions {
  agents: number;
  /** Tasks per agent. */
  tasks: number;
  /** LLM calls per task. */
  steps: number;
  /** The chaos timeline (default: testdata/chaos/drill.yaml). */
  timeline: string;
  scale: number;
  /** How long after the timeline's end unfinished tasks are given, in ms. */
  graceMs: number;
  strategies: Strategy[];
  /** Run the strategies one after another instead of side by side. */
  sequential: boolean;
  /** A running bus for the `call` row; default: a `failbus dev` started with the drill's policy. */
  server?: string;
  /** The content the timeline refuses. */
  marker: string;
  /** The timeline's capped key, which every agent shares as its `team` profile. */
  teamKey: string;
  /** Progress lines (stderr by default). */
  progress: (line: string) => void;
  /** A prefix of agent names, unique per run. */
  name: string;
}

/** One row: one strategy's figures. */
export interface Row {
  strategy: Strategy;
  label: string;
  client: "typescript";
  tasks: number;
  completed: number;
  lost: number;
  /** What lost the tasks that were lost, by reason. */
  lost_by: Record<string, number>;
  calls: number;
  probes: number;
  wasted: {
    outage: number;
    past_cap: number;
    refused_resent: number;
    nonretryable_retried: number;
    total: number;
    prompt_tokens: number;
  };
  calls_per_completed_task: number | null;
  burst_after_recovery: number;
  hung_calls: number;
  /** Seconds from the drill's start to the last task's end (real time). */
  seconds: number;
  /** Only the `call` row: what its promises are checked against. */
  call?: CallFigures;
}

/** What the `call` row's promises are checked against. */
export interface CallFigures {
  /**
   * Non-probe calls an agent made to the provider between being told
   * wait_provider and the bus saying the provider recovered: the promise
   * is none.
   */
  calls_while_held: number;
  /** Non-probe calls answered by an outage window that arrived after the bus declared the outage. */
  outage_calls_after_declared: number;
  /** When the bus declared the outage, in ms after the drill started (null: it never did). */
  outage_declared_ms: number | null;
  /** Decisions the fleet got, by action. */
  decisions: Record<string, number>;
}

/** A drill's result: the rows and what they ran on. */
export interface DrillResult {
  client: "typescript";
  timeline: string;
  scale: number;
  agents: number;
  tasks_per_agent: number;
  steps: number;
  stall_window_ms: number;
  rows: Row[];
}

// ---------------------------------------------------------------------------
// The chaos provider

/** One fault window as the chaos provider describes it, in ms of timeline time. */
interface Window {
  name: string;
  kind: string;
  from: number;
  to: number; // Infinity: until the end
}

/** One request in the chaos provider's log (docs/CHAOS.md "The log"). */
interface LogRecord {
  seq: number;
  at: string;
  offset_ns: number;
  provider: string;
  key: string;
  fingerprint: string;
  tokens: number;
  status: number;
  fault?: string;
  window?: string;
  refused?: boolean;
  done: boolean;
  aborted?: boolean;
  duration_ns: number;
}

interface Chaos {
  url: string;
  windows: Window[];
  proc: ChildProcess;
  requests(): Promise<LogRecord[]>;
  stop(): Promise<void>;
}

/** parseGoDuration reads a Go duration (1m30s, 250ms, 1.5s, 0s) in ms. */
export function parseGoDuration(s: string): number {
  const units: Record<string, number> = { h: 3_600_000, m: 60_000, s: 1000, ms: 1, "µs": 0.001, us: 0.001, ns: 0.000001 };
  let ms = 0;
  let rest = s.trim();
  if (rest === "0") return 0;
  while (rest) {
    const m = /^([0-9.]+)(h|ms|m|s|µs|us|ns)/.exec(rest);
    if (!m) throw new Error(`not a Go duration: ${s}`);
    ms += Number(m[1]) * units[m[2]!]!;
    rest = rest.slice(m[0].length);
  }
  return ms;
}

/** startChaos runs `failbus chaos` on a free port; it resolves once it listens and has described its windows. */
async function startChaos(bin: string, timeline: string, scale: number, log: string, forMs?: number): Promise<Chaos & { stdout: () => string }> {
  const args = ["chaos", "--timeline", timeline, "--scale", String(scale), "--addr", "127.0.0.1:0", "--log", log];
  if (forMs !== undefined) args.push("--for", `${forMs}ms`);
  const proc = spawn(bin, args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  proc.stdout!.on("data", (b) => (out += b));
  proc.stderr!.on("data", (b) => (err += b));
  const exited = new Promise<void>((r) => proc.once("exit", () => r()));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`failbus chaos printed no URL within 30s\n${err}`)), 30_000);
    const look = () => {
      const m = /chaos provider on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]!);
      }
    };
    proc.stdout!.on("data", look);
    void exited.then(() => {
      look();
      clearTimeout(timer);
      reject(new Error(`failbus chaos exited before printing its URL\n${err}`));
    });
  });
  return {
    url,
    windows: [],
    proc,
    stdout: () => out,
    async requests() {
      const res = await fetch(`${url}/_chaos/requests`);
      if (!res.ok) throw new Error(`GET /_chaos/requests: ${res.status}`);
      return (await res.json()) as LogRecord[];
    },
    async stop() {
      if (proc.exitCode === null) proc.kill("SIGTERM");
      await exited;
    },
  };
}

/** timelineWindows asks the chaos provider itself what the timeline holds (a run of a few ms prints it, then its summary). */
async function timelineWindows(bin: string, timeline: string, scale: number, dir: string): Promise<Window[]> {
  const c = await startChaos(bin, timeline, scale, join(dir, "describe.jsonl"), 1);
  await c.stop();
  const windows: Window[] = [];
  let inside = false;
  for (const line of c.stdout().split("\n")) {
    if (line.startsWith("windows (timeline time):")) {
      inside = true;
      continue;
    }
    if (!inside) continue;
    const m = /^ {2}(\S+)\s+(\S+)\s+(\S+) – (\S+)\s*$/.exec(line);
    if (!m) break;
    windows.push({ name: m[1]!, kind: m[2]!, from: parseGoDuration(m[3]!), to: m[4] === "end" ? Infinity : parseGoDuration(m[4]!) });
  }
  return windows;
}

const OUTAGE_KINDS = new Set(["refuse", "reset", "unavailable", "overloaded"]);
const NONRETRYABLE_KINDS = new Set(["quota", "overflow", "refusal"]);

// ---------------------------------------------------------------------------
// The fleet

interface Turn {
  role: "user" | "assistant";
  text: string;
}

/** A task: a conversation of steps, one LLM call each. */
interface Task {
  id: string; // <agent>.t<j>
  agent: string;
  index: number;
  arrivesMs: number;
  marked: boolean;
  system: string;
  turns: Turn[];
  segment: number;
  profile: string;
}

const SYSTEM = "You are a careful agent of a small fleet. Work through the task one step at a time; after each tool result, say what you " +
  "did and what comes next. Keep answers short. Never invent tool output; if a tool failed, say so plainly. ".repeat(2);

function toolResult(step: number, task: string): string {
  return `Tool result of step ${step} for ${task}: ` + `the command finished; its output listed files, sizes and checksums, line ${step}. `.repeat(8);
}

function makeTasks(o: DrillOptions, agent: string, i: number, spanMs: number): Task[] {
  return Array.from({ length: o.tasks }, (_, j) => {
    const marked = (i * o.tasks + j) % 5 === 2;
    const text = `Task ${agent}.t${j}: tidy the project's build files and report what changed.` +
      (marked ? ` The customer pasted this note: ${o.marker} (forward it as it is).` : "");
    return {
      id: `${agent}.t${j}`, agent, index: j, marked,
      arrivesMs: Math.round((spanMs * (j + i / o.agents)) / o.tasks),
      system: SYSTEM, turns: [{ role: "user", text }], segment: 1,
      profile: j % 2 === 0 ? "team" : `own-${agent}`,
    };
  });
}

function keyFor(profile: string | undefined, agent: string, o: DrillOptions): string {
  return profile === "team" ? o.teamKey : `sk-${agent}`;
}

function openaiMessages(t: Task): OpenAI.Chat.ChatCompletionMessageParam[] {
  return [{ role: "system", content: t.system }, ...t.turns.map((x) => ({ role: x.role, content: x.text }))];
}

function promptTokens(t: Task): number {
  return Math.ceil((t.system.length + t.turns.reduce((n, x) => n + x.text.length, 0)) / 4);
}

/** answered appends a step's answer and the tool result that follows it. */
function answered(t: Task, step: number, text: string): void {
  t.turns.push({ role: "assistant", text: text || "(no answer)" }, { role: "user", text: toolResult(step, t.id) });
}

function quarantine(t: Task, marker: string): void {
  for (const x of t.turns) x.text = x.text.split(marker).join("[quarantined]");
}

/** compact keeps the task and the latest exchange. */
function compact(t: Task): void {
  if (t.turns.length > 3) t.turns = [t.turns[0]!, ...t.turns.slice(-2)];
}

/** A strategy runs one step of a task: true when it was answered; it throws when the task is lost. */
type StepRunner = (t: Task, step: number) => Promise<boolean>;

/** runFleet runs every agent's tasks through step, and counts what completed. */
async function runFleet(o: DrillOptions, agents: string[], spanMs: number, deadline: AbortSignal, stepper: (agent: string) => StepRunner,
  label: string): Promise<{ completed: number; tasks: number; lostBy: Record<string, number> }> {
  const start = Date.now();
  const lostBy: Record<string, number> = {};
  let completed = 0;
  let tasks = 0;
  const thinkMs = Math.max(1, Math.round(2000 * o.scale));
  const lose = (why: string) => (lostBy[why] = (lostBy[why] ?? 0) + 1);
  await Promise.all(agents.map(async (agent, i) => {
    const step = stepper(agent);
    for (const t of makeTasks(o, agent, i, spanMs)) {
      tasks++;
      const wait = start + t.arrivesMs - Date.now();
      if (deadline.aborted || (wait > 0 && !(await pause(wait, deadline)))) {
        lose("the run ended");
        continue;
      }
      // A step the provider answered without an answer (a refusal) leaves
      // the task incomplete, and its later steps still run; a step that
      // throws loses the task.
      let answeredAll = true;
      let lost = false;
      for (let s = 1; s <= o.steps && !lost; s++) {
        if (s > 1 && !(await pause(thinkMs, deadline))) {
          lose("the run ended");
          lost = true;
          break;
        }
        try {
          if (!(await step(t, s))) answeredAll = false;
        } catch (err) {
          lost = true;
          lose(deadline.aborted ? "the run ended" : whyLost(err));
          if (!deadline.aborted && err instanceof CallError) o.progress(`drill: ${label}: lost ${t.id} at step ${s}: ${trailLine(err.trail)}`);
        }
      }
      if (lost) continue;
      if (answeredAll) completed++;
      else lose("steps left unanswered (refused)");
    }
  }));
  o.progress(`drill: ${label}: ${completed} of ${tasks} tasks completed in ${((Date.now() - start) / 1000).toFixed(1)}s` +
    (Object.keys(lostBy).length ? `; lost: ${Object.entries(lostBy).map(([k, v]) => `${v} ${k}`).join(", ")}` : ""));
  return { completed, tasks, lostBy };
}

/** trailLine is a lost call's attempts, one `profile status class→action` each: what to read when a task is lost. */
function trailLine(trail: Step[]): string {
  return trail.map((st) => `${st.target.profile ?? "-"} ${st.outcome.status ?? "-"} ${st.decision ? `${st.decision.class ?? "?"}→${st.decision.action}${st.decision.profile ? `(${st.decision.profile})` : ""}` : "ok"}`).join("; ");
}

/** whyLost names what lost a task, short enough for a table. */
function whyLost(err: unknown): string {
  if (err instanceof DecisionError) {
    // An unknown class names its evidence: that is what to teach the classifier.
    if (err.decision.class === "unknown") {
      const o = err.outcome;
      return `${err.action} (unknown: ${o.status ?? "-"} ${(o.transport_error ?? o.body ?? "").slice(0, 80)})`;
    }
    return `${err.action} (${err.decision.class})`;
  }
  const e = err as Error;
  return `${e.name}: ${(e.message ?? String(err)).split("\n")[0]!.slice(0, 100)}`;
}

/** pause waits ms; false when the deadline came first. */
function pause(ms: number, deadline: AbortSignal): Promise<boolean> {
  if (deadline.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const t = setTimeout(() => {
      deadline.removeEventListener("abort", stop);
      resolve(true);
    }, ms);
    const stop = () => {
      clearTimeout(t);
      resolve(false);
    };
    deadline.addEventListener("abort", stop, { once: true });
  });
}

// --- the openai SDK as it comes ---------------------------------------------

function openaiStepper(o: DrillOptions, chaos: string, deadline: AbortSignal): (agent: string) => StepRunner {
  return (agent) => async (t, step) => {
    const client = new OpenAI({ baseURL: `${chaos}/${t.id}/v1`, apiKey: keyFor(t.profile, agent, o) });
    const stream = await client.chat.completions.create({ model: "gpt-drill", messages: openaiMessages(t), stream: true }, { signal: deadline });
    let text = "";
    let finish: string | null | undefined;
    for await (const c of stream) {
      text += c.choices[0]?.delta?.content ?? "";
      finish = c.choices[0]?.finish_reason ?? finish;
    }
    if (finish === "content_filter") {
      // Not an error to the SDK: the conversation goes on, the refused content in it.
      answered(t, step, "");
      return false;
    }
    answered(t, step, text);
    return true;
  };
}

// --- pi-ai with pi's auto-retry ---------------------------------------------

/**
 * pi's coding agent (the release of this pi-ai, 0.73) retries a failed turn
 * itself, configured as its settings document (docs/settings.md "Retry"):
 * `retry.enabled`, `maxRetries` 3, `baseDelayMs` 2000 (2 s, 4 s, 8 s), and
 * the example's `provider` block — the SDK's own retries off
 * (`maxRetries` 0), `timeoutMs` one hour, `maxRetryDelayMs` 60 s. It
 * re-sends the same context after a turn that ended in an error its agent
 * session's pattern matches, never after a context overflow.
 */
export const PI_RETRY = { maxRetries: 3, baseDelayMs: 2000, providerMaxRetries: 0, providerTimeoutMs: 3_600_000, providerMaxRetryDelayMs: 60_000 };
/** The errors pi's agent session retries (its _isRetryableError, pi-coding-agent 0.73.1). */
export const PI_RETRYABLE = /overloaded|provider.?returned.?error|rate.?limit|too many requests|429|500|502|503|504|service.?unavailable|server.?error|internal.?error|network.?error|connection.?error|connection.?refused|connection.?lost|websocket.?closed|websocket.?error|other side closed|fetch failed|upstream.?connect|reset before headers|socket hang up|ended without|http2 request did not get a response|timed? out|timeout|terminated|retry delay/i;

function piStepper(o: DrillOptions, chaos: string, deadline: AbortSignal): (agent: string) => StepRunner {
  return (agent) => async (t, step) => {
    const model: Model<Api> = {
      id: "gpt-drill", name: "gpt-drill", api: "openai-completions", provider: "chaos", baseUrl: `${chaos}/${t.id}/v1`,
      reasoning: false, input: ["text"], cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0 }, contextWindow: 128_000, maxTokens: 1024,
    };
    const ctx: Context = {
      systemPrompt: t.system,
      messages: t.turns.map((x): Message => x.role === "user"
        ? { role: "user", content: x.text, timestamp: Date.now() }
        : {
          role: "assistant", content: [{ type: "text", text: x.text }], api: "openai-completions", provider: "chaos", model: "gpt-drill",
          usage: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } },
          stopReason: "stop", timestamp: Date.now(),
        }),
    };
    for (let retry = 0; ; retry++) {
      const msg = await complete(model, ctx, {
        apiKey: keyFor(t.profile, agent, o), signal: deadline, timeoutMs: PI_RETRY.providerTimeoutMs,
        maxRetries: PI_RETRY.providerMaxRetries, maxRetryDelayMs: PI_RETRY.providerMaxRetryDelayMs,
      });
      if (msg.stopReason !== "error" && msg.stopReason !== "aborted") {
        answered(t, step, msg.content.map((c) => (c.type === "text" ? c.text : "")).join(""));
        return true;
      }
      const retryable = msg.stopReason === "error" && !!msg.errorMessage && !isContextOverflow(msg, model.contextWindow) &&
        PI_RETRYABLE.test(msg.errorMessage);
      if (!retryable || retry >= PI_RETRY.maxRetries || deadline.aborted) throw new Error(`pi: ${msg.errorMessage ?? msg.stopReason}`);
      if (!(await pause(PI_RETRY.baseDelayMs * 2 ** retry, deadline))) throw new Error("deadline");
    }
  };
}

// --- the openai SDK, retries off, under call ---------------------------------

interface CallFleet {
  agents: Map<string, Agent>;
  /** agent -> when it was told wait_provider (ms): it holds from then until the bus says the provider recovered. */
  waits: Map<string, number[]>;
  decisions: Record<string, number>;
}

function callStepper(o: DrillOptions, chaos: string, deadline: AbortSignal, fleet: CallFleet): (agent: string) => StepRunner {
  const stallAfterMs = Math.max(50, Math.round(120_000 * o.scale));
  const resumeWindowMs = Math.max(1, Math.round(10_000 * o.scale));
  return (name) => {
    const agent = fleet.agents.get(name)!;
    const waits: number[] = [];
    fleet.waits.set(name, waits);
    const remap = new Map<string, string>(); // profile -> the profile a call ended on
    /** attempt is the call function: one streamed request at the attempt's target. */
    async function attempt(at: Attempt, t: Task, agentName: string): Promise<string | undefined> {
      const path = at.probe ? `${agentName}.probe` : t.id;
      const client = new OpenAI({ baseURL: `${chaos}/${path}/v1`, apiKey: keyFor(at.profile, agentName, o), maxRetries: 0 });
      const stream = await client.chat.completions.create({ model: at.model ?? "gpt-drill", messages: openaiMessages(t), stream: true },
        { signal: at.signal });
      let text = "";
      let finish: string | null | undefined;
      for await (const c of stream) {
        const d = c.choices[0]?.delta?.content ?? "";
        if (d) at.emit(d);
        else at.touch();
        text += d;
        finish = c.choices[0]?.finish_reason ?? finish;
      }
      if (finish === "content_filter") {
        // The newest user turn is what this call added: refused there, the
        // increment was refused; anywhere else, the history.
        const newest = t.turns[t.turns.length - 1]!;
        at.observe(completionEvidence({ choices: [{ finish_reason: finish }] }, newest.text.includes(o.marker) ? "increment" : "history"));
        return undefined;
      }
      return text;
    }
    // Keys the bus gave up on for this agent (quota, credentials). Only
    // these are not worth another round: a profile a round began on may have
    // failed only with a rate limit before the bus switched the call to a
    // key that then ran out (its last success can finish after its first
    // quota answer, so the bus may still know it as working).
    const spentKeys = new Set<string>();
    return async (t, step) => {
      for (let round = 0; round < 8; round++) {
        const profile = remap.get(t.profile) ?? t.profile;
        const req: CallRequest = {
          provider: "openai", model: "gpt-drill", profile, providers: ["openai"],
          session: t.id, segment: t.segment, turn: step, step: 1,
          requestTokens: promptTokens(t), origin: { kind: "task", name: t.id },
          stallAfterMs, resumeWindowMs, signal: deadline,
          onStep: (s) => {
            if (s.decision) fleet.decisions[s.decision.action] = (fleet.decisions[s.decision.action] ?? 0) + 1;
            if (s.decision?.action === "wait_provider") waits.push(Date.now());
          },
        };
        try {
          const { value, trail } = await call(agent, req, (at) => attempt(at, t, name));
          const ended = trail[trail.length - 1]?.target.profile;
          if (ended && ended !== profile) remap.set(t.profile, ended);
          if (value === undefined) throw new Error("no answer");
          answered(t, step, value);
          return true;
        } catch (err) {
          if (!(err instanceof DecisionError) || deadline.aborted) throw err;
          switch (err.action) {
            case "rerender":
              quarantine(t, o.marker);
              continue;
            case "skip_provider":
              quarantine(t, o.marker);
              t.segment++;
              await agent.boundary({ session: t.id, segment: t.segment, reason: "refused content quarantined" });
              continue;
            case "compact":
              compact(t);
              continue;
            case "give_up": {
              // The key that ran out is the last attempt's (the bus may have
              // switched the call's profile), not the one this round began on.
              const spent = err.outcome.profile ?? profile;
              if (err.decision.class !== "quota_exhausted" && err.decision.class !== "auth") throw err;
              spentKeys.add(spent);
              const other = spent === "team" ? `own-${name}` : "team";
              if (spentKeys.has(other)) throw err;
              remap.set(t.profile, other);
              continue;
            }
          }
          throw err;
        }
      }
      throw new Error(`task ${t.id}: step ${step}: too many rounds`);
    };

  };
}

/** The bus's policy at the timeline's scale (docs/policy.example.yaml's defaults, times scaled). */
function drillPolicy(scale: number): string {
  const d = (ms: number, least = 1) => `${Math.max(least, Math.round(ms * scale))}ms`;
  return [
    "retry:",
    `  initial_delay: ${d(1000)}`,
    `  max_delay: ${d(60_000)}`,
    `  episode_idle: ${d(600_000)}`,
    "classify:",
    `  quota_after: ${d(3_600_000)}`,
    "scope:",
    `  window: ${d(300_000)}`,
    `  recovery_min_time: ${d(120_000)}`,
    "recovery:",
    `  probe_interval: ${d(30_000, 100)}`,
    "",
  ].join("\n");
}

// ---------------------------------------------------------------------------
// Figures

function figures(o: DrillOptions, s: Strategy, log: LogRecord[], windows: Window[], completed: number, tasks: number,
  lostBy: Record<string, number>, seconds: number): Row {
  const scaleNs = (ms: number) => ms * 1e6; // timeline ms -> offset_ns
  const stallWindowNs = 120_000 * o.scale * 1e6;
  const isProbe = (r: LogRecord) => r.provider.endsWith(".probe");
  const wasted = { outage: 0, past_cap: 0, refused_resent: 0, nonretryable_retried: 0, total: 0, prompt_tokens: 0 };
  const capHit = new Set<string>();
  const refusedBy = new Set<string>();
  const nonRetryable = new Set<string>();
  for (const r of [...log].sort((a, b) => a.seq - b.seq)) {
    if (isProbe(r)) continue;
    const kind = r.fault ?? "";
    let waste: keyof typeof wasted | undefined;
    const sent = `${r.provider} ${r.key} ${r.fingerprint}`;
    if (OUTAGE_KINDS.has(kind)) waste = "outage";
    else if (kind === "quota") {
      if (capHit.has(r.key)) waste = "past_cap";
      capHit.add(r.key);
    } else if (kind === "refusal") {
      if (refusedBy.has(r.provider)) waste = "refused_resent";
      refusedBy.add(r.provider);
    }
    if (!waste && nonRetryable.has(sent)) waste = "nonretryable_retried";
    if (NONRETRYABLE_KINDS.has(kind)) nonRetryable.add(sent);
    if (waste) {
      wasted[waste]++;
      wasted.total++;
      wasted.prompt_tokens += r.tokens;
    }
  }
  const outages = windows.filter((w) => OUTAGE_KINDS.has(w.kind) && w.to !== Infinity);
  const recovered = outages.length ? Math.max(...outages.map((w) => w.to)) : undefined;
  let burst = 0;
  if (recovered !== undefined) {
    const from = scaleNs(recovered);
    const to = scaleNs(recovered + 60_000);
    const offsets = log.map((r) => r.offset_ns).filter((x) => x >= from && x < to).sort((a, b) => a - b);
    for (let i = 0, j = 0; i < offsets.length; i++) {
      while (j < offsets.length && offsets[j]! < offsets[i]! + scaleNs(1000)) j++;
      burst = Math.max(burst, j - i);
    }
  }
  return {
    strategy: s, label: LABELS[s], client: "typescript", tasks, completed, lost: tasks - completed, lost_by: lostBy,
    calls: log.length, probes: log.filter(isProbe).length, wasted,
    calls_per_completed_task: completed ? Math.round((log.length / completed) * 100) / 100 : null,
    burst_after_recovery: burst,
    hung_calls: log.filter((r) => r.duration_ns > 1.5 * stallWindowNs).length,
    seconds: Math.round(seconds * 10) / 10,
  };
}

/**
 * callChecks measures the `call` row's promises against the provider's log
 * and the bus's health records: an agent told wait_provider holds from that
 * moment until the bus says the provider recovered (or is healthy), and
 * every non-probe call it made in between is one it should not have made.
 */
async function callChecks(log: LogRecord[], windows: Window[], fleet: CallFleet, busURL: string, started: number): Promise<CallFigures> {
  const byName = new Map(windows.map((w) => [w.name, w]));
  const outage = (r: LogRecord) => !!r.window && OUTAGE_KINDS.has(byName.get(r.window)?.kind ?? "");
  const health = await healthSince(busURL, "openai", started);
  const back = (t: number) => health.find((h) => (h.state === "recovered" || h.state === "healthy") && h.at > t)?.at ?? Infinity;
  const holds = new Map([...fleet.waits].map(([agent, ts]) => [agent, ts.map((t): [number, number] => [t, back(t)])]));
  let whileHeld = 0;
  for (const r of log) {
    if (r.provider.endsWith(".probe")) continue;
    const agent = r.provider.slice(0, r.provider.lastIndexOf(".t"));
    const at = Date.parse(r.at);
    if ((holds.get(agent) ?? []).some(([from, to]) => at > from && at < to)) whileHeld++;
  }
  const declared = health.find((h) => h.state === "outage")?.at;
  return {
    calls_while_held: whileHeld,
    outage_calls_after_declared: declared === undefined ? 0
      : log.filter((r) => !r.provider.endsWith(".probe") && outage(r) && Date.parse(r.at) > declared).length,
    outage_declared_ms: declared === undefined ? null : declared - started,
    decisions: fleet.decisions,
  };
}

/** healthSince is provider's health records on the bus since since (ms), in order. */
async function healthSince(busURL: string, provider: string, since: number): Promise<{ at: number; state: string }[]> {
  const nc = await connect({ servers: busURL });
  try {
    const js = jetstream(nc);
    const c = await js.consumers.get("FAILBUS_HEALTH", { filter_subjects: Subject.health(provider), deliver_policy: DeliverPolicy.StartTime,
      opt_start_time: new Date(since).toISOString() });
    const info = await c.info(true);
    const out: { at: number; state: string }[] = [];
    if (info.num_pending === 0) return out;
    const batch = await c.fetch({ max_messages: info.num_pending, expires: 5000 });
    for await (const m of batch) {
      const h = decodeRecord<Health>(m.subject, m.headers?.get("Failbus-Schema") || undefined, m.data, Schema.health, ["provider", "state"], ["at"]);
      out.push({ at: h.at?.getTime() ?? 0, state: h.state });
      if (out.length === info.num_pending) break;
    }
    await c.delete().catch(() => false);
    return out;
  } finally {
    await nc.close();
  }
}

// ---------------------------------------------------------------------------
// The run

/** runStrategy runs the fleet one way against a chaos provider of its own. */
async function runStrategy(o: DrillOptions, s: Strategy, windows: Window[], dir: string, bus?: string): Promise<Row> {
  const endMs = Math.max(0, ...windows.map((w) => (w.to === Infinity ? w.from : w.to))) * o.scale;
  const chaos = await startChaos(failbusBinary(), o.timeline, o.scale, join(dir, `${s}.jsonl`));
  const started = Date.now();
  const deadline = AbortSignal.timeout(Math.round(endMs + o.graceMs));
  setMaxListeners(0, deadline); // every call in flight listens to it
  const agents = Array.from({ length: o.agents }, (_, i) => `${o.name}-${s}-a${i}`);
  o.progress(`drill: ${LABELS[s]}: ${o.agents} agents × ${o.tasks} tasks × ${o.steps} calls on ${chaos.url}, timeline ${(endMs / 1000).toFixed(1)}s`);
  const fleet: CallFleet = { agents: new Map(), waits: new Map(), decisions: {} };
  const nc = s === "call" ? await connect({ servers: bus! }) : undefined;
  try {
    let stepper: (agent: string) => StepRunner;
    if (s === "openai") stepper = openaiStepper(o, chaos.url, deadline);
    else if (s === "pi") stepper = piStepper(o, chaos.url, deadline);
    else {
      for (const a of agents) fleet.agents.set(a, new Agent(nc!, a, { onError: (err) => o.progress(`drill: ${a}: ${err.message}`) }));
      stepper = callStepper(o, chaos.url, deadline, fleet);
    }
    const { completed, tasks, lostBy } = await runFleet(o, agents, endMs * 0.8, deadline, stepper, LABELS[s]);
    const seconds = (Date.now() - started) / 1000;
    const log = await settledLog(chaos);
    const row = figures(o, s, log, windows, completed, tasks, lostBy, seconds);
    if (s === "call") row.call = await callChecks(log, windows, fleet, bus!, started);
    return row;
  } finally {
    await chaos.stop();
    await nc?.close();
  }
}

/** settledLog is the provider's log once every answer has ended (calls the deadline abandoned end at once). */
async function settledLog(chaos: Chaos): Promise<LogRecord[]> {
  const until = Date.now() + 5000;
  for (;;) {
    const log = await chaos.requests();
    if (log.every((r) => r.done) || Date.now() > until) return log;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** drill runs every strategy and returns the rows. */
export async function drill(o: DrillOptions): Promise<DrillResult> {
  const dir = mkdtempSync(join(tmpdir(), "failbus-ts-drill-"));
  const windows = await timelineWindows(failbusBinary(), o.timeline, o.scale, dir);
  let dev: Dev | undefined;
  let bus = o.server;
  if (o.strategies.includes("call") && !bus) {
    const pol = join(dir, "policy.yaml");
    writeFileSync(pol, drillPolicy(o.scale));
    dev = await startDev(["--policy", pol]);
    bus = dev.url;
  }
  try {
    const run = (s: Strategy) => runStrategy(o, s, windows, dir, bus);
    const rows = o.sequential ? await serially(o.strategies, run) : await Promise.all(o.strategies.map(run));
    return {
      client: "typescript", timeline: o.timeline, scale: o.scale, agents: o.agents, tasks_per_agent: o.tasks, steps: o.steps,
      stall_window_ms: Math.round(120_000 * o.scale), rows,
    };
  } finally {
    await dev?.stop();
  }
}

async function serially<T, R>(xs: readonly T[], f: (x: T) => Promise<R>): Promise<R[]> {
  const out: R[] = [];
  for (const x of xs) out.push(await f(x));
  return out;
}

/** table renders the rows as the drill prints them. */
export function table(r: DrillResult): string {
  const head = ["strategy", "tasks", "done", "lost", "calls", "calls/task", "wasted", "outage", "past cap", "refused re-sent",
    "non-retryable retried", "wasted tokens", "burst after recovery", "hung"];
  const lines = r.rows.map((x) => [x.label, x.tasks, x.completed, x.lost, x.calls, x.calls_per_completed_task ?? "-", x.wasted.total,
    x.wasted.outage, x.wasted.past_cap, x.wasted.refused_resent, x.wasted.nonretryable_retried, x.wasted.prompt_tokens,
    x.burst_after_recovery, x.hung_calls].map(String));
  const w = head.map((h, i) => Math.max(h.length, ...lines.map((l) => l[i]!.length)));
  const fmt = (l: string[]) => l.map((c, i) => (i === 0 ? c.padEnd(w[i]!) : c.padStart(w[i]!))).join("  ");
  const notes = r.rows.filter((x) => x.call).map((x) => {
    const c = x.call!;
    return `${x.label}: ${c.calls_while_held} calls to the provider while told to wait for it (probes aside); ` +
      `${c.outage_calls_after_declared} into the outage after the bus declared it ` +
      `(${c.outage_declared_ms === null ? "it never did" : `at ${(c.outage_declared_ms / 1000).toFixed(2)}s`}); decisions ` +
      Object.entries(c.decisions).map(([k, v]) => `${k} ${v}`).join(", ");
  });
  return [
    `${r.agents} agents × ${r.tasks_per_agent} tasks × ${r.steps} calls; timeline ${relative(repoRoot(), r.timeline)} at scale ${r.scale}; ` +
      `stall window ${r.stall_window_ms} ms`,
    fmt(head), ...lines.map(fmt), ...notes,
  ].join("\n");
}

/** defaults are the drill's options when no flag says otherwise. */
export function defaults(): DrillOptions {
  return {
    agents: 6, tasks: 5, steps: 4, timeline: join(repoRoot(), "testdata", "chaos", "drill.yaml"), scale: 0.01, graceMs: 10_000,
    strategies: [...STRATEGIES], sequential: false, marker: "[[refuse-me]]", teamKey: "sk-capped",
    progress: (l) => process.stderr.write(l + "\n"), name: `ts-drill-${process.pid}`,
  };
}

async function main(argv: string[]): Promise<number> {
  const o = defaults();
  let json = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    const v = () => {
      const x = argv[++i];
      if (x === undefined) throw new Error(`${a} needs a value`);
      return x;
    };
    switch (a) {
      case "--agents": o.agents = Number(v()); break;
      case "--tasks": o.tasks = Number(v()); break;
      case "--steps": o.steps = Number(v()); break;
      case "--timeline": o.timeline = v(); break;
      case "--scale": o.scale = Number(v()); break;
      case "--grace": o.graceMs = parseGoDuration(v()); break;
      case "--strategy": o.strategies = v().split(",").map((x) => x.trim()) as Strategy[]; break;
      case "--server": o.server = v(); break;
      case "--sequential": o.sequential = true; break;
      case "--json": json = true; break;
      case "-h": case "--help":
        process.stdout.write("usage: npm run drill -- [--agents N] [--tasks N] [--steps N] [--timeline FILE] [--scale F] [--grace D] " +
          "[--strategy openai,pi,call] [--server nats://…] [--sequential] [--json]\n");
        return 0;
      default:
        throw new Error(`unknown flag ${a}`);
    }
  }
  for (const s of o.strategies) if (!STRATEGIES.includes(s)) throw new Error(`unknown strategy ${s} (${STRATEGIES.join(", ")})`);
  if (!(o.agents >= 1 && o.tasks >= 1 && o.steps >= 1 && o.scale > 0)) throw new Error("--agents, --tasks, --steps and --scale must be positive");
  const r = await drill(o);
  process.stdout.write((json ? JSON.stringify(r, null, 2) : table(r)) + "\n");
  return 0;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).then((code) => process.exit(code), (err: Error) => {
    process.stderr.write(`drill: ${err.message}\n`);
    process.exit(1);
  });
}
