// The router of `call`: it hands what the bus sends an agent to the calls
// waiting for it — a decision to the call that reported its outcome, a due
// retry to the call that waits for its retry id, a probe control to one
// call holding on its provider — and watches a provider's health for a
// held call. The TypeScript twin of Go's pkg/agent/router.go.
//
// It reads with ordered consumers of its own (so it never splits messages
// with a durable reader the agent runs beside it), opened the first time a
// call needs them and reading from that moment. What arrives before its
// waiter registers (a due retry of a zero delay) is kept for EARLY_FOR_MS.

import { type JetStreamClient, DeliverPolicy } from "@nats-io/jetstream";

import type { Reader } from "./reader.js";
import {
  type Control,
  type Decision,
  decodeRecord,
  HEADER_SCHEMA,
  type Health,
  type RetryDue,
  Schema,
  Stream,
  Subject,
} from "./wire.js";

/** How long a message nobody waits for yet is kept, in ms. */
export const EARLY_FOR_MS = 2 * 60_000;

/** The most messages kept for a waiter to come (decisions of outcomes reported outside call fill it). */
export const MAX_EARLY = 4096;

/** What the router needs of its Agent. */
export interface RouterDeps {
  agent: string;
  js: JetStreamClient;
  onError: (err: Error) => void;
  now: () => Date;
  /** Opens an ordered reader of subject on stream, from start. */
  read<T>(stream: string, subject: string, kind: string,
    decode: (subject: string, schemaHeader: string | undefined, data: Uint8Array) => T, start: Date): Promise<Reader<T>>;
}

interface Early {
  decision?: Decision;
  due?: RetryDue;
  at: number;
}

/** A wait the router resolves; cancel stops waiting (the registration is dropped). */
export interface Wait<T> {
  promise: Promise<T>;
  cancel(): void;
}

/** One call holding on a provider: it receives that provider's probe controls, one at a time. */
export interface Holder {
  /** next resolves with the next probe control for this holder. */
  next(): Promise<Control>;
  /** release unregisters the holder. */
  release(): void;
}

class HolderSlot implements Holder {
  pending?: Control;
  waiter?: (c: Control) => void;
  constructor(private readonly drop: (h: HolderSlot) => void) {}

  /** offer hands c over when the slot is free (a buffer of one, like Go's channel); false when full. */
  offer(c: Control): boolean {
    if (this.pending) return false;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = undefined;
      w(c);
    } else {
      this.pending = c;
    }
    return true;
  }

  next(): Promise<Control> {
    if (this.pending) {
      const c = this.pending;
      this.pending = undefined;
      return Promise.resolve(c);
    }
    return new Promise((resolve) => (this.waiter = resolve));
  }

  release(): void {
    this.waiter = undefined;
    this.drop(this);
  }
}

/** CallRouter: one per Agent, created by the Agent the first time call needs it. */
export class CallRouter {
  private started?: Promise<void>;
  private readers: Reader<unknown>[] = [];
  private readonly decisions = new Map<string, (d: Decision) => void>();
  private readonly dues = new Map<string, (r: RetryDue) => void>();
  private readonly probes = new Map<string, HolderSlot[]>();
  private readonly early = new Map<string, Early>();

  constructor(private readonly deps: RouterDeps) {}

  /**
   * start opens the readers once they open; a failure (the bus unreachable
   * for a moment) is tried again by the next call, not remembered.
   */
  start(): Promise<void> {
    this.started ??= this.open().catch(async (err: unknown) => {
      this.started = undefined;
      await Promise.all(this.readers.splice(0).map((r) => r.close().catch(() => {})));
      throw err;
    });
    return this.started;
  }

  private async open(): Promise<void> {
    const from = this.deps.now();
    const dec = <T>(schema: string, required: string[], times: string[]) =>
      (subject: string, h: string | undefined, data: Uint8Array) =>
        decodeRecord<T & object>(subject, h, data, schema, required as never[], times as never[]) as T;
    const specs = [
      { stream: Stream.decisions, subject: Subject.decision(this.deps.agent), kind: "call decisions",
        decode: dec<Decision>(Schema.decision, ["outcome_id", "agent", "action"], ["at", "due_at"]),
        deliver: (v: unknown) => this.decision(v as Decision) },
      { stream: Stream.retries, subject: Subject.retryDue(this.deps.agent), kind: "call retries",
        decode: dec<RetryDue>(Schema.retryDue, ["retry_id", "agent"], ["due_at"]),
        deliver: (v: unknown) => this.due(v as RetryDue) },
      { stream: Stream.control, subject: Subject.control(this.deps.agent), kind: "call controls",
        decode: dec<Control>(Schema.control, ["agent", "action"], ["at", "scheduled_at"]),
        deliver: (v: unknown) => this.control(v as Control) },
    ];
    for (const s of specs) {
      const r = await this.deps.read<unknown>(s.stream, s.subject, s.kind, s.decode, from);
      this.readers.push(r);
      void (async () => {
        for await (const v of r) s.deliver(v);
      })().catch((err: Error) => this.deps.onError(new Error(`failbus agent ${this.deps.agent}: ${s.kind}: ${err.message}`, { cause: err })));
    }
  }

  /** close stops the readers (the Agent's connection closing stops them too). */
  async close(): Promise<void> {
    await Promise.all(this.readers.map((r) => r.close()));
  }

  private decision(d: Decision): void {
    const w = this.decisions.get(d.outcome_id);
    if (w) {
      this.decisions.delete(d.outcome_id);
      w(d);
      return;
    }
    this.keep("d:" + d.outcome_id, { decision: d, at: 0 });
  }

