import type { Hex } from "viem";

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
}

/** A request refused before the database saw anything of it (backpressure). */
export class LeaseWaitError extends Error {
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
  /** When a refusal last waited for other holders' idle leases (monotonic ms). */
  waitedAt: number;
}

export interface PoolOptions {
  /** Milliseconds, monotonic. */
  readonly mono: () => number;
  /** A lease unused this long is given back (leases.ts ticks every `tickMs`). */
  readonly idleMs: number;
  readonly tickMs: number;
  readonly maxQueued: number;
  readonly maxWaitMs: number | undefined;
}

export interface Pools {
  newPool(kind: LeasePool["kind"], id: Hex, holder: string): LeasePool;
  /** Admits `amount` against the lease, extending it through `take` when it lacks; false: refused. */
  acquire(pool: LeasePool, amount: bigint, take: Waiter["take"]): Promise<boolean>;
  release(pool: LeasePool, amount: bigint): void;
  /** Serves the queue (after a give-back, say). */
  pump(pool: LeasePool): Promise<void>;
  /** Refuses every waiting request with `error`. */
  rejectAll(pool: LeasePool, error: unknown): void;
}

export function createPools(options: PoolOptions): Pools {
  const { mono, idleMs, tickMs, maxQueued } = options;

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

  return {
    newPool: (kind, id, holder) => ({
      kind,
      id,
      holder,
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
    }),
    acquire,
    release,
    pump,
    rejectAll(pool, error) {
      for (const waiter of pool.queue.splice(0)) settle(waiter).reject(error);
    },
  };
}
