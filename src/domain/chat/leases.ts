import type { Hex } from "viem";
import { GatewayError } from "../errors.js";
import type { Billing, Ledger } from "./types.js";

/**
 * Reservation leases (docs/decisions.md, "Reservation leases"; migration 010): this process
 * takes credits of a permit and slots of an offer in bulk, and admits requests against them in
 * memory. Only taking more (an extension) or giving back touches the database, and a refusal
 * (`insufficient_credits`, `offer_at_capacity`) is always the database's: a request waits for
 * an extension, and is refused only when the database refuses to extend the lease by what the
 * request lacks. A leased request's record is written in a batch while its upstream call runs,
 * and its close moves its charge out of the lease in a batch. Requests that bring a quote or an
 * Idempotency-Key keep the per-request reservation (`durable`).
 *
 * Leases belong to a holder: an epoch of this process, heartbeated while it admits. If the
 * heartbeat fails for so long that other processes could take the epoch for dead (and release
 * its leases), admission against it stops before that can happen and a new epoch begins.
 */

export interface PermitLeaseRequest {
  readonly holder: string;
  readonly permitId: Hex;
  readonly need: bigint;
  readonly want: bigint;
  readonly deposit: bigint;
  readonly chainSettled: bigint;
}

export interface OfferLeaseRequest {
  readonly holder: string;
  readonly offerId: Hex;
  readonly need: number;
  readonly want: number;
  readonly maxConcurrency: number;
}

/** A leased request's record, as written while its upstream call runs. */
export interface LeasedRecord {
  readonly requestId: Hex;
  readonly apiKeyId: string;
  readonly holder: string;
  readonly model: string;
  readonly modelId: Hex;
  offerId: Hex;
  readonly permitId: Hex;
  readonly quoteId: Hex;
  readonly stream: boolean;
  maximumCredits: bigint;
  tariffVersion: bigint;
  readonly inputTokens: bigint;
  readonly createdAt: number;
}

export interface LeasedClose {
  readonly record: LeasedRecord;
  readonly status: "completed" | "failed" | "cancelled";
  readonly inputTokens: bigint;
  readonly outputTokens: bigint;
  readonly creditsCharged: bigint;
  readonly billing: Billing;
  readonly usageSource: "provider" | "gateway";
  readonly error?: string | undefined;
  readonly now: number;
}

/** The record write's progress, which the store updates and reads when it sends the batch. */
export interface OpenState {
  sent: boolean;
  skip: boolean;
  streaming: boolean;
}

/** adapters/pg/leases.ts. Each take/return is one transaction; record writes are batched. */
export interface LeaseStore {
  /**
   * Credits granted (at least `need`, at most `want`); 0: refused; -1: refused, but other
   * holders' leases hold enough that it may fit once they give back their idle part.
   */
  takePermit(r: PermitLeaseRequest): Promise<bigint>;
  takeOffer(r: OfferLeaseRequest): Promise<number>;
  /** Gives back part of a lease, or all of it ("all": whatever the database holds). */
  returnPermit(holder: string, permitId: Hex, credits: bigint | "all"): Promise<bigint>;
  returnOffer(holder: string, offerId: Hex, slots: number | "all"): Promise<number>;
  heartbeat(holder: string): Promise<void>;
  /** Writes the record unless `state.skip` is set before its batch is sent. */
  open(record: LeasedRecord, state: OpenState): Promise<void>;
  markStreaming(requestId: Hex): Promise<void>;
  close(close: LeasedClose): Promise<{ finalized: boolean; creditsCharged: bigint }>;
}

export interface LeaseOptions {
  readonly store: LeaseStore;
  /** The per-request ledger: durable requests, and every request not admitted here. */
  readonly fallback: Ledger;
  readonly instanceId: string;
  /** Unix seconds (records). */
  readonly clock: () => number;
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
}

interface Waiter {
  readonly amount: bigint;
  readonly take: (need: bigint, want: bigint) => Promise<bigint>;
  readonly resolve: (admitted: boolean) => void;
  readonly reject: (error: unknown) => void;
  timer?: NodeJS.Timeout;
}

/** A request refused before the database saw anything of it (backpressure). */
class LeaseWaitError extends Error {
  override readonly name = "LeaseWaitError";
  readonly sent = false;
}