  private due(r: RetryDue): void {
    const w = this.dues.get(r.retry_id);
    if (w) {
      this.dues.delete(r.retry_id);
      w(r);
      return;
    }
    this.keep("r:" + r.retry_id, { due: r, at: 0 });
  }

  /** control hands a probe to the first call holding on its provider that is not busy with one; other controls are the agent's own business (controls()). */
  private control(c: Control): void {
    if (c.action !== "probe" || !c.provider) return;
    for (const h of this.probes.get(c.provider) ?? []) {
      if (h.offer(c)) return;
    }
  }

  private keep(key: string, e: Early): void {
    const now = Date.now();
    if (this.early.size >= MAX_EARLY) {
      for (const [k, v] of this.early) {
        if (now - v.at > EARLY_FOR_MS || this.early.size >= MAX_EARLY) this.early.delete(k);
      }
    }
    e.at = now;
    this.early.set(key, e);
  }

  private take(key: string): Early | undefined {
    const e = this.early.get(key);
    if (!e) return undefined;
    this.early.delete(key);
    return Date.now() - e.at > EARLY_FOR_MS ? undefined : e;
  }

  /** awaitDecision waits for the decision on outcome id; register before reporting the outcome. */
  awaitDecision(id: string): Wait<Decision> {
    const e = this.take("d:" + id);
    if (e?.decision) return { promise: Promise.resolve(e.decision), cancel: () => {} };
    let resolve!: (d: Decision) => void;
    const promise = new Promise<Decision>((r) => (resolve = r));
    this.decisions.set(id, resolve);
    return { promise, cancel: () => this.decisions.get(id) === resolve && this.decisions.delete(id) };
  }

  /** awaitDue waits for the due retry retryId. */
  awaitDue(retryId: string): Wait<RetryDue> {
    const e = this.take("r:" + retryId);
    if (e?.due) return { promise: Promise.resolve(e.due), cancel: () => {} };
    let resolve!: (r: RetryDue) => void;
    const promise = new Promise<RetryDue>((r) => (resolve = r));
    this.dues.set(retryId, resolve);
    return { promise, cancel: () => this.dues.get(retryId) === resolve && this.dues.delete(retryId) };
  }

  /** hold registers a holder of provider for its probe controls, after the holders already there. */
  hold(provider: string): Holder {
    const h = new HolderSlot((slot) => {
      const hs = (this.probes.get(provider) ?? []).filter((x) => x !== slot);
      if (hs.length) this.probes.set(provider, hs);
      else this.probes.delete(provider);
    });
    this.probes.set(provider, [...(this.probes.get(provider) ?? []), h]);
    return h;
  }

  /**
   * inOutage reports whether provider's latest health record on the bus
   * says outage (read with a short-lived ordered consumer of its own: the
   * server's latest, not a copy that may lag a decision).
   */
  async inOutage(provider: string): Promise<boolean> {
    const where = `failbus agent ${this.deps.agent}: read the health of ${provider}`;
    let c;
    try {
      c = await this.deps.js.consumers.get(Stream.health, {
        filter_subjects: Subject.health(provider),
        deliver_policy: DeliverPolicy.LastPerSubject,
      });
    } catch (err) {
      throw new Error(`${where}: ${(err as Error).message}`, { cause: err });
    }
    try {
      const info = await c.info(true);
      if (info.num_pending === 0) return false; // no health record: never in an outage
      const m = await c.next({ expires: 5000 });
      if (!m) return false;
      try {
        const h = decodeRecord<Health>(m.subject, m.headers?.get(HEADER_SCHEMA) || undefined, m.data, Schema.health, ["provider", "state"], ["at"]);
        return h.state === "outage";
      } catch {
        return false;
      }
    } finally {
      await c.delete().catch(() => false);
    }
  }

  /**
   * waitHealthy resolves once provider's health on the bus says recovered
   * or healthy: its latest record first (a recovery that came before the
   * hold), then each new one. It reads FAILBUS_HEALTH with an ordered
   * consumer of its own, deleted when the wait ends; it rejects with the
   * signal's reason when the signal aborts.
   */
  async waitHealthy(provider: string, signal: AbortSignal): Promise<Health> {
    signal.throwIfAborted();
    const where = `failbus agent ${this.deps.agent}: read the health of ${provider}`;
    let c;
    try {
      c = await this.deps.js.consumers.get(Stream.health, {
        // One subject as a string: the consumer is created on a subject
        // that names its filter, which the agent role may use.
        filter_subjects: Subject.health(provider),
        deliver_policy: DeliverPolicy.LastPerSubject,
      });
    } catch (err) {
      throw new Error(`${where}: ${(err as Error).message}`, { cause: err });
    }
    const msgs = await c.consume();
    const stop = () => msgs.stop();
    signal.addEventListener("abort", stop, { once: true });
    try {
      for await (const m of msgs) {
        let h: Health;
        try {
          h = decodeRecord<Health>(m.subject, m.headers?.get(HEADER_SCHEMA) || undefined, m.data, Schema.health, ["provider", "state"], ["at"]);
        } catch (err) {
          this.deps.onError(new Error(`failbus agent ${this.deps.agent}: health of ${provider}: ${(err as Error).message}`, { cause: err }));
          continue;
        }
        if (h.state === "recovered" || h.state === "healthy") return h;
      }
      signal.throwIfAborted();
      throw new Error(`${where}: the reader ended`);
    } finally {
      signal.removeEventListener("abort", stop);
      msgs.stop();
      await c.delete().catch(() => false);
    }
  }
}
