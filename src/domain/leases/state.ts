import type { Hex } from "viem";
import { GatewayError } from "../errors.js";
import type { Epoch, Epochs } from "./epochs.js";
import type { LeasePool, Pools } from "./pool.js";
import type { LeaseReturns } from "./returns.js";
import type { LeasedRecord, LeaseSignals, LeaseStore, OpenState } from "./store.js";
import type { Ledger } from "../chat/ports.js";

/**
 * What the parts of the leased ledger (leases.ts) share: its deps and settings, its epochs,
 * pools and give-backs, and the requests admitted through a lease (admission.ts), closed
 * through it (closes.ts) and kept alive by its ticks (ticks.ts).
 */

export interface LeasedRequest {
  readonly record: LeasedRecord;
  readonly epoch: Epoch;
  permitPool: LeasePool;
  offerPool: LeasePool;
  readonly open: OpenState;
  readonly written: Promise<void>;
  closing: Promise<{ finalized: boolean; creditsCharged: bigint }> | undefined;
  /** Its offer slot, held until the provider is done with it (the close starts). */
  slotHeld: boolean;
}

export interface LeaseState {
  readonly store: LeaseStore;
  /** The per-request ledger: durable requests, and every request not admitted here. */
  readonly fallback: Ledger;
  /** Milliseconds, monotonic (lease timing). */
  readonly mono: () => number;
  /** Other processes take a holder silent this long for dead (the orphan rule). */
  readonly staleMs: number;
  readonly heartbeatMs: number;
  /** A lease unused this long is given back. */
  readonly idleMs: number;
  /** Unix seconds a permit's expiry is judged by. */
  readonly permitClock: () => number;
  readonly signals: LeaseSignals | undefined;
  readonly pools: Pools;
  readonly epochs: Epochs;
  readonly returns: LeaseReturns;
  /** The requests admitted through a lease and not closed yet, by request id. */
  readonly requests: Map<string, LeasedRequest>;
  /** Permits whose close was requested: they admit nothing more. */
  readonly revoked: Set<Hex>;
}

/** The epoch's pool of a permit or an offer: one per lease row. */
export function poolOf(s: LeaseState, epoch: Epoch, kind: LeasePool["kind"], id: Hex): LeasePool {
  const key = `${kind}:${id}`;
  let pool = epoch.pools.get(key);
  if (pool === undefined) {
    pool = s.pools.newPool(kind, id, epoch.holder);
    epoch.pools.set(key, pool);
  }
  return pool;
}

export function permitClosing(permitId: Hex): GatewayError {
  return new GatewayError(
    "permit_closing",
    `permit ${permitId} is closing; it admits no new request`,
  );
}
