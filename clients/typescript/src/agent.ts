// Agent: one agent instance's connection to failbus, the TypeScript twin of
// Go's pkg/agent. It reports what the agent saw (outcomes, boundaries,
// heartbeats, cron and write records, tasks) and reads what the bus sends
// back (decisions, due retries, dispatches, controls).

import { headers, nuid, type NatsConnection } from "@nats-io/nats-core";
import { jetstream, type JetStreamClient, type JetStreamManager, jetstreamManager } from "@nats-io/jetstream";

import { openReader, type Reader } from "./reader.js";
import { requestRoute, type RouteAnswer } from "./route.js";
import { CallRouter } from "./router.js";
import {
  type Boundary,
  CONTENT_TYPE_MSGPACK,
  type Control,
  type CronRun,
  type CronSpec,
  CURRENT_VERSION,
  type Decision,
  decodeRecord,
  type Dispatch,
  encodeRecord,
  FieldError,
  HEADER_CONTENT_TYPE,
  HEADER_MSG_ID,
  HEADER_SCHEMA,
  type Heartbeat,
  type Outcome,
  type RetryDue,
  Schema,
  Stream,
  Subject,
  segmentKey,
  type Task,
  toDate,
  token as tokenName,
  type Write,
} from "./wire.js";

/** How long the server keeps an agent's durable consumers after it last read: 7 days, as long as the streams keep decisions. */
export const DURABLE_INACTIVE_THRESHOLD_MS = 7 * 24 * 60 * 60 * 1000;

/** Options of an Agent. */
export interface AgentOptions {
  /**
   * Keep the read position on the server, in durable consumers named
   * `agent-<name>-<kind>` (kind: decisions, retries, dispatch, control),
   * so what was published while the process was down is delivered when an
   * Agent with the same name reads again; the first time, reading starts at
   * the moment the Agent was created. They expire 7 days after the last
   * read. Default false: ordered consumers starting when the Agent was
   * created, surviving reconnects but not a restart of the process.
   */
  durable?: boolean;
  /**
   * Receives errors that happen while reading: a message that does not
   * decode (terminated in durable mode, so it is not redelivered) or a
   * consumer that failed. Default: ignored.
   */
  onError?: (err: Error) => void;
  /** The clock used to fill a missing `at` and to choose where reading starts. Default: the system clock. */
  now?: () => Date;
  /** How long to wait for the route service's answer, in ms. Default 5000. */
  routeTimeoutMs?: number;
}

/** An Outcome as Agent.report takes it: id, agent and at are filled when absent. */
export type OutcomeInput = Omit<Outcome, "id" | "agent"> & { id?: string; agent?: string };

/** A stored Outcome, as Agent.report returns it (id, agent and at set). */
export type ReportedOutcome = Outcome & { at: Date };

/**
 * Agent is one agent instance's connection to failbus. It is safe to use
 * from many async tasks at once. Each reading method opens its own consumer:
 * call each once per Agent (in durable mode two readers of one kind would
 * split the messages between them).
 */
export class Agent {
  readonly name: string;
  readonly nc: NatsConnection;
  private readonly js: JetStreamClient;
  private jsm?: Promise<JetStreamManager>;
  private readonly opts: Required<Omit<AgentOptions, "durable">> & { durable: boolean };
  /** When the Agent was created: where non-durable (and first durable) reading starts. */
  readonly created: Date;
  private router?: CallRouter;

  /**
   * Creates an Agent called name (the agent instance id that goes into every
   * record's `agent` field and into the subjects it reads) on nc. The caller
   * keeps owning nc and closes it after closing the Agent's readers.
   */
  constructor(nc: NatsConnection, name: string, opts: AgentOptions = {}) {
    if (!nc) throw new Error("failbus agent: no NATS connection");
    if (!name) throw new Error("failbus agent: empty name");
    this.nc = nc;
    this.name = name;
    this.opts = {
      durable: opts.durable ?? false,
      onError: opts.onError ?? (() => {}),
      now: opts.now ?? (() => new Date()),
      routeTimeoutMs: opts.routeTimeoutMs ?? 5000,
    };
    this.js = jetstream(nc);
    this.created = this.opts.now();
  }

