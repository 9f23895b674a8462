import type { Hex } from "viem";
import { reserve, switchOffer } from "./admission.js";
import { finalize, markStreaming } from "./closes.js";
import { Epochs } from "./epochs.js";
import { createPools } from "./pool.js";
import { LeaseReturns } from "./returns.js";
import { permitClosing, type LeaseState } from "./state.js";
import type { LeaseSignals, LeaseStore } from "./store.js";
import { LeaseTicker, tick } from "./ticks.js";
import type { Ledger } from "../chat/ports.js";

/**
 * Reservation leases (docs/decisions/chat-quotes-and-money.md, "Reservation leases"; migration 010): this process
 * takes credits of a permit and slots of an offer in bulk, and admits requests against them in
 * memory. Only taking more (an extension) or giving back touches the database, and a refusal
 * (`insufficient_credits`, `offer_at_capacity`) is always the database's: a request waits for
 * an extension, and is refused only when the database refuses to extend the lease by what the
 * request lacks. A leased request's record is written in a batch while its upstream call runs,
 * and its close moves its charge out of the lease in a batch. Requests that bring a quote or an
 * Idempotency-Key keep the per-request reservation (`durable`), and so do requests capped by
 * their authorization's total (`capped`).
 *
 * Leases belong to a holder: an epoch of this process, heartbeated while it admits, retired
 * before others could take it for dead (epochs.ts). Each lease is a pool of this process
 * (pool.ts); what a pool does not use goes back when idle or recalled (returns.ts).
 *
 * This module composes the parts over one shared state (state.ts): admission
 * (admission.ts), closes (closes.ts) and the ticks that heartbeat the epochs and
 * give back what is idle (ticks.ts).
 */

export interface LeaseOptions {
  readonly store: LeaseStore;
  /** The per-request ledger: durable requests, and every request not admitted here. */
  readonly fallback: Ledger;
  readonly instanceId: string;
  /** Unix seconds (records). */
  readonly clock: () => number;
  /**
   * Unix seconds a permit's expiry is judged by (`PermitClock.now`: the later of the gateway's
   * clock and the chain's latest block time); default `clock`.
   */
  readonly permitClock?: () => number;
  /** Milliseconds, monotonic (lease timing); default performance.now. */
  readonly monotonicMs?: () => number;
  /** Other processes take a holder silent this long for dead (the orphan rule; default 60). */
  readonly staleAfterSeconds?: number;
  readonly heartbeatMs?: number;
  /** A lease unused this long is given back (default 1000). */
  readonly idleMs?: number;
  readonly tickMs?: number;
  /** Requests waiting per lease for an extension before more are refused (503, backpressure). */
  readonly maxQueued?: number | undefined;
  /** How long a request may wait for an extension before it is refused (503, not admitted). */
  readonly maxWaitMs?: number | undefined;
  /**
   * Lease recall between processes (LISTEN/NOTIFY on PostgreSQL); without it (one process)
   * a refusal other holders could cover waits once per window for their idle give-back.
   */
  readonly signals?: LeaseSignals | undefined;
}

export interface LeasedLedger extends Ledger {
  /** Settles once the request's record write (if any is pending) has ended. */
  whenWritten(requestId: string): Promise<void>;
  /** Settles once the record writes pending now have ended. */
  whenAllWritten(): Promise<void>;
  /** A permit's close was requested: admit nothing more on it, give its leases back at once. */
  revokePermit(permitId: Hex): void;
  /** One round of heartbeat, idle return and epoch checks (the timer calls it). */
  tick(): Promise<void>;
  start(): void;
  /** Stops the timer and gives every lease back (after the requests have closed). */
  stop(): Promise<void>;
  /** For tests and metrics: what this process holds. */
  held(): { permits: Map<Hex, bigint>; offers: Map<Hex, bigint>; holder: string };
}

export function createLeasedLedger(options: LeaseOptions): LeasedLedger {
  const { store, fallback } = options;
  const mono = options.monotonicMs ?? (() => performance.now());
  const staleMs = (options.staleAfterSeconds ?? 60) * 1000;
  const heartbeatMs = options.heartbeatMs ?? Math.min(5_000, staleMs / 6);
  // Admission stops this long before the others could release the epoch's leases.
  const marginMs = staleMs / 4;
  const idleMs = options.idleMs ?? 1_000;
  const tickMs = options.tickMs ?? 250;
  const signals = options.signals;
  const pools = createPools({
    mono,
    idleMs,
    tickMs,
    maxQueued: options.maxQueued ?? Number.POSITIVE_INFINITY,
    maxWaitMs: options.maxWaitMs,
    recall: signals === undefined ? undefined : (pool) => signals.recall(`${pool.kind}:${pool.id}`),
    // Near the end of a permit's credits (an offer's slots), what a closing request frees goes
    // back at once: the database, not this process's idle lease, decides the next request.
    onFree: (pool) => {
      if (!pool.busy) void returns.giveBack(pool, false);
    },
  });
  const epochs = new Epochs({ instanceId: options.instanceId, store, mono, staleMs, marginMs });
  const returns = new LeaseReturns({ store, epochs, pools, signals });
  const s: LeaseState = {
    store,
    fallback,
    mono,
    staleMs,
    heartbeatMs,
    idleMs,
    permitClock: options.permitClock ?? options.clock,
    signals,
    pools,
    epochs,
    returns,
    requests: new Map(),
    revoked: new Set(),
  };
  const ticker = new LeaseTicker(s, tickMs);

  signals?.onRecall((key) => void returns.answerRecall(key));

  return {
    reserve: (input) => reserve(s, input),
    finalize: (input) => finalize(s, input),
    // A request admitted here is closed through its lease; any other reservation is the
    // per-request ledger's.
    voidReservation: async (reservation, close) =>
      s.requests.has(reservation.requestId) || fallback.voidReservation === undefined
        ? finalize(s, close)
        : fallback.voidReservation(reservation, close),
    markStreaming: (requestId) => markStreaming(s, requestId),
    switchOffer: (input) => switchOffer(s, input),
    recordOfferFlag: (input) => fallback.recordOfferFlag(input),
    whenWritten: (requestId) => s.requests.get(requestId)?.written ?? Promise.resolve(),
    whenAllWritten: async () =>
      void (await Promise.all([...s.requests.values()].map((r) => r.written))),
    revokePermit(permitId) {
      const id = permitId.toLowerCase() as Hex;
      s.revoked.add(id);
      for (const epoch of epochs.all) {
        const pool = epoch.pools.get(`permit:${id}`);
        if (pool === undefined) continue;
        pools.rejectAll(pool, permitClosing(permitId));
      }
      void tick(s);
    },
    tick: () => ticker.tick(),
    start: () => ticker.start(),
    stop: () => ticker.stop(),
    held() {
      const permits = new Map<Hex, bigint>();
      const offers = new Map<Hex, bigint>();
      for (const epoch of epochs.all) {
        for (const pool of epoch.pools.values()) {
          const map = pool.kind === "permit" ? permits : offers;
          map.set(pool.id, (map.get(pool.id) ?? 0n) + pool.granted);
        }
      }
      return { permits, offers, holder: epochs.current.holder };
    },
  };
}
