import type { LeaseState } from "./state.js";

/**
 * The leases' clock (leases.ts): each tick heartbeats the epochs that need it (epochs.ts),
 * gives back what is idle or ended (returns.ts) and forgets what holds nothing; the timer
 * runs one tick at a time.
 */

/** One round of heartbeat, idle return and epoch checks. */
export async function tick(s: LeaseState): Promise<void> {
  const now = s.mono();
  // The current epoch, and every retired one while it holds anything: a stream still running
  // on a retired epoch (or a close waiting in the outbox) keeps it alive for the orphan rule.
  const beats: Promise<void>[] = [];
  for (const epoch of s.epochs.all) {
    const due = epoch.beatSentAt !== undefined && now - epoch.beatSentAt >= s.heartbeatMs;
    if (due && (epoch === s.epochs.current || s.epochs.holds(epoch))) {
      beats.push(s.epochs.beat(epoch).catch(() => undefined));
    }
  }
  await Promise.all(beats);
  // A give-back under way (what a close freed on a scarce lease, sent at once) ends first: its
  // pool is busy meanwhile, and a tick that skipped it would keep the rest idle one tick more.
  const returning: Promise<void>[] = [];
  for (const epoch of s.epochs.all)
    for (const pool of epoch.pools.values())
      if (pool.returning !== undefined) returning.push(pool.returning);
  await Promise.allSettled(returning);
  const nowSeconds = s.permitClock();
  const work: Promise<void>[] = [];
  for (const epoch of s.epochs.all) {
    for (const [key, pool] of epoch.pools) {
      pool.recent = pool.admittedInWindow;
      pool.admittedInWindow = 0n;
      if (pool.busy || pool.queue.length > 0) continue;
      const ended =
        epoch.retired ||
        (pool.kind === "permit" &&
          (s.revoked.has(pool.id) ||
            (pool.expiresAt !== undefined && pool.expiresAt <= nowSeconds)));
      const idle = now - pool.lastActive >= s.idleMs;
      if (pool.used === 0n && (ended || idle)) {
        if (pool.granted > 0n || pool.dirty) work.push(s.returns.giveBack(pool, true));
        // Forgotten only when it holds nothing and nothing uses it (one pool per lease row).
        else if (ended || now - pool.lastActive >= 60_000) epoch.pools.delete(key);
      } else if (ended && pool.granted > pool.used) {
        work.push(s.returns.giveBack(pool, false));
      }
    }
  }
  await Promise.allSettled(work);
  s.epochs.prune();
}

/** Runs {@link tick} every `tickMs`, one at a time (a tick asked for meanwhile joins it). */
export class LeaseTicker {
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<void> | undefined;

  constructor(
    private readonly s: LeaseState,
    private readonly tickMs: number,
  ) {}

  /** A tick now, or the one under way. */
  tick(): Promise<void> {
    return (this.ticking ??= tick(this.s).finally(() => (this.ticking = undefined)));
  }

  start(): void {
    if (this.timer !== undefined) return;
    this.timer = setInterval(() => {
      this.ticking ??= tick(this.s)
        .catch(() => undefined)
        .finally(() => (this.ticking = undefined));
    }, this.tickMs);
    this.timer.unref();
  }

  /** Stops the timer and retires every epoch: the last tick gives every lease back. */
  async stop(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    await this.ticking;
    for (const epoch of this.s.epochs.all) epoch.retired = true;
    await tick(this.s);
  }
}