  /**
   * report publishes the outcome of one LLM call and waits for JetStream to
   * store it. It fills id (a new unique id), agent and at when absent and
   * returns the outcome as stored: reporting the returned outcome again after
   * an error (a lost acknowledgement) is safe, the stream keeps one copy.
   */
  async report(o: OutcomeInput): Promise<ReportedOutcome> {
    const out = {
      ...o,
      id: o.id || nuid.next(),
      agent: o.agent || this.name,
      at: toDate(o.at ?? this.opts.now(), Schema.outcome, "at"),
    } as ReportedOutcome;
    validateOutcome(out);
    await this.publish(Subject.outcome(out.provider, out.agent), Schema.outcome, out, out.id);
    return out;
  }

  /**
   * boundary reports that a new context segment starts (compaction, fresh
   * start, model, tool-surface or prompt change): the refusal tiers start
   * afresh. One boundary per (agent, session, segment) is kept.
   */
  async boundary(b: Boundary): Promise<void> {
    const rec = { ...b, agent: b.agent || this.name, at: toDate(b.at ?? this.opts.now(), Schema.boundary, "at") };
    need(Schema.boundary, rec, ["agent", "session"]);
    await this.publish(Subject.segment(rec.agent), Schema.boundary, rec,
      `boundary:${rec.agent}:${segmentKey(rec.session, rec.segment)}`);
  }

  /**
   * heartbeat reports that a subagent is alive (running) or has ended (done,
   * failed); agent and at are filled when absent. One record per (subagent,
   * at, status) is kept however often it is sent (Nats-Msg-Id as pkg/agent).
   */
  async heartbeat(h: Heartbeat): Promise<void> {
    const rec = this.fill(Schema.heartbeat, h);
    need(Schema.heartbeat, rec, ["agent", "subagent"]);
    oneOf(Schema.heartbeat, "status", rec.status, ["running", "done", "failed"]);
    if (rec.interval_ms !== undefined && !(rec.interval_ms >= 0)) throw new FieldError(Schema.heartbeat, "interval_ms", "negative");
    await this.publish(Subject.heartbeat(rec.agent), Schema.heartbeat, rec,
      `hb:${rec.agent}:${rec.subagent}:${nanos(rec.at)}:${rec.status || "running"}`);
  }

  /** cronSpec declares a cron and its schedule, so recovery can tell which runs an outage made it miss. */
  async cronSpec(c: CronSpec): Promise<void> {
    const rec = this.fill(Schema.cronSpec, c);
    need(Schema.cronSpec, rec, ["agent", "cron", "schedule"]);
    oneOf(Schema.cronSpec, "catchup", rec.catchup, ["latest", "all", "none"]);
    await this.publish(Subject.cronSpec(rec.agent), Schema.cronSpec, rec, `cron-spec:${rec.agent}:${rec.cron}:${nanos(rec.at)}`);
  }

  /**
   * cronRun reports one run of a cron for one scheduled time: started, then
   * ok or failed (only an ok run keeps recovery from re-running that time).
   * One record per (cron, scheduled time, status) is kept.
   */
  async cronRun(r: CronRun): Promise<void> {
    const rec = { ...this.fill(Schema.cronRun, r), scheduled_at: toDate(r.scheduled_at, Schema.cronRun, "scheduled_at") };
    need(Schema.cronRun, rec, ["agent", "cron", "status"]);
    oneOf(Schema.cronRun, "status", rec.status, ["started", "ok", "failed"]);
    await this.publish(Subject.cronRun(rec.agent), Schema.cronRun, rec,
      `cron-run:${rec.agent}:${rec.cron}:${rec.scheduled_at.getTime()}:${rec.status}`);
  }

  /** write reports one memory write and whether it reached its store. */
  async write(w: Write): Promise<void> {
    const rec = this.fill(Schema.write, w);
    need(Schema.write, rec, ["agent", "key"]);
    await this.publish(Subject.write(rec.agent), Schema.write, rec, `write:${rec.agent}:${rec.key}:${nanos(rec.at)}`);
  }

  /**
   * task submits work for a provider: dispatched back to the agent
   * (dispatches) at once while the provider is healthy, held during an
   * outage and released after recovery, never dropped. The id (filled when
   * absent) is the Nats-Msg-Id, so submitting the returned task again is
   * safe. It returns the task as stored.
   */
  async task(t: Task): Promise<Task & { id: string; agent: string; at: Date }> {
    const rec = { ...this.fill(Schema.task, t), id: t.id || nuid.next() };
    need(Schema.task, rec, ["id", "agent"]);
    await this.publish(Subject.task(rec.provider ?? "", rec.agent), Schema.task, rec, rec.id);
    return rec;
  }

