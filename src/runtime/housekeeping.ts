import type pg from "pg";
import type { Logger } from "pino";
import { releaseOrphanedClaims } from "../adapters/pg/idempotency.js";
import { releaseOrphanedLeases } from "../adapters/pg/leases.js";
import * as ledger from "../adapters/pg/ledger/index.js";

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
  /** Milliseconds, monotonic (how long this process's heartbeats have held); default performance.now. */
  readonly monotonicMs?: () => number;
}

export interface Housekeeping {
  /**
   * One round: this process's heartbeat, the closes its outbox holds, then the orphan rule
   * (heartbeat first, so that after an outage this process's own requests are not taken for
   * orphans before their closes land), the reservation leases of dead processes, and the
   * idempotency claims dead processes held. The orphan rule runs only once this process's own
   * heartbeats have held for a full orphan window (`judged` says whether it ran). Times of
   * other processes are the database's.
   */
  runOnce(): Promise<{
    /** Whether the orphan rule ran this round (see {@link createHousekeeping}). */
    judged: boolean;
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
 * Liveness of this process and the rule for the requests of dead ones (docs/decisions/chat-quotes-and-money.md,
 * "Orphans"). Every comparison of other processes' times happens in the database, on its clock,
 * so hosts whose clocks disagree never void each other's requests.
 *
 * A process judges others only while its own heartbeats have succeeded without a break for a
 * full orphan window. After an outage of the database (or of this process's path to it), every
 * process's heartbeat looks stale; whichever came back first would otherwise void the others'
 * answered requests, and the closes waiting in their outboxes, before they had a round to
 * heartbeat and write them. Once this process has heartbeated for a window, every other live
 * process on the same database had that window too. A break is a failed heartbeat, or two
 * successful ones further apart than half the window (a hung connection, a paused process): this
 * process could not see the database meanwhile, so the others may not have either. A process
 * that has just started waits a window too: it cannot know what came before it.
 */
export function createHousekeeping(options: HousekeepingOptions): Housekeeping {
  const { pool, instanceId, logger } = options;
  const staleAfterSeconds = options.staleAfterSeconds ?? 60;
  const mono = options.monotonicMs ?? (() => performance.now());
  const windowMs = staleAfterSeconds * 1000;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<unknown> | undefined;
  /** Monotonic ms: the first heartbeat of the unbroken run, and the latest one (their answers). */
  let healthySince: number | undefined;
  let lastBeat: number | undefined;
  /** Whether the rule ran in the previous round (to log when it pauses and resumes). */
  let judging = false;

  /**
   * Records a heartbeat's outcome (`at`: when its answer came); whether the heartbeats have
   * held for a full window.
   */
  const mayJudge = (ok: boolean, at: number): boolean => {
    if (!ok) {
      healthySince = undefined;
    } else {
      if (healthySince === undefined || lastBeat === undefined || at - lastBeat > windowMs / 2) {
        healthySince = at;
      }
      lastBeat = at;
    }
    const may = healthySince !== undefined && at - healthySince >= windowMs;
    if (judging && !may) {
      logger.warn(
        { waitSeconds: staleAfterSeconds },
        "orphan rule paused: this process's heartbeats broke; it judges others after a full orphan window of heartbeats",
      );
    } else if (!judging && may) {
      logger.info("orphan rule running: this process's heartbeats held for a full orphan window");
    }
    judging = may;
    return may;
  };

  const runOnce = async () => {
    // A failed heartbeat (the database is away) still lets the closes waiting in the outbox
    // be tried and reported, so an operator sees them pending during the outage; the round
    // then fails with the heartbeat's error.
    const beat = await ledger.heartbeat(pool, instanceId).then(
      () => undefined,
      (error: unknown) => ({ error }),
    );
    const beatAt = mono();
    const closes = (await options.retryCloses?.()) ?? { written: 0, pending: 0 };
    if (closes.written > 0 || closes.pending > 0) {
      const fields = { written: closes.written, pending: closes.pending };
      if (closes.pending > 0) logger.warn(fields, "request closes still refused by the database");
      else logger.info(fields, "request closes written after the database refused them");
    }
    const judged = mayJudge(beat === undefined, beatAt);
    if (beat !== undefined) throw beat.error;
    const idle = { closesWritten: closes.written, closesPending: closes.pending };
    if (!judged) return { judged, orphans: 0, leasesReleased: 0, claimsReleased: 0, ...idle };
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
    return { judged, orphans, leasesReleased, claimsReleased, ...idle };
  };

  return {
    runOnce,
    start() {
      if (timer !== undefined) return;
      const intervalMs = options.intervalMs ?? 10_000;
      if (intervalMs > windowMs / 2) {
        // Two heartbeats this far apart break the run the rule waits for: it would never run.
        logger.warn(
          { intervalMs, orphanAfterSeconds: staleAfterSeconds },
          "housekeeping interval above half the orphan window: this process never runs the orphan rule",
        );
      }
      timer = setInterval(() => {
        if (running !== undefined) return;
        running = runOnce()
          .catch((error: unknown) => logger.warn({ err: error }, "housekeeping failed"))
          .finally(() => {
            running = undefined;
          });
      }, intervalMs);
      timer.unref();
    },
    async stop() {
      if (timer !== undefined) clearInterval(timer);
      timer = undefined;
      await running;
    },
  };
}