interface LeasePool {
  readonly kind: "permit" | "offer";
  readonly id: Hex;
  readonly epoch: Epoch;
  granted: bigint;
  used: bigint;
  readonly queue: Waiter[];
  busy: boolean;
  lastActive: number;
  admittedInWindow: bigint;
  recent: bigint;
  expiresAt: number | undefined;
  /** An extension's outcome is unknown: the database may hold more than `granted`. */
  dirty: boolean;
  /** When a refusal last waited for other holders' idle leases (monotonic ms). */
  waitedAt: number;
}

interface Epoch {
  readonly holder: string;
  /** Monotonic ms of the last heartbeat that succeeded (sent at); undefined before the first. */
  beatSentAt: number | undefined;
  retired: boolean;
  readonly pools: Map<string, LeasePool>;
}

interface LeasedRequest {
  readonly record: LeasedRecord;
  readonly epoch: Epoch;
  permitPool: LeasePool;
  offerPool: LeasePool;
  readonly open: OpenState;
  readonly written: Promise<void>;
  closing: Promise<{ finalized: boolean; creditsCharged: bigint }> | undefined;
}

export interface LeasedLedger extends Ledger {
  /** Settles once the request's record write (if any is pending) has ended. */
  whenWritten(requestId: string): Promise<void>;
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
  const maxQueued = options.maxQueued ?? Number.POSITIVE_INFINITY;
  const requests = new Map<string, LeasedRequest>();
  const revoked = new Set<Hex>();
  const epochs: Epoch[] = [];
  let epochCount = 0;
  let beating: Promise<void> | undefined;
  let timer: NodeJS.Timeout | undefined;
  let ticking: Promise<void> | undefined;

  const newEpoch = (): Epoch => {
    const epoch: Epoch = {
      holder: `${options.instanceId}/lease-${++epochCount}`,
      beatSentAt: undefined,
      retired: false,
      pools: new Map(),
    };
    epochs.push(epoch);
    return epoch;
  };
  let current = newEpoch();

  const beat = (epoch: Epoch): Promise<void> => {
    beating ??= (async () => {
      const sentAt = mono();
      try {
        await store.heartbeat(epoch.holder);
        epoch.beatSentAt = sentAt;
      } finally {
        beating = undefined;
      }
    })();
    return beating;
  };

  /** The epoch admissions use now: a new one when the current could be taken for dead. */
  const admittingEpoch = async (): Promise<Epoch> => {
    const lapsed =
      current.beatSentAt !== undefined && mono() > current.beatSentAt + staleMs - marginMs;
    if (lapsed || current.retired) {
      current.retired = true;
      current = newEpoch();
    }
    if (current.beatSentAt === undefined) await beat(current);
    return current;
  };

  const poolOf = (epoch: Epoch, kind: LeasePool["kind"], id: Hex): LeasePool => {
    const key = `${kind}:${id}`;
    let pool = epoch.pools.get(key);
    if (pool === undefined) {
      pool = {
        kind,
        id,
        epoch,
        granted: 0n,
        used: 0n,
        queue: [],
        busy: false,
        lastActive: mono(),
        admittedInWindow: 0n,
        recent: 0n,
        expiresAt: undefined,
        dirty: false,
        waitedAt: Number.NEGATIVE_INFINITY,
      };
      epoch.pools.set(key, pool);
    }
    return pool;
  };

  const admit = (pool: LeasePool, amount: bigint): void => {
    pool.used += amount;
    pool.admittedInWindow += amount;
    pool.lastActive = mono();
  };

  /**
   * What an extension asks for beyond the head request's need: for credits about half a
   * second of the permit's recent demand, for slots a quarter of those in use. Not the whole
   * queue: a burst must not take everything from the other processes.
   */
  const headroom = (pool: LeasePool): bigint =>
    pool.kind === "permit" ? pool.recent * 2n : 1n + pool.used / 4n;

  const settle = (waiter: Waiter): Waiter => {
    if (waiter.timer !== undefined) clearTimeout(waiter.timer);
    return waiter;
  };

