// The refusal route: ask the refusal tiers (a NATS micro service on
// failbus.refusal.route, JSON both ways) which providers may receive a
// context segment now. Mirrors Go's agent.RequestRoute.

import { errors, type NatsConnection } from "@nats-io/nats-core";

import { REFUSAL_ROUTE_SUBJECT, segmentKey } from "./wire.js";

/** A route request: the segment `<session>#<segment>` and the providers to choose from, in order. */
export interface RouteRequest {
  agent: string;
  session: string;
  segment: number;
  providers: string[];
  /** Answer without claiming a due re-probe (operators' tools). Default false. */
  peek?: boolean;
}

/** A provider the segment must not be sent to now. */
export interface RouteSkip {
  provider: string;
  /** Why, in the words the notification and the model are told. */
  reason: string;
  /** When it may be re-probed; absent when frozen. */
  next_probe_at?: Date;
  /** Frozen for this segment until a boundary. */
  frozen?: boolean;
}

/** The route service's answer. */
export interface RouteAnswer {
  at: Date;
  agent: string;
  session: string;
  segment: number;
  /** Providers that may receive the segment now, in the order asked; send to the first. */
  allowed: string[];
  skipped: RouteSkip[];
}

/**
 * RouteUnavailableError: no route service answered (no responders). What to
 * do is the agent's choice; the conservative answer is the last route
 * answer, or the provider least likely to refuse.
 */
export class RouteUnavailableError extends Error {
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "RouteUnavailableError";
  }
}

/** RouteServiceError: the service answered with an error: code "400" for a request it cannot use, "500" when it cannot read or write refusal state. */
export class RouteServiceError extends Error {
  constructor(
    readonly code: string,
    readonly description: string,
  ) {
    super(`failbus route service error ${code}: ${description}`);
    this.name = "RouteServiceError";
  }
}

/**
 * requestRoute asks the route service on nc, for any caller (a tool, an
 * agent without an Agent). agent and providers are required: the service
 * answers a request without them with a RouteServiceError, code "400".
 */
export async function requestRoute(nc: NatsConnection, r: RouteRequest, opts: { timeoutMs?: number } = {}): Promise<RouteAnswer> {
  const where = `failbus route ${segmentKey(r.session, r.segment)}`;
  let msg;
  try {
    msg = await nc.request(REFUSAL_ROUTE_SUBJECT, JSON.stringify(r), { timeout: opts.timeoutMs ?? 5000 });
  } catch (err) {
    if (err instanceof errors.RequestError && err.isNoResponders()) {
      throw new RouteUnavailableError(`${where}: refusal route service not reachable on ${REFUSAL_ROUTE_SUBJECT}`, { cause: err });
    }
    if (err instanceof errors.NoRespondersError) {
      throw new RouteUnavailableError(`${where}: refusal route service not reachable on ${REFUSAL_ROUTE_SUBJECT}`, { cause: err });
    }
    throw new Error(`${where}: request ${REFUSAL_ROUTE_SUBJECT}: ${(err as Error).message}`, { cause: err });
  }
  const code = msg.headers?.get("Nats-Service-Error-Code");
  if (code) throw new RouteServiceError(code, msg.headers?.get("Nats-Service-Error") ?? "");
  type Wire = Omit<RouteAnswer, "at" | "skipped"> & { at: string; skipped: (Omit<RouteSkip, "next_probe_at"> & { next_probe_at?: string })[] | null };
  let a: Wire;
  try {
    a = msg.json();
  } catch (err) {
    throw new Error(`${where}: decode route answer: ${(err as Error).message}`, { cause: err });
  }
  return {
    ...a,
    at: new Date(a.at),
    allowed: a.allowed ?? [],
    skipped: (a.skipped ?? []).map(({ next_probe_at, ...rest }) => ({
      ...rest,
      ...(next_probe_at ? { next_probe_at: new Date(next_probe_at) } : {}),
    })),
  };
}