  /**
   * started tells the scheduler that the agent started the due retry
   * retryId, so the ledger shows the wait really ended. The budget was spent
   * when the retry was scheduled, before the wait: a crash never refunds it.
   */
  async started(retryId: string): Promise<void> {
    await this.retryMark(Subject.retryStarted(this.name), Schema.retryStarted, retryId);
  }

  /**
   * cancel tells the scheduler the agent no longer wants the pending retry
   * retryId: its schedule is purged, no due retry arrives, and it stays
   * counted in its budget.
   */
  async cancel(retryId: string): Promise<void> {
    await this.retryMark(Subject.retryCancel(this.name), Schema.retryCancel, retryId);
  }

  /**
   * decisions reads what the bus decides for this agent
   * (failbus.decision.<agent> on FAILBUS_DECISIONS), in order, from when the
   * Agent was created (durable: from where this agent name last stopped).
   * In durable mode a decision is acknowledged once the loop has acted on
   * it (asks for the next one, or leaves).
   */
  decisions(): Promise<Reader<Decision>> {
    return this.read(Stream.decisions, Subject.decision(this.name), "decisions", (subj, h, d) =>
      decodeAs<Decision>(subj, h, d, Schema.decision, ["outcome_id", "agent", "action"], ["at", "due_at"]));
  }

  /**
   * dueRetries reads this agent's retries as they come due
   * (failbus.retry.due.<agent> on FAILBUS_RETRIES). JetStream's scheduler
   * writes them, which a plain subscription never sees: this is the only
   * way to get them. After acting on one call started (or cancel).
   */
  dueRetries(): Promise<Reader<RetryDue>> {
    return this.read(Stream.retries, Subject.retryDue(this.name), "retries", (subj, h, d) =>
      decodeAs<RetryDue>(subj, h, d, Schema.retryDue, ["retry_id", "agent"], ["due_at"]));
  }

  /** dispatches reads the tasks released to this agent (failbus.dispatch.<agent>), attempt 1 or a redispatch. */
  dispatches(): Promise<Reader<Dispatch>> {
    return this.read(Stream.dispatch, Subject.dispatch(this.name), "dispatch", (subj, h, d) =>
      decodeAs<Dispatch>(subj, h, d, Schema.dispatch, ["task_id", "agent", "attempt"], ["at"]));
  }

  /** controls reads recovery's commands to this agent (kill, run_cron, check_write, probe). */
  controls(): Promise<Reader<Control>> {
    return this.read(Stream.control, Subject.control(this.name), "control", (subj, h, d) =>
      decodeAs<Control>(subj, h, d, Schema.control, ["agent", "action"], ["at", "scheduled_at"]));
  }

  /**
   * route asks the refusal tiers which of providers, in order, may receive
   * the segment `<session>#<segment>` now; send to the first of allowed.
   * Ask before every call: a due re-probe is claimed by the answer that
   * allows it, and asking never moves a refusal clock.
   */
  route(session: string, segment: number, providers: string[]): Promise<RouteAnswer> {
    return requestRoute(this.nc, { agent: this.name, session, segment, providers }, { timeoutMs: this.opts.routeTimeoutMs });
  }

  /**
   * callRouter is the router `call` uses: its own ordered readers of this
   * agent's decisions, due retries and controls, opened the first time a
   * call needs them. Not for applications: use call.
   */
  callRouter(): CallRouter {
    this.router ??= new CallRouter({
      agent: this.name,
      js: this.js,
      onError: this.opts.onError,
      now: this.opts.now,
      read: (stream, subject, kind, decode, start) => this.read(stream, subject, kind, decode, { ordered: true, start }),
    });
    return this.router;
  }

  /** onError reports an error that happened away from any caller (a reader's, a probe's report). */
  get onError(): (err: Error) => void {
    return this.opts.onError;
  }

  /** durableName is the durable consumer's name for a kind, as operators see it in `nats consumer ls`. */
  static durableName(agent: string, kind: string): string {
    return `agent-${tokenName(agent)}-${kind}`;
  }

  private fill<T extends { agent?: string; at?: unknown }>(schema: string, r: T): T & { agent: string; at: Date } {
    return { ...r, agent: r.agent || this.name, at: toDate((r.at ?? this.opts.now()) as Date, schema, "at") };
  }

