import type { Hex } from "viem";
import { BaseError } from "../base-error.js";

/**
 * The in-memory side of one reservation lease (leases.ts): what this process holds of a
 * permit's credits or an offer's slots (`granted`), what its open requests use of it (`used`),
 * and the requests waiting for an extension, served in order by one extension at a time.
 */

export interface Waiter {
  readonly amount: bigint;
  readonly take: (need: bigint, want: bigint) => Promise<bigint>;
  readonly resolve: (admitted: boolean) => void;
  readonly reject: (error: unknown) => void;
  timer?: NodeJS.Timeout;
  /** Recalls this request has made (other holders asked to give back their idle part). */
  recalls?: number;
}

/** A request refused before the database saw anything of it (backpressure). */
export class LeaseWaitError extends BaseError {
  readonly reason = "lease_wait_timeout";
  override readonly name = "LeaseWaitError";
  readonly sent = false;
}

export interface LeasePool {
  readonly kind: "permit" | "offer";
  readonly id: Hex;
  /** The lease epoch (a gateway_instances row) that holds it in the database. */
  readonly holder: string;
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
  /** A give-back in flight: what it returns has left `granted` but is not in the database yet. */
  returning?: Promise<void> | undefined;
  /** When a refusal last waited for other holders' idle leases (monotonic ms). */
  waitedAt: number;
  /**
   * Until then (monotonic ms) the lease is near the end of what the database has left (low
   * water): an extension asks for exactly what the request lacks, and what a closing request
   * frees goes back at once, so each request is in effect admitted at the database.
   */
  scarceUntil: number;
  /** Requests whose close (the charge's commit) is under way: their credits are still used. */
  settling: number;
  /** Waiting for one of those closes to end. */
  readonly settled: (() => void)[];
}

export interface PoolOptions {
  /** Milliseconds, monotonic. */
  readonly mono: () => number;
  /** A lease unused this long is given back (leases.ts ticks every `tickMs`). */
  readonly idleMs: number;
  readonly tickMs: number;
  readonly maxQueued: number;
  readonly maxWaitMs: number | undefined;
  /**
   * Asks the other holders of this lease to give back their idle part, and resolves when one
   * of them answers (or after a bound). Without it (one process, PGlite) a refusal that other
   * holders' leases could cover waits once per window for their idle give-back instead.
   */
  readonly recall?: ((pool: LeasePool) => Promise<void>) | undefined;
  /** A scarce lease has a free part (a request closed): give it back now. */
  readonly onFree?: ((pool: LeasePool) => void) | undefined;
  /** How long a lease stays scarce after the database could not grant what it asked. */
  readonly scarceMs?: number | undefined;
}

/** Recalls (or waits for closes) one waiting request may make before a refusal stands. */
const maxRecalls = 3;
/** The longest wait for a close of ours under way before the database is asked again. */
const settleWaitMs = 1_000;

export interface Pools {
  newPool(kind: LeasePool["kind"], id: Hex, holder: string): LeasePool;
  /** Admits `amount` against the lease, extending it through `take` when it lacks; false: refused. */
  acquire(pool: LeasePool, amount: bigint, take: Waiter["take"]): Promise<boolean>;
  release(pool: LeasePool, amount: bigint): void;
  /** The lease is near its end (another holder needs it): see `LeasePool.scarceUntil`. */
  markScarce(pool: LeasePool): void;
  /** A request's close has started / ended (its charge committed, or left to the outbox). */
  closeStarted(pool: LeasePool): void;
  closeEnded(pool: LeasePool): void;
  /** Resolves when a close under way on the pool ends (at once when none is; or after `ms`). */
  whenSettled(pool: LeasePool, ms: number): Promise<void>;
  /** Serves the queue (after a give-back, say). */
  pump(pool: LeasePool): Promise<void>;
  /** Refuses every waiting request with `error`. */
  rejectAll(pool: LeasePool, error: unknown): void;
}

