import type pg from "pg";
import type { Logger } from "pino";
import { releaseOrphanedClaims } from "./adapters/pg/idempotency.js";
import { releaseOrphanedLeases } from "./adapters/pg/leases.js";
import * as ledger from "./adapters/pg/ledger.js";

export interface HousekeepingOptions {
  readonly pool: pg.Pool;
  /** This process (its requests, its heartbeat). */
  readonly instanceId: string;
  readonly logger: Logger;
  /** Between two rounds (default 10 s). */
  readonly intervalMs?: number;
  /** A process silent this long is dead and its open requests are orphans (default 60 s). */
  readonly staleAfterSeconds?: number;
  /** Writes the closes the ledger refused earlier (the inference outbox). */
  readonly retryCloses?: () => Promise<{ written: number; pending: number }>;
}

export interface Housekeeping {
  /**
   * One round: this process's heartbeat, the closes its outbox holds, then the orphan rule
   * (heartbeat first, so that after an outage this process's own requests are not taken for
   * orphans before their closes land), the reservation leases of dead processes, and the
   * idempotency claims dead processes held. Times
   * are the database's.
   */
  runOnce(): Promise<{
    orphans: number;
    leasesReleased: number;
    claimsReleased: number;
    closesWritten: number;
    closesPending: number;
  }>;
  start(): void;
  /** Stops the timer and waits for a round in progress. */
  stop(): Promise<void>;
}

/**
 * Liveness of this process and the rule for the requests of dead ones (docs/decisions.md,
 * "Orphans"). Every comparison of times happens in the database, on its clock, so hosts whose
 * clocks disagree never void each other's requests.
 */
export function createHousekeeping(options: HousekeepingOptions): Housekeeping {
  const { pool, instanceId, logger } = options;
  const staleAfterSeconds = options.staleAfterSeconds ?? 60;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<unknown> | undefined;

  const runOnce = async () => {
    // A failed heartbeat (the database is away) still lets the closes waiting in the outbox
    // be tried and reported, so an operator sees them pending during the outage; the round
    // then fails with the heartbeat's error.
    const beat = await ledger.heartbeat(pool, instanceId).then(
      () => undefined,
      (error: unknown) => ({ error }),
    );
    const closes = (await options.retryCloses?.()) ?? { written: 0, pending: 0 };
    if (closes.written > 0 || closes.pending > 0) {
      const fields = { written: closes.written, pending: closes.pending };
      if (closes.pending > 0) logger.warn(fields, "request closes still refused by the database");
      else logger.info(fields, "request closes written after the database refused them");
    }
    if (beat !== undefined) throw beat.error;
    const orphans = await ledger.reconcileOrphans(pool, { staleAfterSeconds });
    if (orphans > 0) logger.warn({ orphans }, "reconciled requests of a stopped gateway process");
    // After the requests: a dead holder's leases go back once nothing of it is open any more.
    const leasesReleased = await releaseOrphanedLeases(pool, { staleAfterSeconds });
    if (leasesReleased > 0) {
      logger.warn({ leasesReleased }, "released reservation leases of a stopped gateway process");
    }
    const claimsReleased = await releaseOrphanedClaims(pool, { staleAfterSeconds });
    if (claimsReleased > 0) {
      logger.warn(
        { claimsReleased },
        "released idempotency keys held by a stopped gateway process",
      );
    }
    return {
      orphans,
      leasesReleased,
      claimsReleased,
      closesWritten: closes.written,
      closesPending: closes.pending,
    };
  };

  return {
    runOnce,
    start() {
      if (timer !== undefined) return;
      timer = setInterval(() => {
        if (running !== undefined) return;
        running = runOnce()
          .catch((error: unknown) => logger.warn({ err: error }, "housekeeping failed"))
          .finally(() => {
            running = undefined;
          });
      }, options.intervalMs ?? 10_000);
      timer.unref();
    },
    async stop() {
      if (timer !== undefined) clearInterval(timer);
      timer = undefined;
      await running;
    },
  };
}
