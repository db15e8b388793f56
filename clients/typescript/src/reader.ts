// Reading what the bus sends an agent, through JetStream consumers: due
// retries are written by JetStream's own scheduler and never reach a plain
// subscription, and a consumer lets an agent that was disconnected (or, in
// durable mode, restarted) pick up what it missed.

import type { NatsConnection } from "@nats-io/nats-core";
import {
  AckPolicy,
  type Consumer,
  type ConsumerMessages,
  DeliverPolicy,
  type JetStreamClient,
  JetStreamApiCodes,
  JetStreamApiError,
  type JetStreamManager,
  type JsMsg,
} from "@nats-io/jetstream";

import { HEADER_REQUEUE_FOR, HEADER_SCHEMA } from "./wire.js";

/**
 * Reader is a stream of records the bus sent this agent: iterate it with
 * `for await`, and close it (or break out of the loop) to stop. A durable
 * reader acknowledges each record once the loop has acted on it (when the
 * loop asks for the next one, or leaves); an ordered reader needs no
 * acknowledgements. Closing
 * waits until the server knows: an ordered consumer is deleted, a durable
 * one keeps its position and gets back (nak) what it had sent but the loop
 * never received, so the next reader of the same name sees it at once.
 */
export interface Reader<T> extends AsyncIterable<T> {
  /** The consumer's name on the server (for a durable, `agent-<name>-<kind>`). */
  readonly consumer: string;
  /**
   * close stops reading; the loop over the reader ends. A record the loop
   * still holds is acknowledged: close after the loop body is done with it.
   * Safe to call more than once.
   */
  close(): Promise<void>;
}

/** How long a hand-off may stay unacknowledged before the server redelivers it (durable mode). */
export const DURABLE_ACK_WAIT_MS = 30_000;

const nanos = (ms: number) => ms * 1_000_000;

export interface OpenReaderOptions<T> {
  js: JetStreamClient;
  jsm: JetStreamManager;
  nc: NatsConnection;
  stream: string;
  subject: string;
  kind: string;
  agent: string;
  /** The durable consumer's name; undefined for an ordered consumer. */
  durable?: string;
  start: Date;
  inactiveThresholdMs: number;
  decode: (subject: string, schemaHeader: string | undefined, data: Uint8Array) => T;
  onError: (err: Error) => void;
}

/** openReader starts a consumer on stream filtered on subject. */
export async function openReader<T>(o: OpenReaderOptions<T>): Promise<Reader<T>> {
  const where = `failbus agent ${o.agent}: ${o.kind} on ${o.stream}`;
  try {
    if (!o.durable) {
      const c = await o.js.consumers.get(o.stream, {
        // One subject as a string, not an array: nats.js then creates the
        // consumer on $JS.API.CONSUMER.CREATE.<stream>.<name>.<subject>,
        // the only form the users of `failbus auth init` may use (the
        // filter is in the subject, so a permission can bound it).
        filter_subjects: o.subject,
        deliver_policy: DeliverPolicy.StartTime,
        opt_start_time: o.start.toISOString(),
      });
      const msgs = await c.consume();
      return new ConsumerReader<T>(o, c, (await c.info(true)).name, msgs, false);
    }
    await ensureDurable(o);
    const c = await o.js.consumers.get(o.stream, o.durable);
    const msgs = await c.consume({ max_messages: 1 });
    return new ConsumerReader<T>(o, c, o.durable, msgs, true);
  } catch (err) {
    throw new Error(`${where}: open consumer: ${(err as Error).message}`, { cause: err });
  }
}

async function ensureDurable<T>(o: OpenReaderOptions<T>): Promise<void> {
  const name = o.durable!;
  try {
    await o.jsm.consumers.info(o.stream, name);
    return;
  } catch (err) {
    if (!(err instanceof JetStreamApiError && err.code === JetStreamApiCodes.ConsumerNotFound)) throw err;
  }
  try {
    await o.jsm.consumers.add(o.stream, {
      durable_name: name,
      description: `failbus agent ${o.agent}: ${o.kind}`,
      filter_subject: o.subject,
      deliver_policy: DeliverPolicy.StartTime,
      opt_start_time: o.start.toISOString(),
      ack_policy: AckPolicy.Explicit,
      ack_wait: nanos(DURABLE_ACK_WAIT_MS),
      max_ack_pending: 1,
      inactive_threshold: nanos(o.inactiveThresholdMs),
    });
  } catch (err) {
    // Another process of the same agent created it first: use theirs.
    await o.jsm.consumers.info(o.stream, name).catch(() => {
      throw err;
    });
  }
}