  const pump = async (pool: LeasePool): Promise<void> => {
    if (pool.busy) return;
    pool.busy = true;
    try {
      for (;;) {
        while (pool.queue.length > 0 && pool.granted - pool.used >= pool.queue[0]!.amount) {
          const waiter = settle(pool.queue.shift()!);
          admit(pool, waiter.amount);
          waiter.resolve(true);
        }
        const head = pool.queue[0];
        if (head === undefined) return;
        const need = head.amount - (pool.granted - pool.used);
        let granted: bigint;
        try {
          granted = await head.take(need, need + headroom(pool));
        } catch (error) {
          pool.dirty = true;
          for (const waiter of pool.queue.splice(0)) settle(waiter).reject(error);
          return;
        }
        if (granted > 0n) {
          pool.granted += granted;
        } else if (granted < 0n && mono() - pool.waitedAt > 2 * (idleMs + tickMs)) {
          // Other processes hold enough in leases: ask once more when their idle part is back
          // (once per window: a queue of requests does not wait once each).
          pool.waitedAt = mono();
          await new Promise((resolve) => setTimeout(resolve, idleMs + 2 * tickMs));
        } else if (pool.queue[0] === head) {
          // Refused: the head's need does not fit in what the database has left. (A head that
          // timed out meanwhile is gone; the next one gets its own answer.)
          settle(pool.queue.shift()!).resolve(false);
        }
      }
    } finally {
      pool.busy = false;
    }
  };

  const acquire = (pool: LeasePool, amount: bigint, take: Waiter["take"]): Promise<boolean> => {
    if (pool.queue.length === 0 && pool.granted - pool.used >= amount) {
      admit(pool, amount);
      return Promise.resolve(true);
    }
    if (pool.queue.length >= maxQueued) {
      return Promise.reject(new LeaseWaitError("too many requests are waiting for a lease"));
    }
    return new Promise<boolean>((resolve, reject) => {
      const waiter: Waiter = { amount, take, resolve, reject };
      if (options.maxWaitMs !== undefined) {
        waiter.timer = setTimeout(() => {
          const i = pool.queue.indexOf(waiter);
          if (i < 0) return;
          pool.queue.splice(i, 1);
          reject(new LeaseWaitError("the request waited too long for a lease"));
        }, options.maxWaitMs);
      }
      pool.queue.push(waiter);
      void pump(pool);
    });
  };

  const release = (pool: LeasePool, amount: bigint): void => {
    pool.used -= amount;
    pool.lastActive = mono();
    if (pool.queue.length > 0) void pump(pool);
  };

  /** A lease error: the request was not admitted (nothing of it reached the database). */
  const unavailable = (error: unknown) =>
    Object.assign(
      new GatewayError("database_unavailable", "the reservation lease could not be extended", {
        cause: error,
      }),
      { sent: false },
    );

  const permitClosing = (permitId: Hex) =>
    new GatewayError("permit_closing", `permit ${permitId} is closing; it admits no new request`);

