// The failbus wire contract (docs/CONTRACT.md "On the bus", "Recovery"):
// the record types with their snake_case keys, the msgpack codec, the
// headers and the subject names. Field names are the contract's, unchanged,
// so a record here reads like its table in CONTRACT.md.

import { decode, encode } from "@msgpack/msgpack";

/** A time as an agent may give it: a Date, epoch milliseconds, or RFC 3339. */
export type TimeInput = Date | number | string;

/** What kind of work made an LLM call, so recovery can find it. */
export interface Origin {
  kind?: "chat" | "cron" | "subagent" | "task" | (string & {});
  name?: string;
  parent?: string;
}

/** The raw result of one LLM call (CONTRACT.md "Outcome"). */
export interface Outcome {
  /** Unique per call attempt; becomes Nats-Msg-Id. Filled by Agent.report when empty. */
  id: string;
  /** When the call ended. Filled with now by Agent.report when absent. */
  at?: TimeInput;
  /** The agent instance; filled with the Agent's name when empty. */
  agent: string;
  session?: string;
  segment?: number;
  turn?: number;
  step?: number;
  provider: string;
  model?: string;
  profile?: string;
  ok?: boolean;
  /** HTTP status; 0 when no response arrived. */
  status?: number;
  /** Response body exactly as received. */
  body?: string;
  /** Response headers, lower-case names. */
  headers?: Record<string, string>;
  /** Error text when no response arrived or the stream broke. */
  transport_error?: string;
  /** A code another library assigned; a hint only. */
  upstream_code?: string;
  /** For a 200 that did not answer: refusal, content_filter, … */
  stop_reason?: string;
  refusal_scope?: "increment" | "history";
  request_tokens?: number;
  context_window?: number;
  max_output_tokens?: number;
  origin?: Origin;
}

/** A new context segment (compaction, fresh start, model or prompt change). */
export interface Boundary {
  at?: TimeInput;
  agent?: string;
  session: string;
  segment: number;
  reason?: string;
}

/** Actions of a Decision (CONTRACT.md). */
export type Action =
  | "retry"
  | "switch_profile"
  | "switch_model"
  | "switch_provider"
  | "rerender"
  | "skip_provider"
  | "wait_provider"
  | "compact"
  | "give_up";

/** What the bus tells an agent to do about one outcome. */
export interface Decision {
  outcome_id: string;
  at?: Date;
  agent: string;
  action: Action;
  reason?: string;
  class?: string;
  /** The classification rule that decided class: what an agent hands its caller with a decision it cannot carry out itself. */
  rule?: string;
  delay_ms?: number;
  due_at?: Date;
  /** 1-based retry number. */
  retry?: number;
  retry_id?: string;
  provider?: string;
  model?: string;
  profile?: string;
}

/** A scheduled retry that came due. */
export interface RetryDue {
  retry_id: string;
  outcome_id: string;
  agent: string;
  retry: number;
  due_at?: Date;
}

/** Provider health states (failbus.health.<provider>). */
export type HealthState = "healthy" | "degraded" | "outage" | "recovered";

/** A provider's health change, as the scheduler publishes it. */
export interface Health {
  at?: Date;
  provider: string;
  state: HealthState | (string & {});
  reason?: string;
}

/** A subagent's liveness (CONTRACT.md "Recovery"). */
export interface Heartbeat {
  at?: TimeInput;
  agent?: string;
  subagent: string;
  session?: string;
  provider?: string;
  model?: string;
  task_id?: string;
  status?: "running" | "done" | "failed";
  /** How often the subagent promises a heartbeat; default 10000. */
  interval_ms?: number;
}

/** A cron's schedule. */
export interface CronSpec {
  at?: TimeInput;
  agent?: string;
  cron: string;
  /** 5-field cron expression, or "@every <Go duration>". */
  schedule: string;
  timezone?: string;
  provider?: string;
  catchup?: "latest" | "all" | "none";
  /** A Go duration string, e.g. "6h". */
  catchup_window?: string;
}

/** One run of a cron for one scheduled time. */
export interface CronRun {
  at?: TimeInput;
  agent?: string;
  cron: string;
  scheduled_at: TimeInput;
  status: "started" | "ok" | "failed";
  provider?: string;
}

