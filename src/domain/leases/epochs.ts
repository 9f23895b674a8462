import type { LeasePool } from "./pool.js";
import type { LeaseStore } from "./store.js";

/**
 * The epochs leases are held under (leases.ts): an epoch of this process is heartbeated while it
 * admits; when the heartbeat fails for so long that other processes could take it for dead
 * (and release its leases), admission against it stops before that can happen and a new epoch
 * begins. An epoch's instance row is written (its first heartbeat) before any lease is taken
 * under it, so no other process finds its leases without a heartbeat; a retired epoch is
 * heartbeated on until it holds nothing (no lease, no open request), so the requests still
 * running on it are not taken for orphans once the database is healthy again.
 */

export interface Epoch {
  readonly holder: string;
  /** Monotonic ms of the last heartbeat that succeeded (sent at); undefined before the first. */
  beatSentAt: number | undefined;
  /** This epoch's heartbeat in flight (one at a time, per epoch). */
  beating: Promise<void> | undefined;
  retired: boolean;
  /**
   * A heartbeat came later than the orphan window after the one before it: other processes
   * may have taken the epoch for dead meanwhile (voided its requests, released its leases).
   */
  forfeited: boolean;
  /** Its requests not closed yet (their closes may wait in the outbox). */
  open: number;
  readonly pools: Map<string, LeasePool>;
}

/** This process's epochs: the current one, and the retired ones still holding anything. */
export class Epochs {
  /** Every epoch not forgotten yet, oldest first. */
  readonly all: Epoch[] = [];
  /** The epoch admissions use (see {@link admitting}). */
  current: Epoch;
  private count = 0;

  constructor(
    private readonly options: {
      readonly instanceId: string;
      readonly store: Pick<LeaseStore, "heartbeat">;
      /** Milliseconds, monotonic. */
      readonly mono: () => number;
      /** Other processes take a holder silent this long for dead (the orphan rule). */
      readonly staleMs: number;
      /** Admission stops this long before the others could release the epoch's leases. */
      readonly marginMs: number;
    },
  ) {
    this.current = this.newEpoch();
  }

  private newEpoch(): Epoch {
    const epoch: Epoch = {
      holder: `${this.options.instanceId}/lease-${++this.count}`,
      beatSentAt: undefined,
      beating: undefined,
      retired: false,
      forfeited: false,
      open: 0,
      pools: new Map(),
    };
    this.all.push(epoch);
    return epoch;
  }

  /**
   * Heartbeats `epoch` (its own call: another epoch's heartbeat in flight is no heartbeat of
   * this one). A heartbeat that succeeds too late retires the epoch, as admission would have
   * (others may be about to release its leases), and one later than the orphan window forfeits
   * it (they may have already).
   */
  beat(epoch: Epoch): Promise<void> {
    const { store, mono, staleMs, marginMs } = this.options;
    epoch.beating ??= (async () => {
      const sentAt = mono();
      try {
        await store.heartbeat(epoch.holder);
        const previous = epoch.beatSentAt;
        if (previous !== undefined) {
          const answeredAt = mono();
          if (answeredAt > previous + staleMs - marginMs) epoch.retired = true;
          if (answeredAt > previous + staleMs) epoch.forfeited = true;
        }
        epoch.beatSentAt = sentAt;
      } finally {
        epoch.beating = undefined;
      }
    })();
    return epoch.beating;
  }

  /**
   * The epoch admissions use now: a new one when the current could be taken for dead. Its
   * instance row is written before it is returned, so before any lease is taken under it.
   */
  async admitting(): Promise<Epoch> {
    const { mono, staleMs, marginMs } = this.options;
    const lapsed =
      this.current.beatSentAt !== undefined &&
      mono() > this.current.beatSentAt + staleMs - marginMs;
    if (lapsed || this.current.retired) {
      this.current.retired = true;
      this.current = this.newEpoch();
    }
    const epoch = this.current;
    if (epoch.beatSentAt === undefined) await this.beat(epoch);
    return epoch;
  }

  /** Whether a (retired) epoch still holds anything the orphan rule would take from it. */
  holds(epoch: Epoch): boolean {
    if (epoch.open > 0) return true;
    for (const pool of epoch.pools.values()) {
      if (pool.granted > 0n || pool.used > 0n || pool.dirty || pool.busy || pool.queue.length > 0) {
        return true;
      }
    }
    return false;
  }

  /** Forgets the retired epochs that hold nothing. */
  prune(): void {
    const { all } = this;
    for (let i = all.length - 1; i >= 0; i--) {
      if (all[i]!.retired && !this.holds(all[i]!)) all.splice(i, 1);
    }
  }
}