  const reserve: Ledger["reserve"] = async (input) => {
    if (input.durable === true) return fallback.reserve(input);
    const permitId = input.permitId.toLowerCase() as Hex;
    if (revoked.has(permitId)) throw permitClosing(input.permitId);
    let epoch: Epoch;
    try {
      epoch = await admittingEpoch();
    } catch (error) {
      throw unavailable(error);
    }
    const offerPool = poolOf(epoch, "offer", input.offerId.toLowerCase() as Hex);
    const permitPool = poolOf(epoch, "permit", permitId);
    if (input.permitExpiresAt !== undefined) permitPool.expiresAt = input.permitExpiresAt;
    // Credits first, then the slot: a request waiting for an extension holds what it took,
    // and a slot held while waiting for credits would refuse others `offer_at_capacity`.
    let credits = false;
    let slot = false;
    try {
      credits = await acquire(permitPool, input.maximumCredits, (need, want) =>
        store.takePermit({
          holder: epoch.holder,
          permitId,
          need,
          want,
          deposit: input.deposit,
          chainSettled: input.chainSettled,
        }),
      );
      if (!credits) return { ok: false, reason: "insufficient_credits" };
      slot = await acquire(offerPool, 1n, async (need, want) =>
        BigInt(
          await store.takeOffer({
            holder: epoch.holder,
            offerId: offerPool.id,
            need: Number(need),
            want: Number(want),
            maxConcurrency: input.maxConcurrency,
          }),
        ),
      );
    } catch (error) {
      throw error instanceof GatewayError ? error : unavailable(error);
    } finally {
      if (credits && !slot) release(permitPool, input.maximumCredits);
    }
    if (!slot) return { ok: false, reason: "offer_at_capacity" };
    if (revoked.has(permitId)) {
      release(permitPool, input.maximumCredits);
      release(offerPool, 1n);
      throw permitClosing(input.permitId);
    }
    const record: LeasedRecord = {
      requestId: input.requestId,
      apiKeyId: input.apiKeyId,
      holder: epoch.holder,
      model: input.model,
      modelId: input.modelId,
      offerId: input.offerId,
      permitId: input.permitId,
      quoteId: input.quoteId,
      stream: input.stream,
      maximumCredits: input.maximumCredits,
      tariffVersion: input.tariffVersion,
      inputTokens: input.inputTokens,
      createdAt: input.now,
    };
    const open: OpenState = { sent: false, skip: false, streaming: false };
    // The record is best effort: a close writes the whole row when it is missing.
    const written = store.open(record, open).catch(() => undefined);
    requests.set(input.requestId, {
      record,
      epoch,
      permitPool,
      offerPool,
      open,
      written,
      closing: undefined,
    });
    return { ok: true };
  };

  const finalize: Ledger["finalize"] = async (input) => {
    const r = requests.get(input.requestId);
    if (r === undefined) return fallback.finalize(input);
    r.closing ??= (async () => {
      if (!r.open.sent) r.open.skip = true;
      else await r.written;
      return store.close({
        record: r.record,
        status: input.status,
        inputTokens: input.inputTokens,
        outputTokens: input.outputTokens,
        creditsCharged: input.creditsCharged,
        billing: input.billing,
        usageSource: input.usageSource,
        error: input.error,
        now: input.now,
      });
    })();
    let result: { finalized: boolean; creditsCharged: bigint };
    try {
      result = await r.closing;
    } catch (error) {
      r.closing = undefined; // the outbox tries again; the close is exactly-once
      throw error;
    }
    if (requests.delete(input.requestId)) {
      // The charge left the lease in the same transaction; the rest of the maximum is free.
      r.permitPool.granted -= result.creditsCharged;
      release(r.permitPool, r.record.maximumCredits);
      release(r.offerPool, 1n);
    }
    return result;
  };

  const markStreaming: Ledger["markStreaming"] = async (requestId) => {
    const r = requests.get(requestId);
    if (r === undefined) return fallback.markStreaming(requestId);
    if (
      r.epoch.retired &&
      r.epoch.beatSentAt !== undefined &&
      mono() > r.epoch.beatSentAt + staleMs
    ) {
      return false; // the others may have released this epoch's leases: stop serving
    }
    if (!r.open.sent) {
      r.open.streaming = true;
      return true;
    }
    await r.written;
    await store.markStreaming(requestId);
    return true;
  };

  const switchOffer: Ledger["switchOffer"] = async (input) => {
    const r = requests.get(input.requestId);
    if (r === undefined) return fallback.switchOffer(input);
    if (r.epoch.retired) return false;
    const next = poolOf(r.epoch, "offer", input.offerId.toLowerCase() as Hex);
    const take = async (need: bigint, want: bigint) =>
      BigInt(
        await store.takeOffer({
          holder: r.epoch.holder,
          offerId: next.id,
          need: Number(need),
          want: Number(want),
          maxConcurrency: input.maxConcurrency,
        }),
      );
    if (next !== r.offerPool && !(await acquire(next, 1n, take))) return false;
    const growth = input.maximumCredits - r.record.maximumCredits;
    if (growth > 0n) {
      const grown = await acquire(r.permitPool, growth, (need, want) =>
        store.takePermit({
          holder: r.epoch.holder,
          permitId: r.permitPool.id,
          need,
          want,
          deposit: input.deposit,
          chainSettled: input.chainSettled,
        }),
      );
      if (!grown) {
        if (next !== r.offerPool) release(next, 1n);
        return false;
      }
    } else if (growth < 0n) {
      release(r.permitPool, -growth);
    }
    if (next !== r.offerPool) release(r.offerPool, 1n);
    r.offerPool = next;
    r.record.offerId = input.offerId;
    r.record.maximumCredits = input.maximumCredits;
    r.record.tariffVersion = input.tariffVersion;
    return true;
  };