/** One memory write and whether it reached its store. */
export interface Write {
  at?: TimeInput;
  agent?: string;
  key: string;
  ok?: boolean;
  error?: string;
  provider?: string;
}

/** Work submitted through the bus: held while its provider is down. */
export interface Task {
  /** Also the Nats-Msg-Id; filled when empty. */
  id?: string;
  at?: TimeInput;
  agent?: string;
  provider?: string;
  kind?: string;
  /** Any value; passed through to the Dispatch untouched. */
  payload?: unknown;
}

/** A task released to its agent. */
export interface Dispatch {
  task_id: string;
  attempt: number;
  at?: Date;
  agent: string;
  provider?: string;
  kind?: string;
  payload?: unknown;
  reason?: string;
}

/** A recovery command to one agent. */
export interface Control {
  at?: Date;
  agent: string;
  action: "kill" | "run_cron" | "check_write" | "probe" | (string & {});
  reason?: string;
  recovery_id?: string;
  subagent?: string;
  task_id?: string;
  cron?: string;
  scheduled_at?: Date;
  key?: string;
  provider?: string;
}

/** A notification request (failbus.notify.<severity>). */
export interface Notification {
  dedupe_key: string;
  severity: "info" | "normal" | "critical";
  title?: string;
  text?: string;
  labels?: Record<string, string>;
  at?: TimeInput;
}

/** Schema names of the Failbus-Schema header. */
export const Schema = {
  outcome: "outcome",
  boundary: "boundary",
  decision: "decision",
  retryDue: "retry_due",
  heartbeat: "heartbeat",
  cronSpec: "cron_spec",
  cronRun: "cron_run",
  write: "write",
  task: "task",
  dispatch: "dispatch",
  control: "control",
  notification: "notification",
  retryStarted: "retry_started",
  retryCancel: "retry_cancel",
  health: "health",
} as const;

/** The version this client writes for every schema. */
export const CURRENT_VERSION = 1;

export const HEADER_SCHEMA = "Failbus-Schema";
export const HEADER_CONTENT_TYPE = "Content-Type";
export const CONTENT_TYPE_MSGPACK = "application/msgpack";
export const HEADER_MSG_ID = "Nats-Msg-Id";
/**
 * Set on a dead letter of a failbus service requeued for that service
 * (`failbus dlq requeue`): an agent had the original already and skips it.
 */
export const HEADER_REQUEUE_FOR = "Failbus-Requeue-For";

/** Streams the agent reads from (jetstream/ in the repository). */
export const Stream = {
  decisions: "FAILBUS_DECISIONS",
  retries: "FAILBUS_RETRIES",
  dispatch: "FAILBUS_DISPATCH",
  control: "FAILBUS_CONTROL",
  health: "FAILBUS_HEALTH",
} as const;

/** Request-reply subject of the refusal tiers' route service. */
export const REFUSAL_ROUTE_SUBJECT = "failbus.refusal.route";

/**
 * token makes s safe as one subject token: every character outside
 * A-Za-z0-9_- becomes "_" (one per character, as the Go side does per rune);
 * an empty name becomes "_". The payload keeps the real name.
 */
export function token(s: string): string {
  if (s === "") return "_";
  let out = "";
  for (const ch of s) {
    out += /^[A-Za-z0-9_-]$/.test(ch) ? ch : "_";
  }
  return out;
}

const join = (prefix: string, ...tokens: string[]): string =>
  [prefix, ...tokens.map(token)].join(".");

/** Subjects, built in one place (as pkg/events/subject.go does). */
export const Subject = {
  outcome: (provider: string, agent: string) => join("failbus.outcome", provider, agent),
  segment: (agent: string) => join("failbus.segment", agent),
  decision: (agent: string) => join("failbus.decision", agent),
  retryDue: (agent: string) => join("failbus.retry.due", agent),
  retryStarted: (agent: string) => join("failbus.retry.started", agent),
  retryCancel: (agent: string) => join("failbus.retry.cancel", agent),
  heartbeat: (agent: string) => join("failbus.heartbeat", agent),
  cronSpec: (agent: string) => join("failbus.cron.spec", agent),
  cronRun: (agent: string) => join("failbus.cron.run", agent),
  write: (agent: string) => join("failbus.write", agent),
  task: (provider: string, agent: string) => join("failbus.task", provider, agent),
  dispatch: (agent: string) => join("failbus.dispatch", agent),
  control: (agent: string) => join("failbus.control", agent),
  notify: (severity: string) => join("failbus.notify", severity),
  classified: (provider: string, cls: string) => join("failbus.classified", provider, cls),
  health: (provider: string) => join("failbus.health", provider),
} as const;

