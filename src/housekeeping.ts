import type pg from "pg";
import type { Logger } from "pino";
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
}

export interface Housekeeping {
  /** One round: this process's heartbeat, then the orphan rule; both on the database's clock. */
  runOnce(): Promise<{ orphans: number }>;
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

  const runOnce = async (): Promise<{ orphans: number }> => {
    await ledger.heartbeat(pool, instanceId);
    const orphans = await ledger.reconcileOrphans(pool, { staleAfterSeconds });
    if (orphans > 0) logger.warn({ orphans }, "reconciled requests of a stopped gateway process");
    return { orphans };
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
