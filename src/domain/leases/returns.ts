import type { Epochs } from "./epochs.js";
import type { LeasePool, Pools } from "./pool.js";
import type { LeaseSignals, LeaseStore } from "./store.js";

/**
 * Giving leases back (leases.ts): what a pool does not use, when it is idle or its lease ended,
 * when a request reserved one by one was refused for want of it, and when another process
 * recalls it (`LeaseSignals`).
 */
export class LeaseReturns {
  constructor(
    private readonly options: {
      readonly store: LeaseStore;
      readonly epochs: Epochs;
      readonly pools: Pick<Pools, "pump" | "markScarce" | "whenSettled">;
      readonly signals: LeaseSignals | undefined;
    },
  ) {}

  /** Gives back what a pool does not use: all of it (the database's figure) when idle. */
  giveBack(pool: LeasePool, all: boolean): Promise<void> {
    const run = this.returnUnused(pool, all);
    pool.returning = run;
    void run.finally(() => {
      if (pool.returning === run) pool.returning = undefined;
    });
    return run;
  }

  private async returnUnused(pool: LeasePool, all: boolean): Promise<void> {
    const { store } = this.options;
    // What goes back leaves `granted` before the call: a request arriving meanwhile must not
    // be admitted against it (it waits for an extension instead).
    const free = all ? pool.granted : pool.granted - pool.used;
    if (free <= 0n && !all) return;
    pool.busy = true;
    pool.granted -= free;
    try {
      if (all) {
        if (pool.kind === "permit") await store.returnPermit(pool.holder, pool.id, "all");
        else await store.returnOffer(pool.holder, pool.id, "all");
        pool.dirty = false;
      } else if (pool.kind === "permit") {
        await store.returnPermit(pool.holder, pool.id, free);
      } else {
        await store.returnOffer(pool.holder, pool.id, Number(free));
      }
    } catch {
      // Unknown outcome: the database may still hold it; the next idle give-back returns all.
      pool.dirty = true;
    } finally {
      pool.busy = false;
      if (pool.queue.length > 0) void this.options.pools.pump(pool);
    }
  }

  /**
   * Gives back what this process's leases on `key` hold idle (no request of ours uses it), as
   * a recall would; answers whether there was any.
   */
  async giveBackIdle(key: string): Promise<boolean> {
    const work: Promise<void>[] = [];
    for (const epoch of this.options.epochs.all) {
      const pool = epoch.pools.get(key);
      if (pool === undefined || pool.busy || pool.queue.length > 0) continue;
      while (pool.returning !== undefined) await pool.returning;
      if (pool.granted > pool.used) work.push(this.giveBack(pool, pool.used === 0n));
    }
    await Promise.allSettled(work);
    return work.length > 0;
  }

  /**
   * Another process needs what this one's lease on `key` holds idle: give back every part no
   * request of ours uses, then answer (the recaller asks the database again). The lease turns
   * scarce here too, so both sides take only what each request needs for a while.
   */
  async answerRecall(key: string): Promise<void> {
    const { epochs, pools, signals } = this.options;
    const work: Promise<void>[] = [];
    let held = false;
    for (const epoch of epochs.all) {
      const pool = epoch.pools.get(key);
      if (pool === undefined) continue;
      held = true;
      pools.markScarce(pool);
      // Our answered requests' charges about to commit free the rest of their maxima.
      await pools.whenSettled(pool, 1_000);
      // A give-back already under way (the idle one): answer once it has committed, or the
      // recaller asks the database before what comes back is there, and its refusal stands
      // (seen behind PgBouncer, whose extra hop widens that window).
      while (pool.returning !== undefined) await pool.returning;
      // A lease extending (or waited on) right now needs what it has: its answer is "none".
      if (pool.busy || pool.queue.length > 0) continue;
      if (pool.granted > pool.used || pool.dirty) work.push(this.giveBack(pool, pool.used === 0n));
    }
    if (!held) return;
    await Promise.allSettled(work);
    await signals?.answer(key);
  }
}