/** The context-segment key `<session>#<segment>`. */
export const segmentKey = (session: string, segment: number): string => `${session}#${segment}`;

/**
 * FieldError names the field that makes a record unusable, so the error says
 * what to fix (the bus would dead-letter it with the same reason).
 */
export class FieldError extends Error {
  constructor(
    readonly record: string,
    readonly field: string,
    readonly problem: string,
  ) {
    super(`invalid ${record}: field "${field}": ${problem}`);
    this.name = "FieldError";
  }
}

// Epoch milliseconds of years 0001–9999, the range the bus accepts.
const MIN_MS = -62135596800000;
const MAX_MS = 253402300799999;

/** toDate reads a TimeInput; it throws a FieldError naming field when unusable. */
export function toDate(v: TimeInput, record: string, field: string): Date {
  let d: Date;
  if (v instanceof Date) d = v;
  else if (typeof v === "number") {
    if (!Number.isInteger(v)) throw new FieldError(record, field, `${v} is not an integer of epoch milliseconds`);
    d = new Date(v);
  } else if (typeof v === "string") {
    d = /^-?\d+$/.test(v) ? new Date(Number(v)) : new Date(v);
  } else throw new FieldError(record, field, `a time must be a Date, epoch milliseconds or RFC 3339, got ${typeof v}`);
  const ms = d.getTime();
  if (Number.isNaN(ms)) throw new FieldError(record, field, `${JSON.stringify(String(v))} is not a time`);
  if (ms < MIN_MS || ms > MAX_MS) throw new FieldError(record, field, `${ms} epoch milliseconds is out of range`);
  return d;
}

/** encodeRecord is the msgpack payload of a record: undefined keys are left out. */
export function encodeRecord(v: object): Uint8Array {
  return encode(v, { ignoreUndefined: true });
}

/** A decoded bus message was not the record its subject carries. */
export class DecodeError extends Error {
  constructor(
    readonly subject: string,
    message: string,
  ) {
    super(`${subject}: ${message}`);
    this.name = "DecodeError";
  }
}

/**
 * decodeRecord reads a message of the subject's type: the Failbus-Schema
 * header, when present, must name schema (a subject carries one type), the
 * payload must be a msgpack map, and the required fields must be there.
 * Times (msgpack timestamps, epoch ms, RFC 3339) become Dates.
 */
export function decodeRecord<T extends object>(
  subject: string,
  schemaHeader: string | undefined,
  data: Uint8Array,
  schema: string,
  required: (keyof T & string)[],
  times: (keyof T & string)[] = [],
): T {
  if (schemaHeader) {
    const [name, ver] = schemaHeader.trim().split("/");
    if (name !== schema) {
      throw new DecodeError(subject, `header ${HEADER_SCHEMA} "${schemaHeader}" names a ${name}, but the subject carries ${schema}`);
    }
    if (ver !== undefined && !(Number(ver) >= 1 && Number(ver) <= CURRENT_VERSION)) {
      throw new DecodeError(subject, `${schema} version ${ver} is not readable here (up to ${CURRENT_VERSION})`);
    }
  }
  let v: unknown;
  try {
    v = decode(data);
  } catch (err) {
    throw new DecodeError(subject, `payload is not msgpack: ${(err as Error).message}`);
  }
  if (v === null || typeof v !== "object" || Array.isArray(v) || v instanceof Uint8Array) {
    throw new DecodeError(subject, "payload is not a msgpack map");
  }
  const rec = v as Record<string, unknown>;
  for (const f of required) {
    if (rec[f] === undefined || rec[f] === null || rec[f] === "") {
      throw new DecodeError(subject, `invalid ${schema}: field "${f}": required`);
    }
  }
  for (const f of times) {
    const t = rec[f];
    if (t !== undefined && t !== null && !(t instanceof Date)) {
      try {
        rec[f] = toDate(t as TimeInput, schema, f);
      } catch (err) {
        throw new DecodeError(subject, (err as Error).message);
      }
    }
  }
  return rec as unknown as T;
}