/** A new, empty lease of `holder` (nothing granted, nothing used), last active `now`. */
function newPool(kind: LeasePool["kind"], id: Hex, holder: string, now: number): LeasePool {
  return {
    kind,
    id,
    holder,
    granted: 0n,
    used: 0n,
    queue: [],
    busy: false,
    lastActive: now,
    admittedInWindow: 0n,
    recent: 0n,
    expiresAt: undefined,
    dirty: false,
    waitedAt: Number.NEGATIVE_INFINITY,
    scarceUntil: Number.NEGATIVE_INFINITY,
    settling: 0,
    settled: [],
  };
}

/**
 * What an extension asks for beyond the head request's need: for credits about half a
 * second of the permit's recent demand, for slots a quarter of those in use. Not the whole
 * queue: a burst must not take everything from the other processes.
 */
function headroom(pool: LeasePool): bigint {
  return pool.kind === "permit" ? pool.recent * 2n : 1n + pool.used / 4n;
}

/** Resolves when a close under way on the pool ends (at once when none is; or after `ms`). */
function whenSettled(pool: LeasePool, ms: number): Promise<void> {
  if (pool.settling === 0) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      const i = pool.settled.indexOf(done);
      if (i >= 0) pool.settled.splice(i, 1);
      resolve();
    }
    pool.settled.push(done);
  });
}

/** The waiter, its wait timer cleared. */
function settle(waiter: Waiter): Waiter {
  if (waiter.timer !== undefined) clearTimeout(waiter.timer);
  return waiter;
}

export function createPools(options: PoolOptions): Pools {
  const { mono, idleMs, tickMs, maxQueued } = options;
  const scarceMs = options.scarceMs ?? 5_000;
  const markScarce = (pool: LeasePool) => {
    pool.scarceUntil = mono() + scarceMs;
  };

  const admit = (pool: LeasePool, amount: bigint): void => {
    pool.used += amount;
    pool.admittedInWindow += amount;
    pool.lastActive = mono();
  };

  /**
   * What an extension asks for: the need plus headroom; exactly the need while the lease is
   * scarce (the low-water mark: the database could not grant the headroom, or another holder
   * recalled it), so each request is in effect admitted at the database.
   */
  const wantFor = (pool: LeasePool, need: bigint): bigint =>
    mono() < pool.scarceUntil ? need : need + headroom(pool);

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
        const want = wantFor(pool, need);
        let granted: bigint;
        try {
          granted = await head.take(need, want);
        } catch (error) {
          pool.dirty = true;
          for (const waiter of pool.queue.splice(0)) settle(waiter).reject(error);
          return;
        }
        if (granted > 0n) {
          pool.granted += granted;
          if (granted < want) markScarce(pool);
          continue;
        }
        markScarce(pool);
        if (pool.settling > 0 && (head.recalls ?? 0) < maxRecalls) {
          // Requests of ours that were answered still hold their maxima until their charges
          // commit: what they do not charge comes back then. Ask again after that.
          head.recalls = (head.recalls ?? 0) + 1;
          await whenSettled(pool, settleWaitMs);
        } else if (
          granted < 0n &&
          options.recall !== undefined &&
          (head.recalls ?? 0) < maxRecalls
        ) {
          // Other holders' leases hold enough: ask them for their idle part (they answer once
          // they have given it back) and ask the database again.
          head.recalls = (head.recalls ?? 0) + 1;
          await options.recall(pool);
        } else if (
          granted < 0n &&
          options.recall === undefined &&
          mono() - pool.waitedAt > 2 * (idleMs + tickMs)
        ) {
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
    else if (mono() < pool.scarceUntil && pool.granted > pool.used) options.onFree?.(pool);
  };

  return {
    newPool: (kind, id, holder) => newPool(kind, id, holder, mono()),
    acquire,
    release,
    markScarce,
    closeStarted(pool) {
      pool.settling += 1;
    },
    closeEnded(pool) {
      pool.settling -= 1;
      for (const done of pool.settled.splice(0)) done();
    },
    whenSettled,
    pump,
    rejectAll(pool, error) {
      for (const waiter of pool.queue.splice(0)) settle(waiter).reject(error);
    },
  };
}
