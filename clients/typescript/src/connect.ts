// Connecting as one of the users `failbus auth init` writes (one nkey seed
// per role: auth/agent.nk, or auth/agent-<name>.nk for a single agent).

import { readFileSync } from "node:fs";

import { nkeyAuthenticator, type NatsConnection } from "@nats-io/nats-core";
import { fromSeed } from "@nats-io/nkeys";
import { connect, type NodeConnectionOptions } from "@nats-io/transport-node";

/** What connectAs needs besides the usual connection options. */
export interface ConnectAsOptions extends NodeConnectionOptions {
  /** The user's nkey seed ("SU…"), as text or bytes. */
  seed?: string | Uint8Array;
  /** A file holding the seed (what `failbus auth init` writes); used when seed is not given. */
  seedFile?: string;
}

/**
 * inboxPrefixFor is the only inbox a failbus user may read replies on:
 * `_INBOX.<public key of its seed>` (docs/DEPLOY.md, "Replies"), so no
 * role reads another's JetStream API answers or route replies.
 */
export function inboxPrefixFor(seed: string | Uint8Array): string {
  // A copy: clear() below wipes the bytes the key pair was made from.
  const kp = fromSeed(seedBytes(seed).slice());
  try {
    return `_INBOX.${kp.getPublicKey()}`;
  } finally {
    kp.clear();
  }
}

/**
 * connectAs connects as a failbus user: it signs in with the user's nkey
 * seed and sets the inbox prefix that user may read. Without that prefix
 * every request under the users of `failbus auth init` (each JetStream API
 * call, the refusal route) goes unanswered and times out.
 */
export async function connectAs(opts: ConnectAsOptions): Promise<NatsConnection> {
  const { seed, seedFile, ...rest } = opts;
  let s: string | Uint8Array;
  if (seed !== undefined) s = seed;
  else if (seedFile !== undefined) {
    try {
      s = readFileSync(seedFile, "utf8");
    } catch (err) {
      throw new Error(`failbus: read the nkey seed ${seedFile}: ${(err as Error).message}`, { cause: err });
    }
  } else throw new Error("failbus: connectAs needs seed or seedFile (a user of `failbus auth init`, e.g. auth/agent.nk)");
  const bytes = seedBytes(s);
  let prefix: string;
  try {
    prefix = inboxPrefixFor(bytes);
  } catch (err) {
    throw new Error(`failbus: ${seedFile ?? "the seed"} is not a user nkey seed: ${(err as Error).message}`, { cause: err });
  }
  return connect({ ...rest, authenticator: nkeyAuthenticator(bytes), inboxPrefix: prefix });
}

function seedBytes(seed: string | Uint8Array): Uint8Array {
  return typeof seed === "string" ? new TextEncoder().encode(seed.trim()) : seed;
}