/** While the loop holds a message of a durable reader, the server is told every this many ms that it is still being worked on. */
export const HOLD_HEARTBEAT_MS = 10_000;

class ConsumerReader<T> implements Reader<T> {
  readonly consumer: string;
  private readonly it: AsyncIterator<JsMsg>;
  private closing = false;
  private closed?: Promise<void>;
  private beat?: NodeJS.Timeout;
  private held?: JsMsg;
  private lastAcked = 0;

  constructor(
    private readonly o: OpenReaderOptions<T>,
    private readonly c: Consumer,
    name: string,
    private readonly msgs: ConsumerMessages,
    private readonly ack: boolean,
  ) {
    this.consumer = name;
    this.it = msgs[Symbol.asyncIterator]();
    // When the connection closes, the reader ends too (and its consumer's
    // heartbeat monitor stops), even if nobody is waiting on the loop.
    void o.nc.closed().then(() => this.close());
  }

  async *[Symbol.asyncIterator](): AsyncIterator<T> {
    // A durable reader acknowledges a message once it has been acted on:
    // when the loop comes back for the next one, or leaves. Until then the
    // server is told it is in progress, so a slow loop body is not handed
    // the same message again, and a process that dies in the body gets it
    // redelivered (after AckWait) instead of losing it.
    try {
      for (;;) {
        await this.settle();
        let r: IteratorResult<JsMsg>;
        try {
          r = await this.it.next();
        } catch (err) {
          if (!this.closing) this.o.onError(new Error(`failbus agent ${this.o.agent}: read ${this.o.kind}: ${(err as Error).message}`, { cause: err }));
          return;
        }
        if (r.done) return;
        const m = r.value;
        if (this.closing) {
          if (this.ack) m.nak();
          continue;
        }
        if (this.ack && m.seq <= this.lastAcked) {
          m.ack(); // a redelivery of what the loop already acted on
          continue;
        }
        if (m.headers?.get(HEADER_REQUEUE_FOR)) {
          // A dead letter of a failbus service requeued for it (failbus
          // dlq requeue): this agent had the original already.
          if (this.ack) m.ack();
          continue;
        }
        let v: T;
        try {
          v = this.o.decode(m.subject, m.headers?.get(HEADER_SCHEMA) || undefined, m.data);
        } catch (err) {
          this.o.onError(new Error(`failbus agent ${this.o.agent}: undecodable message on ${m.subject}: ${(err as Error).message}`, { cause: err }));
          if (this.ack) m.term((err as Error).message.slice(0, 200));
          continue;
        }
        if (this.ack) {
          this.held = m;
          this.beat = setInterval(() => m.working(), HOLD_HEARTBEAT_MS);
          this.beat.unref();
        }
        yield v;
      }
    } finally {
      await this.settle();
      await this.close();
    }
  }

  /** settle acknowledges the message the loop held, now acted on. */
  private async settle(): Promise<void> {
    clearInterval(this.beat);
    const m = this.held;
    if (!m) return;
    this.held = undefined;
    try {
      await m.ackAck();
      this.lastAcked = Math.max(this.lastAcked, m.seq);
    } catch (err) {
      this.o.onError(new Error(`failbus agent ${this.o.agent}: ack ${m.subject} (stream seq ${m.seq}): ${(err as Error).message}`, { cause: err }));
    }
  }

  close(): Promise<void> {
    this.closed ??= this.stop();
    return this.closed;
  }

  private async stop(): Promise<void> {
    this.closing = true;
    // Closing ends the loop's work: the record it holds counts as acted on
    // (on a closed connection it cannot be: it is redelivered after AckWait).
    if (!this.o.nc.isClosed()) await this.settle();
    clearInterval(this.beat);
    this.msgs.stop();
    if (this.o.nc.isClosed()) return; // the server expires an ordered consumer itself
    if (!this.ack) {
      // An ephemeral consumer is deleted at once rather than left to expire.
      await this.c.delete().catch(() => false);
      return;
    }
    // Hand back what the server sent but the loop never received, so the
    // next reader of this durable gets it now instead of after AckWait.
    for (;;) {
      let r: IteratorResult<JsMsg>;
      try {
        r = await this.it.next();
      } catch {
        break;
      }
      if (r.done) break;
      r.value.nak();
    }
    await this.o.nc.flush().catch(() => {});
  }
}