  /** Gives back what a pool does not use: all of it (the database's figure) when idle. */
  const giveBack = async (pool: LeasePool, all: boolean): Promise<void> => {
    pool.busy = true;
    try {
      const free = pool.granted - pool.used;
      if (all) {
        if (pool.kind === "permit") await store.returnPermit(pool.epoch.holder, pool.id, "all");
        else await store.returnOffer(pool.epoch.holder, pool.id, "all");
        pool.granted = 0n;
        pool.dirty = false;
      } else if (free > 0n) {
        const back =
          pool.kind === "permit"
            ? await store.returnPermit(pool.epoch.holder, pool.id, free)
            : BigInt(await store.returnOffer(pool.epoch.holder, pool.id, Number(free)));
        pool.granted -= back;
      }
    } finally {
      pool.busy = false;
      if (pool.queue.length > 0) void pump(pool);
    }
  };

  const tick = async (): Promise<void> => {
    const now = mono();
    if (current.beatSentAt !== undefined && now - current.beatSentAt >= heartbeatMs) {
      await beat(current).catch(() => undefined);
    }
    const nowSeconds = options.clock();
    const work: Promise<void>[] = [];
    for (const epoch of epochs) {
      for (const [key, pool] of epoch.pools) {
        pool.recent = pool.admittedInWindow;
        pool.admittedInWindow = 0n;
        if (pool.busy || pool.queue.length > 0) continue;
        const ended =
          epoch.retired ||
          (pool.kind === "permit" &&
            (revoked.has(pool.id) ||
              (pool.expiresAt !== undefined && pool.expiresAt <= nowSeconds)));
        const idle = now - pool.lastActive >= idleMs;
        if (pool.used === 0n && (ended || idle)) {
          if (pool.granted > 0n || pool.dirty) work.push(giveBack(pool, true));
          // Forgotten only when it holds nothing and nothing uses it (one pool per lease row).
          else if (ended || now - pool.lastActive >= 60_000) epoch.pools.delete(key);
        } else if (ended && pool.granted > pool.used) {
          work.push(giveBack(pool, false));
        }
      }
    }
    await Promise.allSettled(work);
    for (let i = epochs.length - 1; i >= 0; i--) {
      if (epochs[i]!.retired && epochs[i]!.pools.size === 0) epochs.splice(i, 1);
    }
  };

  return {
    reserve,
    finalize,
    markStreaming,
    switchOffer,
    recordOfferFlag: (input) => fallback.recordOfferFlag(input),
    whenWritten: (requestId) => requests.get(requestId)?.written ?? Promise.resolve(),
    revokePermit(permitId) {
      const id = permitId.toLowerCase() as Hex;
      revoked.add(id);
      for (const epoch of epochs) {
        const pool = epoch.pools.get(`permit:${id}`);
        if (pool === undefined) continue;
        for (const waiter of pool.queue.splice(0)) settle(waiter).reject(permitClosing(permitId));
      }
      void tick();
    },
    tick: () => (ticking ??= tick().finally(() => (ticking = undefined))),
    start() {
      if (timer !== undefined) return;
      timer = setInterval(() => {
        ticking ??= tick()
          .catch(() => undefined)
          .finally(() => (ticking = undefined));
      }, tickMs);
      timer.unref();
    },
    async stop() {
      if (timer !== undefined) clearInterval(timer);
      timer = undefined;
      await ticking;
      for (const epoch of epochs) epoch.retired = true;
      await tick();
    },
    held() {
      const permits = new Map<Hex, bigint>();
      const offers = new Map<Hex, bigint>();
      for (const epoch of epochs) {
        for (const pool of epoch.pools.values()) {
          const map = pool.kind === "permit" ? permits : offers;
          map.set(pool.id, (map.get(pool.id) ?? 0n) + pool.granted);
        }
      }
      return { permits, offers, holder: current.holder };
    },
  };
}