  private async read<T>(stream: string, subject: string, kind: string,
    decode: (subject: string, schemaHeader: string | undefined, data: Uint8Array) => T,
    o: { ordered?: boolean; start?: Date } = {}): Promise<Reader<T>> {
    // checkAPI false: no account-info request ($JS.API.INFO), which the
    // agent user of `failbus auth init` may not make; the consumer calls
    // below say clearly enough when JetStream is missing.
    this.jsm ??= jetstreamManager(this.nc, { checkAPI: false });
    return openReader<T>({
      js: this.js, jsm: await this.jsm, nc: this.nc, stream, subject, kind, agent: this.name,
      durable: this.opts.durable && !o.ordered ? Agent.durableName(this.name, kind) : undefined,
      start: o.start ?? this.created, inactiveThresholdMs: DURABLE_INACTIVE_THRESHOLD_MS, decode, onError: this.opts.onError,
    });
  }

  private async retryMark(subject: string, schema: string, retryId: string): Promise<void> {
    if (!retryId) throw new Error(`failbus agent ${this.name}: ${schema}: empty retry id`);
    await this.publish(subject, schema, { retry_id: retryId, agent: this.name, at: this.opts.now() }, `${schema}:${retryId}`);
  }

  private async publish(subject: string, schema: string, rec: object, msgID?: string): Promise<void> {
    const h = headers();
    h.set(HEADER_SCHEMA, `${schema}/${CURRENT_VERSION}`);
    h.set(HEADER_CONTENT_TYPE, CONTENT_TYPE_MSGPACK);
    if (msgID) h.set(HEADER_MSG_ID, msgID);
    try {
      await this.js.publish(subject, encodeRecord(rec), { headers: h, ...(msgID ? { msgID } : {}) });
    } catch (err) {
      throw new Error(`failbus agent ${this.name}: publish ${schema} to ${subject}: ${(err as Error).message}`, { cause: err });
    }
  }
}

function decodeAs<T extends object>(subject: string, schemaHeader: string | undefined, data: Uint8Array,
  schema: string, required: (keyof T & string)[], times: (keyof T & string)[]): T {
  return decodeRecord<T>(subject, schemaHeader, data, schema, required, times);
}

/** Epoch nanoseconds of d, as Go's UnixNano: the message ids match pkg/agent's. */
const nanos = (d: Date): string => (BigInt(d.getTime()) * 1_000_000n).toString();

function need(record: string, rec: object, fields: string[]): void {
  const r = rec as Record<string, unknown>;
  for (const f of fields) {
    if (r[f] === undefined || r[f] === null || (typeof r[f] === "string" && (r[f] as string).trim() === "")) {
      throw new FieldError(record, f, "required");
    }
  }
}

function oneOf(record: string, field: string, v: string | undefined, allowed: string[]): void {
  if (v !== undefined && v !== "" && !allowed.includes(v)) {
    throw new FieldError(record, field, `${JSON.stringify(v)} is not ${allowed.join(", ")}`);
  }
}

/** validateOutcome checks what the bus requires of an Outcome (it would dead-letter the rest). */
export function validateOutcome(o: Outcome): void {
  need(Schema.outcome, o, ["id", "agent", "provider"]);
  const ints: (keyof Outcome)[] = ["segment", "turn", "step", "status", "request_tokens", "context_window", "max_output_tokens"];
  for (const f of ints) {
    const v = o[f];
    if (v !== undefined && !Number.isInteger(v)) throw new FieldError(Schema.outcome, f, `${String(v)} is not an integer`);
  }
  if (o.status !== undefined && (o.status < 0 || o.status > 999)) {
    throw new FieldError(Schema.outcome, "status", `${o.status} is not an HTTP status (0 when none)`);
  }
  oneOf(Schema.outcome, "refusal_scope", o.refusal_scope, ["increment", "history"]);
  for (const f of ["request_tokens", "context_window", "max_output_tokens"] as const) {
    if ((o[f] ?? 0) < 0) throw new FieldError(Schema.outcome, f, "negative");
  }
  if (o.headers) {
    for (const [k, v] of Object.entries(o.headers)) {
      if (typeof v !== "string") throw new FieldError(Schema.outcome, "headers", `${k}: values are strings`);
    }
  }
}
